// The transport declares AMQP's 255-byte short-string limits, so the bus refuses what
// would not fit at publish() and subscribe — never later as a dead outbox row.
import { ConfigError, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, createBus, defineMessage, type InMemoryTransaction } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport } from '../src/index.js';
import { BROKER_URL, deleteTopology, eventually, TEST_TIERS_MS, testId } from './support/broker.js';

const Note = defineMessage('limits.NoteTaken', { version: 1 });

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A bus on in-memory stores and a RabbitMQ transport under a fresh prefix, torn down after the test. */
function setup(consumers: string[] = []) {
  const prefix = `courier-${testId()}`;
  const transport = new RabbitMqTransport({ connection: BROKER_URL, prefix, delayTiersMs: TEST_TIERS_MS });
  const db = new InMemoryDatabase();
  const outbox = new InMemoryOutboxStore({ database: db });
  const bus = createBus<InMemoryTransaction>({
    outbox,
    inbox: new InMemoryInboxStore({ database: db }),
    transport,
    relay: { pollIntervalMs: 20 },
  });
  cleanups.push(async () => {
    await bus.stop({ timeoutMs: 2_000 });
    await transport.close();
    await deleteTopology(prefix, consumers);
  });
  return { prefix, transport, bus, db, outbox };
}

/** What `act` threw, failing the test when it did not throw. */
function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

describe('RabbitMqTransport limits, enforced by the bus', () => {
  it('declares 255 bytes for ids, type, topic and header names, and the consumer bytes its queue names leave', () => {
    const { transport, prefix } = setup();
    // `<prefix>.q.<consumer>.retry.600ms` is the longest name derived from a consumer.
    const derived = Buffer.byteLength(`${prefix}.q..retry.600ms`, 'utf8');
    expect(transport.limits).toEqual({
      id: { bytes: 255 },
      type: { bytes: 255 },
      topic: { bytes: 255 },
      headerName: { bytes: 255 },
      consumer: { bytes: 255 - derived },
    });
  });

  it('refuses at publish a multibyte messageId or header name over 255 bytes, and appends nothing', async () => {
    const { bus, db, outbox } = setup();
    await db.transaction(async (tx) => {
      const publisher = bus.outbox(tx);
      // 128 characters: under the core's 200, but 256 UTF-8 bytes.
      const id = thrown(() => publisher.publish(Note, {}, { messageId: 'é'.repeat(128) }));
      expect(id).toBeInstanceOf(ConfigError);
      expect((id as ConfigError).problems).toEqual([`publish 'limits.NoteTaken': 'messageId' '${'é'.repeat(40)}…' is 256 UTF-8 bytes; the transport holds at most 255`]);
      const header = thrown(() => publisher.publish(Note, {}, { headers: { ['ü'.repeat(128)]: 'v' } }));
      expect(header).toBeInstanceOf(ConfigError);
      expect((header as ConfigError).message).toContain('is 256 UTF-8 bytes');
    });
    expect((await outbox.stats()).pending).toBe(0);
  });

  it('a messageId of exactly 255 bytes is published, relayed and consumed', async () => {
    const { bus, db } = setup(['limits-reader']);
    const seen: string[] = [];
    bus.subscribe('limits-reader', Note, async (message) => {
      seen.push(message.messageId);
    });
    await bus.start();
    const messageId = `${'é'.repeat(127)}a`;
    await db.transaction(async (tx) => {
      bus.outbox(tx).publish(Note, {}, { messageId, headers: { ['ü'.repeat(100)]: 'at the core limit: 200 bytes' } });
    });
    await eventually(() => expect(seen).toEqual([messageId]), 20_000);
    expect(bus.health().counters.deadLettered).toBe(0);
  });

  it('refuses at subscribe, synchronously, a consumer name whose queue names would exceed 255 bytes', () => {
    const { bus, transport } = setup();
    const max = transport.limits.consumer!.bytes!;
    const error = thrown(() => bus.subscribe('c'.repeat(max + 1), Note, async () => undefined));
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([`consumer name '${'c'.repeat(max + 1)}' is ${max + 1} UTF-8 bytes; the transport holds at most ${max}`]);
    bus.subscribe('c'.repeat(max), Note, async () => undefined);
  });
});
