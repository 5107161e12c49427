// Producer lines on Drizzle and TypeORM (PostgreSQL): what `bus.outbox(tx).publish()` costs
// against each ORM's own hand-written outbox insert in the same transaction. Each transaction
// inserts one business row and one outbox row, one transaction at a time on one connection;
// rounds alternate hand / courier (keyless) / courier keyed, so a change of machine load hits
// them alike. Prints transactions per second of each and the ratios courier / hand (target
// ≥ 0.95; the keyed line also takes the key's advisory lock, inside its INSERT).
//
// With `--cost <transactions>` it measures instead what one transaction of each mode costs:
// the statements sent (counted at the driver), this process's CPU, the serving PostgreSQL
// backend's CPU (/proc/<pid>/schedstat: run it on the database's machine) and the wall time,
// medians over rounds whose mode order alternates. CPU time is what load distorts least.
//
//   node --conditions=@courier/source --import tsx src/orm-producer-lines.ts [transactions] [rounds] [--cost transactions]
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { courierPgTables, DrizzleOutboxStore } from '@courier/drizzle';
import { TypeOrmOutboxStore } from '@courier/typeorm';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { DataSource } from 'typeorm';

const costAt = process.argv.indexOf('--cost');
const cost = costAt < 0 ? undefined : Number(process.argv[costAt + 1]);
const args = costAt < 0 ? process.argv.slice(2) : [...process.argv.slice(2, costAt), ...process.argv.slice(costAt + 2)];
const count = Number(args[0] ?? 1000);
const rounds = Number(args[1] ?? 3);
if (!(count > 0) || !(rounds > 0) || (cost !== undefined && !(cost > 0))) {
  console.error('usage: orm-producer-lines.ts [transactions > 0] [rounds > 0] [--cost transactions > 0]');
  process.exit(2);
}
/** Statements the line's connection sent while `counting`; each line's pg Client reports here. */
let sent = 0;
let counting = false;
/** A node-postgres Client class of `base` that counts the queries it is given. */
// A mixin's constructor must take `...args: any[]` (TypeScript's rule for class mixins).
function countingClient<C extends new (...args: any[]) => { query(...args: unknown[]): unknown }>(base: C): C {
  return class extends base {
    override query(...args: unknown[]): unknown {
      if (counting) sent += 1;
      return super.query(...args);
    }
  };
}
const url = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
const OrderPlaced = defineMessage('bench.OrderPlaced', { version: 1 });
const tag = `bench_orm_${process.pid}`;

interface Line {
  name: string;
  hand(i: number): Promise<void>;
  courier(i: number): Promise<void>;
  /** The same publish with a key (the per-key advisory lock taken inside the INSERT). */
  keyed(i: number): Promise<void>;
  /** The pid of the PostgreSQL backend serving the line's one connection. */
  backendPid(): Promise<number>;
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
  const pool = new pg.Pool({ connectionString: url, max: 1, Client: countingClient(pg.Client) });
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
    keyed: (i) =>
      db.transaction(async (tx) => {
        await order(tx, i);
        await bus.outbox(tx).publish(OrderPlaced, { orderId: `o-${i}`, total: i }, { key: `customer-${i % 64}` });
      }),
    backendPid: async () => Number((await db.execute(sql.raw('SELECT pg_backend_pid() AS pid'))).rows[0]!['pid']),
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
  // TypeORM's own node-postgres (it may be another copy than this package's), its Client counted.
  const typeormPg = createRequire(createRequire(import.meta.url).resolve('typeorm'))('pg') as { Client: new (...args: unknown[]) => { query(...args: unknown[]): unknown } };
  const dataSource = await new DataSource({ type: 'postgres', url, poolSize: 1, extra: { Client: countingClient(typeormPg.Client) } }).initialize();
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
    keyed: (i) =>
      dataSource.transaction(async (manager) => {
        await manager.query(`INSERT INTO ${orders} (id, total) VALUES ($1, $2)`, [randomUUID(), i]);
        await bus.outbox(manager as never).publish(OrderPlaced, { orderId: `o-${i}`, total: i }, { key: `customer-${i % 64}` });
      }),
    backendPid: async () => Number(((await dataSource.query('SELECT pg_backend_pid() AS pid')) as { pid: number }[])[0]!.pid),
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

function backendCpuMicros(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1000;
}

const MODES = ['hand', 'courier', 'keyed'] as const;
type Mode = (typeof MODES)[number];

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

async function measureCost(line: Line, transactions: number): Promise<void> {
  const samples = new Map<Mode, { statements: number[]; client: number[]; server: number[]; wall: number[] }>(MODES.map((mode) => [mode, { statements: [], client: [], server: [], wall: [] }]));
  for (let round = 0; round < rounds; round += 1) {
    for (const mode of round % 2 === 0 ? MODES : [...MODES].reverse()) {
      const pid = await line.backendPid();
      const serverBefore = backendCpuMicros(pid);
      const clientBefore = process.cpuUsage();
      sent = 0;
      counting = true;
      const started = performance.now();
      for (let i = 0; i < transactions; i += 1) await line[mode](i);
      const wall = ((performance.now() - started) * 1000) / transactions;
      counting = false;
      const client = process.cpuUsage(clientBefore);
      const server = (backendCpuMicros(pid) - serverBefore) / transactions;
      const sample = samples.get(mode)!;
      sample.statements.push(sent / transactions);
      sample.client.push((client.user + client.system) / transactions);
      sample.wall.push(wall);
      // A pool that replaced its connection mid-round would leave the server's count short.
      if ((await line.backendPid()) === pid) sample.server.push(server);
      else console.log(`${line.name} ${mode}: the backend changed in round ${round}; its CPU not counted`);
    }
  }
  for (const mode of MODES) {
    const sample = samples.get(mode)!;
    console.log(
      `${line.name} ${mode}: ${median(sample.statements).toFixed(2)} statements, client CPU ${median(sample.client).toFixed(0)} µs, backend CPU ${median(sample.server).toFixed(0)} µs, wall ${median(sample.wall).toFixed(0)} µs per transaction (1 writer, median of ${rounds} rounds of ${transactions})`,
    );
  }
}

for (const open of [drizzleLine, typeOrmLine]) {
  const line = await open();
  try {
    for (let i = 0; i < 50; i += 1) for (const mode of MODES) await line[mode](i);
    if (cost !== undefined) {
      await measureCost(line, cost);
      continue;
    }
    const rates = new Map<Mode, number[]>(MODES.map((mode) => [mode, []]));
    for (let round = 0; round < rounds; round += 1) {
      for (const mode of round % 2 === 0 ? MODES : [...MODES].reverse()) rates.get(mode)!.push(await rate(line[mode]));
    }
    const best = (mode: Mode) => Math.max(...rates.get(mode)!);
    const all = (mode: Mode) => rates.get(mode)!.map((v) => v.toFixed(0)).join('/');
    console.log(
      `${line.name}: hand-written insert ${best('hand').toFixed(0)} tx/s, courier publish ${best('courier').toFixed(0)} tx/s (ratio ${(best('courier') / best('hand')).toFixed(3)}), keyed ${best('keyed').toFixed(0)} tx/s (ratio ${(best('keyed') / best('hand')).toFixed(3)}) ` +
        `(best of ${rounds} rounds of ${count}; all: hand ${all('hand')}, courier ${all('courier')}, keyed ${all('keyed')})`,
    );
  } finally {
    await line.close();
  }
}
