import { Socket } from 'node:net';
import { connect, type ChannelModel } from 'amqplib';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { RabbitMqTransport } from '../src/index.js';
import { BROKER_URL, deleteTopology, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope } from './support/envelopes.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** amqplib's connection object behind the public `ChannelModel` (not in its types). */
function socketOf(model: ChannelModel): Socket {
  return (model.connection as unknown as { stream: Socket }).stream;
}

describe('RabbitMqTransport socket', () => {
  it("sends one publish call's messages in a few socket writes, not one write per message", async () => {
    const id = testId();
    const prefix = `courier-${id}`;
    let model: ChannelModel | undefined;
    const transport = new RabbitMqTransport({
      connection: async () => (model = await connect(BROKER_URL)),
      prefix,
      delayTiersMs: TEST_TIERS_MS,
    });
    cleanups.push(async () => {
      await transport.close();
      await deleteTopology(prefix, ['c']);
    });
    await transport.provision({ consumer: 'c', topics: ['orders'], ordered: false });
    await transport.publish([envelope('orders')]);
    // Count what reaches the socket's own write paths (one per write(2)/writev(2) issued).
    const socket = socketOf(model!);
    let writes = 0;
    const proto = Object.getPrototypeOf(socket) as { _write: Socket['_write']; _writev?: NonNullable<Socket['_writev']> };
    const write = proto._write;
    const writev = proto._writev!;
    Object.assign(socket, {
      _write(this: Socket, ...args: Parameters<Socket['_write']>) {
        writes++;
        return write.apply(this, args);
      },
      _writev(this: Socket, ...args: Parameters<NonNullable<Socket['_writev']>>) {
        writes++;
        return writev.apply(this, args);
      },
    });
    const batch = Array.from({ length: 200 }, (_, i) => envelope('orders', { key: `k-${i}` }));
    const results = await transport.publish(batch);
    expect(results.every((r) => r.ok)).toBe(true);
    // 200 messages of ~400 bytes are ~80 KiB: a handful of writes of the socket's 16 KiB
    // high-water mark each, where amqplib alone issues one write per message.
    expect(writes).toBeGreaterThan(0);
    expect(writes).toBeLessThan(40);
  });

  it('opens a URL connection with Nagle off, so a small publish or ack is not held for the broker\'s delayed ACK', async () => {
    // With Nagle on (amqplib's default), a write made while earlier bytes are unacknowledged
    // waits for the broker's ACK, which Linux may delay by up to 40 ms: the relay's steady
    // commit → confirm p50 was 37 ms at 150 msg/s, 2–5 ms with Nagle off.
    const calls: boolean[] = [];
    const original = Socket.prototype.setNoDelay;
    const spy = vi.spyOn(Socket.prototype, 'setNoDelay').mockImplementation(function (this: Socket, noDelay?: boolean) {
      calls.push(noDelay !== false);
      return original.call(this, noDelay);
    });
    const prefix = `courier-${testId()}`;
    const transport = new RabbitMqTransport({ connection: BROKER_URL, prefix, delayTiersMs: TEST_TIERS_MS });
    cleanups.push(async () => {
      spy.mockRestore();
      await transport.close();
      await deleteTopology(prefix, ['c']);
    });
    await transport.provision({ consumer: 'c', topics: ['orders'], ordered: false });
    expect(calls.length).toBeGreaterThan(0);
    expect(calls.at(-1)).toBe(true);
  });
});
