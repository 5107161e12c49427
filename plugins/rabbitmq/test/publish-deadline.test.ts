import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport } from '../src/index.js';
import { deleteTopology, openConnection, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope } from './support/envelopes.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('RabbitMqTransport publish signal', () => {
  // The relay aborts the signal at its sending deadline; a message that was waiting for
  // room in the confirm window then must not go out, or its answer could outlive the lease.
  it('sends nothing after the signal aborts, even a message that was waiting for the confirm window', async () => {
    const prefix = `courier-${testId()}`;
    const controller = new AbortController();
    let sends = 0;
    const transport = new RabbitMqTransport({
      prefix,
      delayTiersMs: TEST_TIERS_MS,
      confirmWindow: 1,
      connection: async () => {
        const connection = await openConnection(prefix);
        const createConfirmChannel = connection.createConfirmChannel.bind(connection);
        connection.createConfirmChannel = async () => {
          const channel = await createConfirmChannel();
          const publish = channel.publish.bind(channel);
          channel.publish = (...args: Parameters<typeof publish>) => {
            sends += 1;
            // Aborts once the first message is out and the next one waits for the window.
            if (sends === 1) queueMicrotask(() => controller.abort());
            return publish(...args);
          };
          return channel;
        };
        return connection;
      },
    });
    cleanups.push(async () => {
      await transport.close();
      await deleteTopology(prefix, ['c']);
    });
    await transport.provision({ consumer: 'c', topics: ['orders'], ordered: false });
    const results = await transport.publish([envelope('orders'), envelope('orders'), envelope('orders')], { signal: controller.signal });
    expect(results.map((result) => (result.ok ? 'ok' : result.error.code))).toEqual(['ok', 'ABORTED', 'ABORTED']);
    expect(sends).toBe(1);
  });
});
