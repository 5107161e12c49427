// Producer commits per second on PostgreSQL with and without the wake-up scheme, and
// relay claim throughput. Run from plugins/mikro-orm:
//
//   pnpm bench            (node --conditions=@courier/source --import tsx bench/producer-commits.ts)
//
// Settings (environment): COURIER_PG_URL, BENCH_SECONDS (per measurement, default 5),
// BENCH_WRITERS (comma list, default "1,8"). Each unit of work is what an application
// does: persist one entity and publish one message in em.transactional(). Modes:
//   off        wake-ups off (no NOTIFY, no LISTEN): the baseline;
//   courier    the store's scheme: in-process signal after commit, NOTIFY after commit
//              coalesced to at most one per 50 ms per process, a relay LISTENing;
//   naive      a NOTIFY inside every producer transaction (what the scheme avoids), with
//              wake-ups otherwise off.
//   entity     the same unit of work without the outbox row (what the append costs).
// Bounded: every loop stops after BENCH_SECONDS; tables are dropped at the end.
import { uniqueId } from '@courier/conformance';
import { resolveTableNames } from '../src/index.js';
import { createMikroOrmFixture, type MikroOrmFixture } from '../test/support/fixture.js';
import { envelope } from '../test/support/helpers.js';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 5);
const WRITERS = (process.env['BENCH_WRITERS'] ?? '1,8').split(',').map(Number);
// Modes run interleaved, ROUNDS times each; the median is reported (other work on a
// small machine makes single runs noisy).
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);

type Mode = 'entity' | 'off' | 'courier' | 'naive';

async function measure(mode: Mode, writers: number): Promise<number> {
  const id = uniqueId();
  const producer = await createMikroOrmFixture('postgresql', { testId: id }, { outbox: { wakeups: mode === 'courier' ? {} : false }, orm: { pool: { min: writers, max: writers + 2 } } });
  let relay: MikroOrmFixture | undefined;
  let stopWatching: (() => Promise<void>) | undefined;
  let wakeups = 0;
  if (mode === 'courier' || mode === 'naive') {
    // A relay in "another process" (its own ORM and connection) listening on the channel.
    relay = await createMikroOrmFixture('postgresql', { testId: id });
    stopWatching = await relay.outbox.watch(() => {
      wakeups += 1;
    });
  }
  const channel = resolveTableNames({ tablePrefix: producer.tablePrefix }).channel;
  let commits = 0;
  let running = true;
  const writer = async (index: number): Promise<void> => {
    let round = 0;
    while (running) {
      round += 1;
      // One unit of work as an application writes it: an entity and a message, one commit.
      await producer.orm.em.fork().transactional(async (tx) => {
        tx.persist(tx.create(producer.Effect, { effectId: `w${index}-${round}` }));
        if (mode !== 'entity') producer.outbox.append(tx, [{ envelope: envelope('bench', `order-${index}-${round % 100}`, { payload: '{"orderId":"o-1","total":12.5}' }) }]);
        if (mode === 'naive') await tx.getConnection().execute(`SELECT pg_notify(?, '')`, [channel], 'all', tx.getTransactionContext());
      });
      commits += 1;
    }
  };
  // Warm-up, then measure.
  const warm = Array.from({ length: writers }, (_, index) => writer(index));
  await new Promise((resolve) => setTimeout(resolve, 1_000));
  const before = commits;
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, SECONDS * 1_000));
  const measured = commits - before;
  const elapsed = (performance.now() - started) / 1_000;
  running = false;
  await Promise.all(warm);
  await stopWatching?.();
  console.log(`  ${mode.padEnd(8)} writers=${String(writers).padStart(2)}  ${(measured / elapsed).toFixed(0).padStart(6)} commits/s${relay ? `  (relay woken ${wakeups} times)` : ''}`);
  await drop(producer);
  await relay?.close();
  await producer.close();
  return measured / elapsed;
}

async function claimThroughput(rows: number, batch: number): Promise<void> {
  const fixture = await createMikroOrmFixture('postgresql', { testId: uniqueId() });
  await fixture.sql(
    `INSERT INTO ${fixture.table('outbox')} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at) ` +
      `SELECT 'b-' || i, 'bench.T', 1, 'bench', 'k' || i, md5('k' || i), '2024-01-01T00:00:00.000Z', 'b-' || i, '{}', '{}', 'pending', now(), 0, now() FROM generate_series(1, ${rows}) AS i`,
  );
  await fixture.sql(`ANALYZE ${fixture.table('outbox')}`);
  const started = performance.now();
  let done = 0;
  for (;;) {
    const claimed = await fixture.outbox.claim({ owner: 'bench', limit: batch, leaseMs: 60_000, perKey: 1 });
    if (claimed.records.length === 0) break;
    done += await fixture.outbox.complete(claimed.lease, claimed.records.map((record) => record.sequence));
  }
  const elapsed = (performance.now() - started) / 1_000;
  console.log(`  claim+complete batch=${String(batch).padStart(3)}  ${(done / elapsed).toFixed(0).padStart(6)} rows/s (${done} rows, one relay)`);
  await drop(fixture);
  await fixture.close();
}

async function drop(fixture: MikroOrmFixture): Promise<void> {
  for (const name of ['outbox', 'inbox', 'inbox_starts', 'meta', 'effects']) await fixture.sql(`DROP TABLE IF EXISTS ${fixture.table(name)}`);
  await fixture.sql(`DROP SEQUENCE IF EXISTS ${fixture.table('outbox_token_seq')}`);
}

console.log(`producer commits/s on PostgreSQL (entity + outbox row per em.transactional(), ${SECONDS} s per run, ${process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test'})`);
const results: Record<string, number> = {};
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
for (const writers of WRITERS) {
  const runs: Record<Mode, number[]> = { entity: [], off: [], courier: [], naive: [] };
  for (let round = 0; round < ROUNDS; round += 1) {
    for (const mode of ['entity', 'off', 'courier', 'naive'] as const) runs[mode].push(await measure(mode, writers));
  }
  for (const mode of ['entity', 'off', 'courier', 'naive'] as const) results[`${mode}/${writers}`] = median(runs[mode]);
}
console.log(`medians of ${ROUNDS} interleaved runs:`);
for (const writers of WRITERS) {
  const base = results[`off/${writers}`]!;
  const pct = (mode: Mode) => (((results[`${mode}/${writers}`]! - base) / base) * 100).toFixed(1);
  console.log(
    `  writers=${writers}: entity only ${results[`entity/${writers}`]!.toFixed(0)}, off ${base.toFixed(0)}, courier ${results[`courier/${writers}`]!.toFixed(0)} (${pct('courier')}%), ` +
      `NOTIFY per commit ${results[`naive/${writers}`]!.toFixed(0)} (${pct('naive')}%) commits/s`,
  );
}
console.log('relay claim throughput on PostgreSQL (distinct keys, FOR UPDATE SKIP LOCKED)');
await claimThroughput(20_000, 100);
await claimThroughput(2_000, 1);
