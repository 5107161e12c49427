import {
  createBus,
  defineMessage,
  InMemoryDatabase,
  InMemoryOutboxStore,
  type Bus,
  type InMemoryTransaction,
} from '@courier/core';
import type { ChannelModel, ConfirmChannel } from 'amqplib';
import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport } from '../src/index.js';
import { deleteTopology, eventually, openConnection, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope as anEnvelope } from './support/envelopes.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/**
 * Makes every confirm channel of `connection` add a `CC` header with a plain string to
 * messages carrying the header `wire-poison`: RabbitMQ wants an array there and closes the
 * channel (406 PRECONDITION_FAILED). It stands for any content the broker refuses that no
 * check before sending can foresee.
 */
function poisonOnTheWire(connection: ChannelModel): ChannelModel {
  const createConfirmChannel = connection.createConfirmChannel.bind(connection);
  connection.createConfirmChannel = async (...args) => {
    const channel: ConfirmChannel = await createConfirmChannel(...args);
    const publish = channel.publish.bind(channel);
    channel.publish = (exchange, routingKey, content, options, callback) => {
      const headers = options?.headers as Record<string, unknown> | undefined;
      // A channel closed for a reason other than content (404: no such exchange) stands for
      // trouble that is not the message's fault.
      if (headers?.['wire-missing-exchange'] !== undefined) return publish(`${exchange}.missing`, routingKey, content, options, callback);
      const poisoned = headers?.['wire-poison'] !== undefined ? { ...options, headers: { ...headers, CC: 'x' } } : options;
      return publish(exchange, routingKey, content, poisoned, callback);
    };
    return channel;
  };
  return connection;
}

/** A relay on an in-memory outbox publishing to RabbitMQ, with a consumer queue provisioned for the topic. */
async function setup() {
  const id = testId();
  const prefix = `courier-${id}`;
  const transport = new RabbitMqTransport({
    connection: async () => poisonOnTheWire(await openConnection(`${prefix}-poison`)),
    prefix,
    delayTiersMs: TEST_TIERS_MS,
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
  });
  const database = new InMemoryDatabase();
  const outbox = new InMemoryOutboxStore({ database });
  const Poisoned = defineMessage(`${id}.Poisoned`, { version: 1 });
  await transport.provision({ consumer: 'c', topics: [Poisoned.topic], ordered: false });
  const bus: Bus<InMemoryTransaction> = createBus({
    outbox,
    transport,
    relay: {
      batchSize: 10,
      pollIntervalMs: 50,
      retry: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 200, jitter: 0 },
      pause: { initialDelayMs: 50, maxDelayMs: 200 },
    },
  });
  cleanups.push(async () => {
    await bus.stop({ timeoutMs: 5_000 });
    await transport.close();
    await outbox.close();
    await deleteTopology(prefix, ['c']);
  });
  const published = async (): Promise<string[]> => {
    const connection = await openConnection(`${prefix}-reader`);
    try {
      const channel = await connection.createChannel();
      const ids: string[] = [];
      for (;;) {
        const message = await channel.get(transport.names('c').queue, { noAck: true });
        if (message === false) break;
        ids.push(String(message.properties.messageId));
      }
      return ids;
    } finally {
      await connection.close();
    }
  };
  return { bus, database, outbox, transport, Poisoned, published };
}

describe('a poison message on the RabbitMQ publish channel', () => {
  it('publish: the message that closes the channel with 406 fails alone as PUBLISH_REJECTED; one closed for another reason is a connectivity failure', async () => {
    const { transport, Poisoned } = await setup();
    const envelope = (key: string, headers: Record<string, string> = {}) => anEnvelope(Poisoned.topic, { type: Poisoned.type, key, headers });
    const batch = [envelope('a'), envelope('b', { 'wire-poison': 'yes' }), envelope('c'), envelope('d', { 'wire-missing-exchange': 'yes' }), envelope('e')];
    const results = await transport.publish(batch);
    expect(results.map((result) => [result.messageId, result.ok])).toEqual(batch.map((e, i) => [e.messageId, i !== 1 && i !== 3]));
    const [poisoned, missing] = [results[1]!, results[3]!];
    expect(!poisoned.ok && poisoned.error).toMatchObject({ code: 'PUBLISH_REJECTED', retriable: true });
    expect(!poisoned.ok && poisoned.error.message).toMatch(/406.*unacceptable_type_in_header/);
    expect(!missing.ok && missing.error).toMatchObject({ code: 'TRANSPORT', retriable: true });
    expect(!missing.ok && missing.error.message).toContain('404');
    expect(transport.stats().refused).toBe(1);
  });

  it('fails alone and ends dead after maxAttempts; its batch neighbours are published; the relay is not left paused', async () => {
    const { bus, database, outbox, transport, Poisoned, published } = await setup();
    const ids = await database.transaction(async (tx) => {
      const publisher = bus.outbox(tx);
      return [
        publisher.publish(Poisoned, { n: 1 }, { key: 'a' }),
        publisher.publish(Poisoned, { n: 2 }, { key: 'b', headers: { 'wire-poison': 'yes' } }),
        publisher.publish(Poisoned, { n: 3 }, { key: 'c' }),
      ];
    });
    const [a, b, c] = ids as [string, string, string];
    await bus.start({ relay: true, consumers: false });
    const dead = await eventually(async () => {
      const list = await outbox.listDead();
      expect(list.map((row) => row.envelope.messageId)).toEqual([b]);
      return list[0]!;
    }, 20_000);
    expect(dead.attempts).toBe(3);
    expect(dead.lastError).toMatch(/PRECONDITION_FAILED|unacceptable_type_in_header/);
    const stats = await outbox.stats();
    expect(stats.pending).toBe(0);
    const received = await eventually(async () => {
      const got = await published();
      expect(got.sort()).toEqual(expect.arrayContaining([a, c].sort()));
      return got;
    });
    expect(received).not.toContain(b);
    expect(transport.stats().confirmed).toBeGreaterThanOrEqual(2);
    // Once per attempt: after the first, it is sent alone and closes only its own channel.
    expect(transport.stats().refused).toBe(3);
    // A later message goes through at once: the relay is running, not backing off.
    const d = await database.transaction(async (tx) => bus.outbox(tx).publish(Poisoned, { n: 4 }, { key: 'a' }));
    bus.wake();
    await eventually(async () => expect(await published()).toContain(d));
    expect(bus.health().relay.paused).toBe(false);
  });

  it('a header RabbitMQ owns that reached the outbox anyway (appended without publish-time checks) is refused alone', async () => {
    const { bus, database, outbox, Poisoned, published } = await setup();
    const envelope = (key: string, headers: Record<string, string> = {}) => anEnvelope(Poisoned.topic, { type: Poisoned.type, key, headers });
    const [a, b, c] = [envelope('a'), envelope('b', { CC: 'x' }), envelope('c')];
    await database.transaction(async (tx) => outbox.append(tx, [{ envelope: a }, { envelope: b }, { envelope: c }]));
    await bus.start({ relay: true, consumers: false });
    const dead = await eventually(async () => {
      const list = await outbox.listDead();
      expect(list.map((row) => row.envelope.messageId)).toEqual([b.messageId]);
      return list[0]!;
    }, 20_000);
    expect(dead.lastError).toContain(`'CC'`);
    await eventually(async () => expect((await published()).sort()).toEqual(expect.arrayContaining([a.messageId, c.messageId].sort())));
    expect((await outbox.stats()).pending).toBe(0);
  });
});
