// Scenario 1's transactions one at a time, to see what Courier adds to one: this process's
// CPU per transaction, the PostgreSQL backend's CPU per transaction (its
// /proc/<pid>/schedstat, so run it on the database's machine; one connection per line), and
// the statements it sends (every pg.Client query, MikroORM's and Courier's alike, counted by
// wrapping the driver — no server-side statement logging).
//
//   node --conditions=@courier/source --import tsx experiments/producer-cost.ts [transactions] [rounds] [modes]
//   (add --cpu-prof --cpu-prof-dir=<dir> before --import to profile; modes: comma list of
//   business,hand,courier,keyless,raw; raw is node-postgres BEGIN/INSERT/INSERT/COMMIT)
//
// One writer, so the CPU per transaction is not hidden by waiting; rounds alternate the
// modes (A, B, A, B…) so a change of machine load hits them alike.
import { createBus, InMemoryBroker } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { handWrittenInsert, pgPool, rawPgProducerTx } from '../src/ceilings.js';
import { openDb, OrderPlaced, orderPayload, outboxValues, runId, statementShape } from '../src/setup.js';

type Mode = 'business' | 'hand' | 'courier' | 'keyless' | 'raw';

const count = Number(process.argv[2] ?? 2000);
const rounds = Number(process.argv[3] ?? 3);
const modes = (process.argv[4] ?? 'business,hand,courier').split(',') as Mode[];

const statements = new Map<string, number>();
let counting = false;
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]): unknown {
  if (counting) {
    const shape = statementShape(args[0], 50);
    statements.set(shape, (statements.get(shape) ?? 0) + 1);
  }
  return query.apply(this, args);
} as typeof pg.Client.prototype.query;

// One connection, so one backend serves every MikroORM transaction.
const db = await openDb('postgresql', { prefix: `bench_${runId()}_cost`, poolMax: 1, wakeups: false });
const bus = createBus<EntityManager>({ outbox: db.outbox, transport: new InMemoryBroker().connect() });
const insert = handWrittenInsert(db);
const pool = pgPool(1);
let serial = 0;

/** The backend serving `mode`'s transactions (the only connection of its pool). */
async function backendPid(mode: Mode): Promise<number> {
  const rows = mode === 'raw' ? (await pool.query('SELECT pg_backend_pid() AS pid')).rows : await db.sql('SELECT pg_backend_pid() AS pid');
  return Number((rows[0] as { pid: unknown }).pid);
}

/** CPU time the backend has run, µs (schedstat's first field is nanoseconds on a CPU). */
function backendCpu(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1000;
}

async function once(mode: Mode): Promise<void> {
  const id = `o-${(serial += 1)}`;
  if (mode === 'raw') return rawPgProducerTx(pool, db, id);
  await db.orm.em.fork().transactional(async (em) => {
    em.persist(em.create(db.Order, { id, customerId: `c-${id.slice(-6)}`, totalCents: 12_345, createdAt: new Date() }));
    if (mode === 'hand') await em.getConnection().execute(insert, outboxValues(id), 'run', em.getTransactionContext());
    else if (mode === 'courier') bus.outbox(em).publish(OrderPlaced, orderPayload(id), { key: id });
    else if (mode === 'keyless') bus.outbox(em).publish(OrderPlaced, orderPayload(id));
  });
}

try {
  for (const mode of modes) for (let i = 0; i < 200; i += 1) await once(mode);
  const cpu = new Map<Mode, number[]>();
  const wall = new Map<Mode, number[]>();
  const server = new Map<Mode, number[]>();
  for (let round = 0; round < rounds; round += 1) {
    for (const mode of round % 2 === 0 ? modes : [...modes].reverse()) {
      statements.clear();
      counting = true;
      const pid = await backendPid(mode);
      const serverBefore = backendCpu(pid);
      const started = performance.now();
      const before = process.cpuUsage();
      for (let i = 0; i < count; i += 1) await once(mode);
      const used = process.cpuUsage(before);
      const elapsed = performance.now() - started;
      const serverUsed = backendCpu(pid) - serverBefore;
      counting = false;
      // A pool that replaced its connection mid-block would leave the count short.
      if ((await backendPid(mode)) !== pid) console.log(`${mode}: the backend changed during round ${round}; its server CPU is not counted`);
      server.set(mode, [...(server.get(mode) ?? []), serverUsed / count]);
      cpu.set(mode, [...(cpu.get(mode) ?? []), ((used.user + used.system) / count)]);
      wall.set(mode, [...(wall.get(mode) ?? []), (elapsed * 1000) / count]);
      if (round === 0) {
        const shapes = [...statements].map(([shape, n]) => `${(n / count).toFixed(2)} × ${shape}`).join('\n    ');
        console.log(`${mode}: ${([...statements.values()].reduce((a, b) => a + b, 0) / count).toFixed(2)} statements/tx\n    ${shapes}`);
      }
    }
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
  // Each round's ratio to the hand-written line: adjacent blocks share the machine's load.
  const hand = cpu.get('hand');
  const handWall = wall.get('hand');
  for (const mode of modes) {
    if (mode === 'hand' || !hand || !handWall) continue;
    const cpuRatios = cpu.get(mode)!.map((value, round) => value / hand[round]!);
    const wallRatios = wall.get(mode)!.map((value, round) => value / handWall[round]!);
    const serverDiffs = server.get(mode)!.map((value, round) => value - server.get('hand')![round]!);
    const cpuDiffs = cpu.get(mode)!.map((value, round) => value - hand[round]!);
    console.log(
      `${mode} / hand: CPU ${median(cpuRatios).toFixed(3)}, wall ${median(wallRatios).toFixed(3)}; ${mode} − hand: CPU ${median(cpuDiffs).toFixed(0)} µs/tx, ` +
        `server CPU ${median(serverDiffs).toFixed(0)} µs/tx (medians of ${rounds} rounds)`,
    );
  }
  for (const mode of modes) {
    console.log(
      `${mode.padEnd(9)} CPU ${median(cpu.get(mode)!).toFixed(0)} µs/tx (${cpu.get(mode)!.map((v) => v.toFixed(0)).join(', ')}), ` +
        `server CPU ${median(server.get(mode)!).toFixed(0)} µs/tx (${server.get(mode)!.map((v) => v.toFixed(0)).join(', ')}), ` +
        `wall ${median(wall.get(mode)!).toFixed(0)} µs/tx (${wall.get(mode)!.map((v) => v.toFixed(0)).join(', ')})`,
    );
  }
} finally {
  await pool.end();
  await db.close();
}
