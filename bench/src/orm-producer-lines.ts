// Producer lines on Drizzle and TypeORM (PostgreSQL): what `bus.outbox(tx).publish()` costs
// against each ORM's own hand-written outbox insert in the same transaction. Each transaction
// inserts one business row and one outbox row (keyless message), one transaction at a time on
// one connection; rounds alternate hand / courier so a change of machine load hits both alike.
// Prints transactions per second of each and the ratio courier / hand (target ≥ 0.95).
//
//   node --conditions=@courier/source --import tsx src/orm-producer-lines.ts [transactions] [rounds]
import { randomUUID } from 'node:crypto';
import { createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { courierPgTables, DrizzleOutboxStore } from '@courier/drizzle';
import { TypeOrmOutboxStore } from '@courier/typeorm';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { DataSource } from 'typeorm';

const count = Number(process.argv[2] ?? 1000);
const rounds = Number(process.argv[3] ?? 3);
const url = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
const OrderPlaced = defineMessage('bench.OrderPlaced', { version: 1 });
const tag = `bench_orm_${process.pid}`;

interface Line {
  name: string;
  hand(i: number): Promise<void>;
  courier(i: number): Promise<void>;
  close(): Promise<void>;
}

function outboxRow(i: number) {
  return {
    messageId: randomUUID(),
    messageType: 'bench.OrderPlaced',
    messageVersion: 1,
    topic: 'bench.OrderPlaced',
    occurredAt: new Date().toISOString(),
    correlationId: randomUUID(),
    headers: '{}',
    payload: JSON.stringify({ orderId: `o-${i}`, total: i }),
    availableAt: new Date(),
  };
}

async function drizzleLine(): Promise<Line> {
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  const db = drizzle(pool);
  const tablePrefix = `${tag}_dz_`;
  const outbox = new DrizzleOutboxStore({ db, tablePrefix });
  await outbox.ensureSchema();
  const tables = courierPgTables({ tablePrefix });
  const orders = `"${tablePrefix}orders"`;
  await db.execute(sql.raw(`CREATE TABLE IF NOT EXISTS ${orders} (id varchar(64) PRIMARY KEY, total integer NOT NULL)`));
  const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
  const order = (tx: Parameters<Parameters<typeof db.transaction>[0]>[0], i: number) =>
    tx.execute(sql`INSERT INTO ${sql.raw(orders)} (id, total) VALUES (${`${randomUUID()}`}, ${i})`);
  return {
    name: 'drizzle (node-postgres)',
    hand: (i) =>
      db.transaction(async (tx) => {
        await order(tx, i);
        const row = outboxRow(i);
        await tx.execute(
          sql`INSERT INTO ${sql.raw(`"${tablePrefix}outbox"`)} (message_id, message_type, message_version, topic, occurred_at, correlation_id, headers, payload, available_at)
              VALUES (${row.messageId}, ${row.messageType}, ${row.messageVersion}, ${row.topic}, ${row.occurredAt}, ${row.correlationId}, ${row.headers}, ${row.payload}, ${row.availableAt.toISOString()})`,
        );
      }),
    courier: (i) =>
      db.transaction(async (tx) => {
        await order(tx, i);
        await bus.outbox(tx).publish(OrderPlaced, { orderId: `o-${i}`, total: i });
      }),
    async close() {
      await outbox.close();
      for (const name of ['outbox', 'inbox', 'inbox_starts', 'inbox_halts', 'inbox_held', 'inbox_parked', 'meta', 'orders']) {
        await db.execute(sql.raw(`DROP TABLE IF EXISTS "${tablePrefix}${name}"`));
      }
      await db.execute(sql.raw(`DROP SEQUENCE IF EXISTS "${tables.tokenSequence.seqName}"`));
      await pool.end();
    },
  };
}

async function typeOrmLine(): Promise<Line> {
  const dataSource = await new DataSource({ type: 'postgres', url, poolSize: 1 }).initialize();
  const tablePrefix = `${tag}_to_`;
  // The bench resolves typeorm against its own pg version, a different copy of the same
  // typeorm release than the plugin's: the same class at run time, two types to tsc.
  const outbox = new TypeOrmOutboxStore({ dataSource: dataSource as unknown as ConstructorParameters<typeof TypeOrmOutboxStore>[0]['dataSource'], tablePrefix });
  await outbox.ensureSchema();
  const orders = `"${tablePrefix}orders"`;
  await dataSource.query(`CREATE TABLE IF NOT EXISTS ${orders} (id varchar(64) PRIMARY KEY, total integer NOT NULL)`);
  const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
  const insertOutbox = `INSERT INTO "${tablePrefix}outbox" (message_id, message_type, message_version, topic, occurred_at, correlation_id, headers, payload, available_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`;
  return {
    name: 'typeorm (postgres)',
    hand: (i) =>
      dataSource.transaction(async (manager) => {
        await manager.query(`INSERT INTO ${orders} (id, total) VALUES ($1, $2)`, [randomUUID(), i]);
        const row = outboxRow(i);
        await manager.query(insertOutbox, [row.messageId, row.messageType, row.messageVersion, row.topic, row.occurredAt, row.correlationId, row.headers, row.payload, row.availableAt]);
      }),
    courier: (i) =>
      dataSource.transaction(async (manager) => {
        await manager.query(`INSERT INTO ${orders} (id, total) VALUES ($1, $2)`, [randomUUID(), i]);
        await bus.outbox(manager as never).publish(OrderPlaced, { orderId: `o-${i}`, total: i }); // same two-copies reason as above
      }),
    async close() {
      await outbox.close();
      for (const name of ['outbox', 'inbox', 'inbox_starts', 'inbox_halts', 'inbox_held', 'inbox_parked', 'meta', 'orders']) {
        await dataSource.query(`DROP TABLE IF EXISTS "${tablePrefix}${name}"`);
      }
      await dataSource.query(`DROP SEQUENCE IF EXISTS "${tablePrefix}outbox_token_seq"`);
      await dataSource.destroy();
    },
  };
}

async function rate(run: (i: number) => Promise<void>): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < count; i += 1) await run(i);
  return count / ((performance.now() - started) / 1000);
}

for (const open of [drizzleLine, typeOrmLine]) {
  const line = await open();
  try {
    for (let i = 0; i < 50; i += 1) {
      await line.hand(i);
      await line.courier(i);
    }
    const hand: number[] = [];
    const courier: number[] = [];
    for (let round = 0; round < rounds; round += 1) {
      hand.push(await rate(line.hand));
      courier.push(await rate(line.courier));
    }
    const best = (values: number[]) => Math.max(...values);
    console.log(
      `${line.name}: hand-written insert ${best(hand).toFixed(0)} tx/s, courier publish ${best(courier).toFixed(0)} tx/s, ratio ${(best(courier) / best(hand)).toFixed(3)} ` +
        `(best of ${rounds} rounds of ${count}; all: hand ${hand.map((v) => v.toFixed(0)).join('/')}, courier ${courier.map((v) => v.toFixed(0)).join('/')})`,
    );
  } finally {
    await line.close();
  }
}
