// Issue 40, the "HOT lease" measured before it is built (bench/README.md, "The HOT lease,
// measured first"): the PostgreSQL backend's cost per message of Courier's claim and
// completion with today's lease (`available_at` moved to the lease's end) against the lease in
// columns no index reads (`./hot-lease-patch.ts`), at several fill factors. No broker: one
// connection (`@courier/pg`'s named prepared statements), the relay's pipelining imitated —
// claims run back to back and a batch is completed once `window` batches are in flight (the
// relay's 4 loops hold about 4), so the HOT lease's claims walk the in-flight rows at the front
// of `due_ix` as they would in a relay. Per variant and round: backend CPU µs/msg of the claims
// and of the completions (`/proc/<pid>/schedstat`, ns), WAL bytes/msg of each
// (`pg_current_wal_insert_lsn()` around each statement; the server's other sessions write
// into the same WAL, which an idle check showed at 0 B/s), row updates and HOT updates per
// message (`pg_stat_user_tables`, flushed by the backend), the heap's size after the seed.
// `T`: the textbook relay's SELECT … SKIP LOCKED and UPDATE on its narrow table (one batch at a
// time, as it runs).
//
//   node --conditions=@courier/source --import tsx experiments/hot-lease-cost.ts <rows> <batch> <rounds> <window> [keyless] <variant>…
//   variants: B<fillfactor> the engine's lease (schema 6: available_at; since 7: leased_until) at that
//   fill factor, H<fillfactor> the prototype HOT lease (schema 6 only), T the textbook relay
import { readFileSync } from 'node:fs';
import type { ClaimedBatch } from '@courier/core';
import { PgOutboxStore } from '@courier/pg';
import pg from 'pg';
import { URLS } from '../src/services.js';
import { openDb, runId, seedBacklog, type BenchDb } from '../src/setup.js';
import { TextbookOutbox } from '../src/textbook-relay.js';
import { hotLease, setFillfactor } from './hot-lease-patch.js';

const rows = Number(process.argv[2] ?? 20_000);
const batch = Number(process.argv[3] ?? 500);
const rounds = Number(process.argv[4] ?? 3);
const window = Number(process.argv[5] ?? 4);
const rest = process.argv.slice(6);
const keyless = rest[0] === 'keyless';
const specs = keyless ? rest.slice(1) : rest;
if (![rows, batch, rounds, window].every((n) => Number.isSafeInteger(n) && n > 0) || specs.length === 0) {
  throw new Error('usage: hot-lease-cost.ts <rows> <batch> <rounds> <window> [keyless] <B100|H80|T…>');
}
for (const spec of specs) if (!/^(?:[BH]\d+|T)$/.test(spec)) throw new Error(`variant '${spec}' is not B<fillfactor>, H<fillfactor> or T`);

const cpuNs = (pid: number): bigint => BigInt(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]!);
const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0]!;
const perMsg = (total: bigint | number) => (Number(total) / rows).toFixed(1);

const prefix = `${runId()}_hl`;
const pool = new pg.Pool({ connectionString: URLS.postgresql, max: 1 });
const pid = Number((await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid);
const lsn = async (): Promise<bigint> => {
  const { rows: got } = await pool.query<{ at: string }>("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS at");
  return BigInt(got[0]!.at);
};
/** The table's update counters, after this backend flushed its pending statistics. */
const counters = async (table: string): Promise<{ upd: number; hot: number }> => {
  await pool.query('SELECT pg_stat_force_next_flush()');
  await pool.query('SELECT pg_stat_clear_snapshot()');
  const { rows: got } = await pool.query<{ upd: string; hot: string }>(`SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables WHERE relid = '${table}'::regclass`);
  return { upd: Number(got[0]!.upd), hot: Number(got[0]!.hot) };
};

interface Variant {
  readonly spec: string;
  readonly db: BenchDb;
  readonly store: PgOutboxStore;
  readonly table: string;
}
const variants: Variant[] = [];
let textbook: TextbookOutbox | undefined;

async function courierRound(variant: Variant): Promise<string[]> {
  const { db, store, table } = variant;
  await db.sql(`TRUNCATE ${table}`);
  await seedBacklog(db, rows, { keyless });
  const heapMb = Number((await pool.query<{ size: string }>(`SELECT pg_relation_size('${table}') AS size`)).rows[0]!.size) / 1024 / 1024;
  const before = await counters(table);
  const options = { owner: 'cost', limit: batch, leaseMs: 600_000, perKey: 1 };
  const inFlight: ClaimedBatch[] = [];
  let claimCpu = 0n;
  let completeCpu = 0n;
  let claimWal = 0n;
  let completeWal = 0n;
  let completed = 0;
  const complete = async (claimed: ClaimedBatch) => {
    const wal = await lsn();
    const cpu = cpuNs(pid);
    completed += await store.complete(claimed.lease, claimed.records.map((record) => record.sequence));
    completeCpu += cpuNs(pid) - cpu;
    completeWal += (await lsn()) - wal;
  };
  for (;;) {
    const wal = await lsn();
    const cpu = cpuNs(pid);
    const claimed = await store.claim(options);
    claimCpu += cpuNs(pid) - cpu;
    claimWal += (await lsn()) - wal;
    if (claimed.records.length === 0) break;
    inFlight.push(claimed);
    if (inFlight.length >= window) await complete(inFlight.shift()!);
  }
  while (inFlight.length > 0) await complete(inFlight.shift()!);
  if (completed !== rows) throw new Error(`${variant.spec}: completed ${completed} of ${rows}`);
  const after = await counters(table);
  return [
    perMsg(claimCpu / 1000n),
    perMsg(completeCpu / 1000n),
    perMsg(claimWal),
    perMsg(completeWal),
    ((after.upd - before.upd) / rows).toFixed(2),
    ((after.hot - before.hot) / rows).toFixed(2),
    heapMb.toFixed(1),
  ];
}

async function textbookRound(): Promise<string[]> {
  await textbook!.seed(rows);
  const client = await pool.connect();
  let select = 0n;
  let update = 0n;
  let selectWal = 0n;
  let updateWal = 0n;
  try {
    for (;;) {
      const wal0 = BigInt((await client.query<{ at: string }>("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS at")).rows[0]!.at);
      const before = cpuNs(pid);
      await client.query('BEGIN');
      const { rows: got } = await client.query<{ id: string }>({
        name: 'tb_select',
        text: `SELECT id, aggregate_id, event_type, payload, created_at FROM ${textbook!.table} WHERE processed_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`,
        values: [batch],
      });
      const mid = cpuNs(pid);
      select += mid - before;
      const wal1 = BigInt((await client.query<{ at: string }>("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS at")).rows[0]!.at);
      selectWal += wal1 - wal0;
      if (got.length === 0) {
        await client.query('COMMIT');
        break;
      }
      const start = cpuNs(pid);
      await client.query({ name: 'tb_update', text: `UPDATE ${textbook!.table} SET processed_at = now() WHERE id = ANY($1::bigint[])`, values: [got.map((row) => row.id)] });
      await client.query('COMMIT');
      update += cpuNs(pid) - start;
      updateWal += BigInt((await client.query<{ at: string }>("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS at")).rows[0]!.at) - wal1;
    }
  } finally {
    client.release();
  }
  return [perMsg(select / 1000n), perMsg(update / 1000n), perMsg(selectWal), perMsg(updateWal), '1.00', '—', '—'];
}

try {
  for (const spec of specs) {
    if (spec === 'T') {
      textbook = await TextbookOutbox.open(prefix);
      continue;
    }
    const name = `${prefix}_${spec.toLowerCase()}`;
    const db = await openDb('postgresql', { prefix: name, wakeups: false });
    const table = db.table('outbox');
    const fillfactor = Number(spec.slice(1));
    if (spec.startsWith('H')) await hotLease(table, fillfactor);
    else await setFillfactor(table, fillfactor);
    variants.push({ spec, db, table, store: new PgOutboxStore({ pool, tablePrefix: `${name}_`, wakeups: false }) });
  }
  console.log(`${rows.toLocaleString('en-US')} rows${keyless ? ' (keyless)' : ''}, batch ${batch}, ${window} batches in flight, ${rounds} rounds (+1 warm-up); per message`);
  console.log('| round | load | variant | claim CPU µs | complete CPU µs | claim WAL B | complete WAL B | updates | of them HOT | heap MB after seed |');
  console.log('|---|---|---|---:|---:|---:|---:|---:|---:|---:|');
  for (let round = 0; round <= rounds; round += 1) {
    const order = round % 2 === 1 ? specs : [...specs].reverse();
    for (const spec of order) {
      const at = load();
      const cells = spec === 'T' ? await textbookRound() : await courierRound(variants.find((variant) => variant.spec === spec)!);
      // Round 0 warms the connection, the plans and the caches; it is not printed.
      if (round > 0) console.log(`| ${round} | ${at}–${load()} | ${spec} | ${cells.join(' | ')} |`);
    }
  }
} finally {
  await pool.end();
  await textbook?.close();
  for (const variant of variants) await variant.db.close();
}
