// RedisInboxStore under a bus: the handler's unit of work is the database transaction the
// outbox uses (`unitOfWork`), so ctx.publish commits with the handler's effects; copies of
// a message delivered at once and later run the handler once; a dead letter's copy is
// acknowledged, its replay runs under its own record. The in-memory database and broker
// stand in for the application's SQL database and broker; the records are in the real Redis.
import { InMemoryBroker, InMemoryDatabase, InMemoryOutboxStore, UnrecoverableError, createBus, defineMessage, newMessageId, type Envelope, type InMemoryTransaction } from '@courier/core';
import { eventually, uniqueId } from '@courier/conformance';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisInboxStore } from '../src/index.js';
import { connectRedis, deleteUnder } from './support/redis.js';

const Charged = defineMessage('billing.Charged', { version: 1 });
const Receipt = defineMessage('receipts.ReceiptSent', { version: 1 });

// Each step is a few Redis round trips and a relay poll; on a loaded 2-core CI machine one
// took over eventually's default 5 s. Slow is not wrong here: wait for it.
const LOADED = { timeoutMs: 30_000 };

let redis: Redis;
const prefix = `courier-test:${uniqueId()}:`;
beforeAll(async () => {
  redis = await connectRedis();
});
afterAll(async () => {
  await deleteUnder(redis, prefix);
  redis.disconnect();
});

function envelope(messageId: string): Envelope {
  return {
    messageId,
    type: Charged.type,
    version: 1,
    topic: Charged.topic,
    occurredAt: new Date().toISOString(),
    key: 'k',
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
  };
}

describe('RedisInboxStore in a bus', () => {
  it('copies run the handler once, ctx.publish commits in the unit of work, a dead letter\'s copy is acknowledged and its replay runs', async () => {
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const connection = broker.connect();
    const inbox = new RedisInboxStore<InMemoryTransaction>({ redis, prefix, unitOfWork: (work) => database.transaction(work) });
    const outbox = new InMemoryOutboxStore({ database });
    const bus = createBus({ outbox, inbox, transport: connection, relay: { pollIntervalMs: 20 } });
    const runs: string[] = [];
    const receipts: string[] = [];
    let declined = newMessageId();
    bus.subscribe('billing', Charged, async (message, ctx) => {
      runs.push(message.messageId);
      if (message.messageId === declined) throw new UnrecoverableError('card declined');
      ctx.publish(Receipt, {});
    });
    bus.subscribe('receipts', Receipt, async (message) => void receipts.push(message.causationId ?? 'none'));
    await bus.start();

    const id = newMessageId();
    await connection.publish([envelope(id), envelope(id), envelope(id)]);
    await eventually(() => expect(bus.health().counters.duplicates).toBe(2), LOADED);
    await connection.publish([envelope(id)]);
    await eventually(() => expect(bus.health().counters.duplicates).toBe(3), LOADED);
    expect(runs).toEqual([id]);
    // The receipt published in the handler's unit of work went out through the outbox.
    await eventually(() => expect(receipts).toEqual([id]), LOADED);

    await connection.publish([envelope(declined)]);
    await eventually(() => expect(bus.health().counters.deadLettered).toBe(1), LOADED);
    await connection.publish([envelope(declined)]);
    await eventually(() => expect(bus.health().counters.duplicates).toBe(4), LOADED);
    const letters = await connection.deadLetters.list('billing');
    expect(letters.map((letter) => letter.envelope.messageId)).toEqual([declined]);
    declined = 'none';
    expect(await connection.deadLetters.replay('billing', letters.map((letter) => letter.id))).toBe(1);
    await eventually(() => expect(runs).toEqual([id, letters[0]!.envelope.messageId, letters[0]!.envelope.messageId]), LOADED);
    await eventually(() => expect(receipts.sort()).toEqual([id, letters[0]!.envelope.messageId].sort()), LOADED);
    // billing: the handled message, the dead letter's own record (so its copy is a duplicate) and its replay's.
    expect(await inbox.stats()).toMatchObject({ consumers: [{ consumer: 'billing', records: 3, deadLetters: 1, replayed: 1 }, { consumer: 'receipts', records: 2 }] });
    await bus.stop();
    await broker.close();
  }, 120_000);
});
