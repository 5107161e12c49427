// Issue 40: where the PostgreSQL backend's CPU per relayed message goes — Courier's claim and
// its completion apart, against the textbook relay's SELECT … FOR UPDATE SKIP LOCKED and its
// UPDATE … SET processed_at (bench/README.md, "Issue 40: the textbook relay"). No broker: each
// phase runs its statements back to back on one connection (one pool client, named prepared
// statements, as @courier/pg runs them), and reads that backend's CPU time from /proc before and
// after. Phases per round: Courier claims until nothing is due (keeping the batches), then the
// completions of those batches; the same with publishedRows 'delete'; the textbook's SELECTs of
// one transaction each, then its UPDATEs (each SELECT and UPDATE pair in one transaction, as the
// textbook relay runs them, the UPDATE timed apart).
//
// `keyless` seeds Courier's backlogs without keys (no head-of-key probe in the claim).
//
//   node --conditions=@courier/source --import tsx experiments/store-backend-cost.ts [rows] [batch] [rounds] [keyless]
import { readFileSync } from 'node:fs';
import type { ClaimedBatch } from '@courier/core';
import { PgOutboxStore } from '@courier/pg';
import pg from 'pg';
import { URLS } from '../src/services.js';
import { openDb, runId, seedBacklog } from '../src/setup.js';
import { TextbookOutbox } from '../src/textbook-relay.js';

const rows = Number(process.argv[2] ?? 20_000);
const batch = Number(process.argv[3] ?? 500);
const rounds = Number(process.argv[4] ?? 3);
const keyless = process.argv[5] === 'keyless';
const ticks = (pid: number): number => {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
};
const us = (seconds: number) => ((seconds * 1e6) / rows).toFixed(1);
const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0]!;

const prefix = `${runId()}_sc`;
const keepDb = await openDb('postgresql', { prefix: `${prefix}_keep`, wakeups: false });
const deleteDb = await openDb('postgresql', { prefix: `${prefix}_del`, wakeups: false, publishedRows: 'delete' });
const textbook = await TextbookOutbox.open(prefix);
const pool = new pg.Pool({ connectionString: URLS.postgresql, max: 1 });
const pid = Number((await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid);
const stores = {
  keep: new PgOutboxStore({ pool, tablePrefix: `${prefix}_keep_`, wakeups: false }),
  delete: new PgOutboxStore({ pool, tablePrefix: `${prefix}_del_`, wakeups: false, publishedRows: 'delete' }),
};
const timed = async (work: () => Promise<void>): Promise<number> => {
  const before = ticks(pid);
  await work();
  return ticks(pid) - before;
};
try {
  console.log(`${rows.toLocaleString('en-US')} rows${keyless ? ' (Courier\'s keyless)' : ''}, batch ${batch}, ${rounds} rounds; backend CPU µs per message`);
  console.log('| round | load | Courier claim | Courier complete | claim, delete mode | complete (DELETE) | textbook SELECT … SKIP LOCKED (+BEGIN/COMMIT) | textbook UPDATE processed_at |');
  console.log('|---|---|---:|---:|---:|---:|---:|---:|');
  for (let round = 0; round <= rounds; round += 1) {
    const cells: string[] = [];
    const at = load();
    for (const [mode, db] of [['keep', keepDb], ['delete', deleteDb]] as const) {
      const store = stores[mode];
      await db.sql(`TRUNCATE ${db.table('outbox')}`);
      await seedBacklog(db, rows, { keyless });
      const batches: ClaimedBatch[] = [];
      const claim = await timed(async () => {
        for (;;) {
          const claimed = await store.claim({ owner: 'cost', limit: batch, leaseMs: 600_000, perKey: 1 });
          if (claimed.records.length === 0) break;
          batches.push(claimed);
        }
      });
      let completed = 0;
      const complete = await timed(async () => {
        for (const claimed of batches) completed += await store.complete(claimed.lease, claimed.records.map((record) => record.sequence));
      });
      if (completed !== rows) throw new Error(`${mode}: completed ${completed} of ${rows}`);
      cells.push(us(claim), us(complete));
    }
    await textbook.seed(rows);
    const client = await pool.connect();
    let select = 0;
    let update = 0;
    try {
      for (;;) {
        const before = ticks(pid);
        await client.query('BEGIN');
        const { rows: got } = await client.query<{ id: string }>({
          name: 'tb_select',
          text: `SELECT id, aggregate_id, event_type, payload, created_at FROM ${textbook.table} WHERE processed_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`,
          values: [batch],
        });
        const mid = ticks(pid);
        select += mid - before;
        if (got.length === 0) {
          await client.query('COMMIT');
          break;
        }
        await client.query({ name: 'tb_update', text: `UPDATE ${textbook.table} SET processed_at = now() WHERE id = ANY($1::bigint[])`, values: [got.map((row) => row.id)] });
        await client.query('COMMIT');
        update += ticks(pid) - mid;
      }
    } finally {
      client.release();
    }
    cells.push(us(select), us(update));
    // Round 0 warms the connection, the plans and the caches; it is not printed.
    if (round > 0) console.log(`| ${round} | ${at}–${load()} | ${cells.join(' | ')} |`);
  }
} finally {
  await pool.end();
  await textbook.close();
  await keepDb.close();
  await deleteDb.close();
}
