// The MariaDB relay drain seen from the server (bench/README.md, "The MariaDB keyless drain at
// 100k — cause"): drains in the given order, each from an emptied outbox, with per drain the
// SHOW GLOBAL STATUS deltas of the handler and lock counters, the InnoDB history length sampled
// every second, the time of each claim transaction, and ANALYZE FORMAT=JSON of the head scan
// taken while the relay runs (at the given fractions confirmed, rolled back), with the probe as
// the dialect writes it (FORCE INDEX on key_ix) and as the optimizer would choose it.
//
//   node --conditions=@courier/source --import tsx experiments/keyless-diag.ts [rows] [keyless,keyed,…] [0.5,0.97]
import { loadavg } from 'node:os';
import { truncate } from '../src/scenarios/drain.js';
import { anyPending, BenchBroker, benchBus, openDb, seedBacklog, TimedTransport, until, warmRelay } from '../src/setup.js';

const count = Number(process.argv[2] ?? 100_000);
const order = (process.argv[3] ?? 'keyless,keyed').split(',');
const fractions = (process.argv[4] ?? '0.5,0.97').split(',').map(Number);
const prefix = `kdiag${Date.now().toString(36)}`;
const db = await openDb('mariadb', { prefix, wakeups: false });
const broker = new BenchBroker(prefix);
const COUNTERS = ['Handler_read_next', 'Handler_read_key', 'Innodb_buffer_pool_read_requests', 'Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_deadlocks'];

async function status(): Promise<Map<string, number>> {
  const rows = await db.sql(`SHOW GLOBAL STATUS WHERE Variable_name IN (${[...COUNTERS, 'Innodb_history_list_length'].map(() => '?').join(', ')})`, [...COUNTERS, 'Innodb_history_list_length']);
  return new Map(rows.map((row) => [String(row['Variable_name']), Number(row['Value'])]));
}

function quantile(values: readonly number[], q: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

const keyIx = `\`${db.names.outbox}_key_ix\``;
/** The claim's head scan as the MySQL dialect writes it (`hint` after the probe's alias). */
const heads = (hint: string) =>
  `SELECT o.seq FROM ${db.table('outbox')} o WHERE o.state = 'pending' AND o.available_at <= UTC_TIMESTAMP(3) ` +
  `AND NOT EXISTS (SELECT 1 FROM ${db.table('outbox')} e${hint} WHERE e.key_hash = o.key_hash AND e.state IN ('pending', 'halted') AND e.seq < o.seq) ` +
  `ORDER BY o.available_at, o.seq LIMIT 250 FOR UPDATE SKIP LOCKED`;

interface PlanTable {
  readonly table_name?: string;
  readonly key?: string;
  readonly access_type?: string;
  readonly r_loops?: number;
  readonly r_rows?: number | null;
}

function planTables(node: unknown, out: PlanTable[] = []): PlanTable[] {
  if (node !== null && typeof node === 'object') {
    const table = (node as { table?: PlanTable }).table;
    if (table !== undefined) out.push(table);
    for (const value of Object.values(node)) planTables(value, out);
  }
  return out;
}

type Raw = { raw(sql: string): Promise<unknown> };
const knex = (db.orm.em.getConnection('write') as unknown as { getKnex(): { transaction(work: (trx: Raw) => Promise<void>): Promise<void> } }).getKnex();

/** ANALYZE FORMAT=JSON of the head scan in a READ COMMITTED transaction that is rolled back (it locks up to 250 rows meanwhile). */
async function analyzeHeads(hint: string): Promise<string> {
  let line = '';
  await knex
    .transaction(async (trx) => {
      await trx.raw('SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED');
      const result = (await trx.raw(`ANALYZE FORMAT=JSON ${heads(hint)}`)) as Record<string, unknown>[][];
      const plan = JSON.parse(String(Object.values(result[0]![0]!)[0])) as { query_block: { r_total_time_ms: number } };
      const probe = planTables(plan).find((table) => table.table_name === 'e');
      line = `${plan.query_block.r_total_time_ms.toFixed(1)} ms, probe ${probe?.access_type} on ${probe?.key?.replace(`${db.names.outbox}_`, '')}, ${probe?.r_loops} × ${Number(probe?.r_rows ?? 0).toFixed(0)} rows`;
      throw new Error('rollback');
    })
    .catch((error: unknown) => {
      if (!(error instanceof Error) || error.message !== 'rollback') throw error;
    });
  return line;
}

try {
  await broker.declareSink();
  for (const kind of order) {
    await truncate(db);
    const transport = new TimedTransport(broker.transport());
    const bus = benchBus(db, transport, { pollIntervalMs: 600_000 });
    const claims: number[] = [];
    const store = db.outbox as unknown as Record<'claim' | 'completeAndClaim', (...args: unknown[]) => Promise<unknown>>;
    const originals = { claim: store.claim, completeAndClaim: store.completeAndClaim };
    try {
      await warmRelay(db, bus, () => transport.confirmed >= 1);
      await seedBacklog(db, count, { keyless: kind === 'keyless' });
      // Each claim transaction timed as the relay calls it (with the previous batch's completion).
      for (const name of ['claim', 'completeAndClaim'] as const) {
        const original = originals[name];
        store[name] = async (...args: unknown[]) => {
          const started = performance.now();
          try {
            return await original.apply(db.outbox, args);
          } finally {
            claims.push(performance.now() - started);
          }
        };
      }
      const before = await status();
      const started = performance.now();
      let sampling = true;
      let maxHistory = 0;
      const plans: string[] = [];
      const sampler = (async () => {
        const due = [...fractions];
        while (sampling) {
          maxHistory = Math.max(maxHistory, (await status()).get('Innodb_history_list_length') ?? 0);
          while (due.length > 0 && transport.confirmed >= due[0]! * count) {
            const at = due.shift()!;
            plans.push(`  at ${at} confirmed: head scan as written ${await analyzeHeads(` FORCE INDEX (${keyIx})`)}; optimizer's choice ${await analyzeHeads('')}`);
          }
          await new Promise((resolve) => setTimeout(resolve, 250));
        }
      })();
      bus.wake();
      await until(() => transport.confirmed >= count + 1, 3_600_000, `${count} confirms`, 10);
      await until(async () => !(await anyPending(db)), 60_000, 'the last rows to complete', 5);
      const seconds = (performance.now() - started) / 1000;
      sampling = false;
      await sampler;
      const after = await status();
      const load = loadavg().map((value) => value.toFixed(1)).join(' ');
      const deltas = COUNTERS.map((name) => `${name} ${(after.get(name) ?? 0) - (before.get(name) ?? 0)}`).join(', ');
      console.log(`${kind}: ${Math.round(count / seconds)} msg/s (${seconds.toFixed(1)} s), load ${load}; ${deltas}; history length max ${maxHistory}`);
      console.log(`  ${claims.length} claim transactions: p50 ${quantile(claims, 0.5).toFixed(0)} ms, p99 ${quantile(claims, 0.99).toFixed(0)} ms, max ${quantile(claims, 1).toFixed(0)} ms`);
      for (const plan of plans) console.log(plan);
    } finally {
      store.claim = originals.claim;
      store.completeAndClaim = originals.completeAndClaim;
      await bus.stop({ timeoutMs: 10_000 });
      await transport.close();
    }
  }
} finally {
  await broker.close();
  await db.close();
}
