// Rows written through one SQL adapter are read by any other: the adapters share the
// engine's tables and statements, so a service may move from one data layer to another (or
// run two) without a migration. Checked here through RabbitMQ, on PostgreSQL:
// - a node-postgres producer (PgOutboxStore, its relay) and a Kysely consumer
//   (KyselyInboxStore, ctx.tx a Kysely Transaction) on the same tables, the consumer
//   publishing follow-ups through the Kysely outbox that the pg relay then claims;
// - rows written through @courier/pg claimed and relayed by the MikroORM relay, and the
//   other way round.
import { afterEach, describe, expect, it } from 'vitest';
import { createBus, defineMessage, type Delivery, type MessageDefinition, type Transport } from '@courier/core';
import { eventually, uniqueId, type TransportFixture } from '@courier/conformance';
import { PgOutboxStore, withTransaction } from '@courier/pg';
import { KyselyInboxStore, KyselyOutboxStore } from '@courier/kysely';
import { Kysely, PostgresDialect, sql, Transaction } from 'kysely';
import pg from 'pg';
import { createPostgresFixture, createRabbitMqFixture } from './support/fixtures.js';

const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';

/** Closers of what a case opened, run after it in reverse order whatever happened. */
const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close().catch(() => undefined);
});

/** A raw subscription that records each delivery (payloads and envelopes) and acknowledges it. */
async function sink(broker: TransportFixture, consumer: string, topic: string): Promise<Delivery[]> {
  const seen: Delivery[] = [];
  const subscription = await broker.transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 8 }, async (delivery) => {
    seen.push(delivery);
    await delivery.ack();
  });
  closers.push(() => subscription.close());
  return seen;
}

function pgPool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: PG_URL, max: 6 });
  // An idle client's socket error must not crash the test process.
  pool.on('error', () => undefined);
  closers.push(() => pool.end());
  return pool;
}

async function connect(broker: TransportFixture): Promise<Transport> {
  const transport = await broker.connect();
  closers.push(() => transport.close());
  return transport;
}

describe('interop: rows written through one SQL adapter are read by another (postgresql + rabbitmq)', () => {
  it('a pg producer and a Kysely consumer on the same tables: each message applied once, in key order, in a Kysely Transaction; its follow-ups relayed by pg', { timeout: 120_000 }, async () => {
    const testId = uniqueId();
    const tablePrefix = `${testId}_`;
    const broker = await createRabbitMqFixture({ testId });
    closers.push(() => broker.close());
    const pool = pgPool();
    const pgOutbox = new PgOutboxStore({ pool, tablePrefix });
    closers.push(() => pgOutbox.close());
    await pgOutbox.ensureSchema();
    await pool.query(`CREATE TABLE "${testId}_effects" (seq bigserial PRIMARY KEY, message_id text NOT NULL, key text, n int NOT NULL)`);
    closers.push(() => pool.query(`DROP TABLE IF EXISTS "${testId}_effects"`));

    // The consumer's side, all Kysely: its own pool, the inbox and the outbox on the pg tables.
    type Db = Record<string, Record<string, unknown>>;
    const db = new Kysely<Db>({ dialect: new PostgresDialect({ pool: pgPool() }) });
    const kyInbox = new KyselyInboxStore({ db, tablePrefix });
    const kyOutbox = new KyselyOutboxStore({ db, tablePrefix });
    closers.push(() => kyOutbox.close(), () => kyInbox.close());

    const Placed = defineMessage('interop.OrderPlaced', { version: 1, topic: `${testId}.placed` }) as MessageDefinition<{ n: number }, { n: number }>;
    const Shipped = defineMessage('interop.OrderShipped', { version: 1, topic: `${testId}.shipped` }) as MessageDefinition<{ n: number }, { n: number }>;
    const txKinds = new Set<string>();
    const consumer = createBus({ outbox: kyOutbox, inbox: kyInbox, transport: await connect(broker) });
    consumer.subscribe(
      `${testId}.shipping`,
      Placed,
      async (message, ctx) => {
        txKinds.add(ctx.tx instanceof Transaction && ctx.tx.isTransaction ? 'kysely Transaction' : String(ctx.tx));
        await sql`INSERT INTO ${sql.table(`${testId}_effects`)} (message_id, key, n) VALUES (${message.messageId}, ${message.key}, ${message.payload.n})`.execute(ctx.tx);
        await ctx.publish(Shipped, { n: message.payload.n }, message.key === null ? {} : { key: message.key });
      },
      { ordered: true },
    );
    const shipped = await sink(broker, `${testId}.sink`, Shipped.topic);
    await consumer.start({ relay: false });
    closers.push(() => consumer.stop({ timeoutMs: 10_000 }));

    // The producer's side, all node-postgres: publish in BEGIN … COMMIT on a PoolClient; its relay.
    const producer = createBus({ outbox: pgOutbox, transport: await connect(broker) });
    const committed: { id: string; key: string; n: number }[] = [];
    const rolledBack: string[] = [];
    for (let batch = 0; batch < 4; batch += 1) {
      const staged: { id: string; key: string; n: number }[] = [];
      await withTransaction(pool, async (client) => {
        for (let index = 0; index < 5; index += 1) {
          const n = batch * 5 + index;
          const key = `k${n % 3}`;
          staged.push({ id: await producer.outbox(client).publish(Placed, { n }, { key }), key, n });
        }
      });
      committed.push(...staged);
      // A rolled-back producer transaction: its row must never reach the Kysely consumer.
      await withTransaction(pool, async (client) => {
        rolledBack.push(await producer.outbox(client).publish(Placed, { n: -1 }, { key: 'k0' }));
        throw new Error('rolled back on purpose');
      }).catch((error: unknown) => {
        if (!(error instanceof Error) || error.message !== 'rolled back on purpose') throw error;
      });
    }
    await producer.start({ consumers: false });
    closers.push(() => producer.stop({ timeoutMs: 10_000 }));

    // Every follow-up the Kysely handler wrote reaches the broker through the pg relay.
    await eventually(() => expect(new Set(shipped.map((delivery) => delivery.envelope.messageId)).size).toBe(committed.length), { timeoutMs: 60_000 });
    const { rows: effects } = await pool.query<{ message_id: string; key: string; n: number }>(`SELECT message_id, key, n FROM "${testId}_effects" ORDER BY seq`);
    expect(effects.map((row) => row.message_id).sort(), 'each committed message applied once, nothing rolled back').toEqual(committed.map((entry) => entry.id).sort());
    for (const key of ['k0', 'k1', 'k2']) {
      expect(effects.filter((row) => row.key === key).map((row) => row.n), `key ${key} applied in publish order`).toEqual(committed.filter((entry) => entry.key === key).map((entry) => entry.n));
    }
    expect([...txKinds]).toEqual(['kysely Transaction']);
    // The follow-ups carry the chain: each caused by a pg-written message, in its correlation.
    const byId = new Map(committed.map((entry) => [entry.id, entry]));
    for (const delivery of shipped) {
      const cause = byId.get(delivery.envelope.causationId ?? '');
      expect(cause, `follow-up ${delivery.envelope.messageId} names the message that caused it`).toBeDefined();
      expect(delivery.envelope.key).toBe(cause!.key);
    }
    // A row is marked published after the broker confirmed it, so after its delivery may be seen.
    await eventually(async () => {
      const { rows: states } = await pool.query<{ state: string; count: string }>(`SELECT state, COUNT(*) AS count FROM "${tablePrefix}outbox" GROUP BY state`);
      expect(states.map((row) => [row.state, Number(row.count)])).toEqual([['published', committed.length * 2]]);
    }, { timeoutMs: 30_000, intervalMs: 100 });
    expect(rolledBack).toHaveLength(4);
  });

  it('rows written through @courier/pg are claimed and relayed by the MikroORM relay', { timeout: 120_000 }, async () => {
    const testId = uniqueId();
    const broker = await createRabbitMqFixture({ testId });
    closers.push(() => broker.close());
    // The schema made by MikroORM's store; the pg outbox writes into it with the same prefix.
    const mikro = await createPostgresFixture({ testId });
    closers.push(() => mikro.close());
    const pool = pgPool();
    const pgOutbox = new PgOutboxStore({ pool, tablePrefix: mikro.tablePrefix });
    closers.push(() => pgOutbox.close());

    const Placed = defineMessage('interop.OrderPlaced', { version: 1, topic: `${testId}.placed` }) as MessageDefinition<{ n: number; note: string }, { n: number; note: string }>;
    const seen = await sink(broker, `${testId}.sink`, Placed.topic);
    const writer = createBus({ outbox: pgOutbox, transport: broker.transport });
    const ids: string[] = [];
    await withTransaction(pool, async (client) => {
      for (let n = 0; n < 12; n += 1) {
        ids.push(await writer.outbox(client).publish(Placed, { n, note: `é ${n} \u{1F4E6}` }, n % 4 === 3 ? { headers: { origin: 'pg' } } : { key: `k${n % 2}`, headers: { origin: 'pg' } }));
      }
    });

    const relay = createBus({ outbox: mikro.outbox, transport: await connect(broker) });
    await relay.start({ consumers: false });
    closers.push(() => relay.stop({ timeoutMs: 10_000 }));
    await eventually(() => expect(new Set(seen.map((delivery) => delivery.envelope.messageId)).size).toBe(ids.length), { timeoutMs: 60_000 });

    const byId = new Map(seen.map((delivery) => [delivery.envelope.messageId, delivery.envelope]));
    ids.forEach((id, n) => {
      const envelope = byId.get(id)!;
      expect({ type: envelope.type, key: envelope.key, origin: envelope.headers['origin'], payload: JSON.parse(envelope.payload) }).toEqual({
        type: Placed.type,
        key: n % 4 === 3 ? null : `k${n % 2}`,
        origin: 'pg',
        payload: { n, note: `é ${n} \u{1F4E6}` },
      });
    });
    await eventually(async () => {
      const states = await mikro.sql(`SELECT state, COUNT(*) AS count FROM ${mikro.table('outbox')} GROUP BY state`);
      expect(states.map((row) => [row['state'], Number(row['count'])])).toEqual([['published', ids.length]]);
    }, { timeoutMs: 30_000, intervalMs: 100 });
  });

  it('rows written through MikroORM are claimed and relayed by the pg relay', { timeout: 120_000 }, async () => {
    const testId = uniqueId();
    const broker = await createRabbitMqFixture({ testId });
    closers.push(() => broker.close());
    const mikro = await createPostgresFixture({ testId });
    closers.push(() => mikro.close());
    const pool = pgPool();
    const pgOutbox = new PgOutboxStore({ pool, tablePrefix: mikro.tablePrefix });
    closers.push(() => pgOutbox.close());

    const Placed = defineMessage('interop.OrderPlaced', { version: 1, topic: `${testId}.placed` }) as MessageDefinition<{ n: number }, { n: number }>;
    const seen = await sink(broker, `${testId}.sink`, Placed.topic);
    const writer = createBus({ outbox: mikro.outbox, transport: broker.transport });
    const ids = await mikro.transaction(async (em) => {
      const written: string[] = [];
      for (let n = 0; n < 12; n += 1) written.push(writer.outbox(em).publish(Placed, { n }, n % 4 === 3 ? {} : { key: `k${n % 2}` }));
      return written;
    });

    const relay = createBus({ outbox: pgOutbox, transport: await connect(broker) });
    await relay.start({ consumers: false });
    closers.push(() => relay.stop({ timeoutMs: 10_000 }));
    await eventually(() => expect(new Set(seen.map((delivery) => delivery.envelope.messageId)).size).toBe(ids.length), { timeoutMs: 60_000 });
    const byId = new Map(seen.map((delivery) => [delivery.envelope.messageId, delivery.envelope]));
    expect(ids.map((id) => JSON.parse(byId.get(id)!.payload) as unknown)).toEqual(ids.map((_id, n) => ({ n })));
    await eventually(async () => {
      const { rows } = await pool.query<{ state: string; count: string }>(`SELECT state, COUNT(*) AS count FROM ${mikro.table('outbox')} GROUP BY state`);
      expect(rows.map((row) => [row.state, Number(row.count)])).toEqual([['published', ids.length]]);
    }, { timeoutMs: 30_000, intervalMs: 100 });
  });
});
