// `courier stats` shows each configured consumer's lag at the broker (Transport.consumerLag):
// on RabbitMQ the queue's ready messages, read passively. A consumer away while messages
// arrive shows them waiting; one that never subscribed shows "no queue", and asking
// declared nothing. A transport without consumerLag is shown as "not available".
import { randomBytes } from 'node:crypto';
import { eventually, makeEnvelope } from '@courier/conformance';
import { afterAll, describe, expect, it } from 'vitest';
import { collectStats } from '../src/cli.js';
import type { CourierCliSetup } from '../src/config.js';
import { runCli } from './support/run-cli.js';
import { deleteBrokerObjects, openStores, openTransport } from './support/setup.js';

describe('courier stats: consumer lag at the broker', () => {
  const prefix = `clilag${randomBytes(4).toString('hex')}_`;
  const away = `${prefix}billing`;
  const never = `${prefix}never`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: `${away},${never}` };
  const cleanup: (() => Promise<void>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close();
    await deleteBrokerObjects(prefix, [away, never]);
  });

  it('RabbitMQ: messages waiting for a consumer that is away, "no queue" for one that never subscribed', async () => {
    const stores = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const topic = `${prefix}orders`;
    const subscription = await transport.subscribe({ consumer: away, topics: [topic], ordered: false, concurrency: 1 }, async (delivery) => delivery.ack());
    await subscription.close();
    const results = await transport.publish(Array.from({ length: 4 }, () => makeEnvelope({ topic, key: null })));
    expect(results.every((result) => result.ok)).toBe(true);
    await eventually(async () => expect(await transport.consumerLag(away)).toBe(4), { timeoutMs: 20_000 });

    const json = await runCli(['stats', '--json'], env);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout).consumerLag).toEqual({ available: true, consumers: [{ consumer: away, waiting: 4 }, { consumer: never, waiting: null }] });
    const text = await runCli(['stats'], env);
    expect(text.stdout).toMatch(/consumer lag at the broker\n\s*CONSUMER\s+WAITING\n/);
    expect(text.stdout).toMatch(new RegExp(`${away}\\s+4\\n`));
    expect(text.stdout).toMatch(new RegExp(`${never}\\s+no queue \\(never subscribed\\)`));
    // Reading declared nothing and took nothing.
    expect(await transport.consumerLag(never)).toBeNull();
    expect(await transport.consumerLag(away)).toBe(4);
  }, 120_000);

  it('says "not available" for a transport without consumerLag', async () => {
    const setup = {
      outbox: { stats: async () => ({ pending: 0, oldestPendingAgeMs: 0, inFlight: 0, dead: 0, haltedKeys: 0 }) },
      transport: {},
      consumers: ['payments'],
    } as unknown as CourierCliSetup;
    expect((await collectStats(setup)).consumerLag).toEqual({ available: false, consumers: [] });
  });
});
