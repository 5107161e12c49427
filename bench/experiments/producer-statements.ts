// Scenario 1's outbox INSERTs on the server side: each statement shape Courier or the
// hand-written line sends, run on one raw node-postgres connection (the text as MikroORM
// sends it: values inlined, simple query protocol), in transactions of BEGIN, the order
// INSERT, the outbox statement(s), COMMIT. Per shape: the outbox statements' round trip
// (client side) and the server backend's CPU per transaction (from /proc/<pid>/schedstat,
// so it must run on the database's machine), as p10 / p25 / p50 over every transaction.
// Shapes alternate in blocks (A, B, C, C, B, A…), so a change of machine load hits them alike.
//
//   node --conditions=@courier/source --import tsx experiments/producer-statements.ts [tx per block] [rounds] [shapes]
//   (shapes: a comma list of the keys of `shapes` below; default hand,keyless,keyed,before,separate)
import { randomInt, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { URLS } from '../src/services.js';
import { OUTBOX_COLUMNS, openDb, runId } from '../src/setup.js';

const count = Number(process.argv[2] ?? 1000);
const rounds = Number(process.argv[3] ?? 5);

const db = await openDb('postgresql', { prefix: `bench_${runId()}_stmt`, poolMax: 2, wakeups: false });
const outbox = db.table('outbox');
const orders = db.table('orders');
const lockNamespace = 1990084802;
let serial = 0;

function values(key: string | null, now: string): string {
  const id = randomUUID();
  const keyCols = key === null ? 'NULL, NULL' : `'${key}', '${randomUUID().replaceAll('-', '')}'`;
  return `('${id}', 'bench.OrderPlaced', 1, 'bench', ${keyCols}, '${new Date().toISOString()}', '${id}', NULL, NULL, NULL, '{}', '{"orderId":"${key}","customerId":"c-1","totalCents":12345,"currency":"EUR"}', 'pending', 0, ${now}, ${now})`;
}
const sortedLocks = (k: number) => `(SELECT count(pg_advisory_xact_lock(${lockNamespace}, k)) FROM (SELECT unnest(ARRAY[${k}]::int4[]) AS k ORDER BY 1) AS s) >= 0`;
const oneLock = (k: number) => `(SELECT count(pg_advisory_xact_lock(${lockNamespace}, ${k}))) >= 0`;

/** The outbox statements of one transaction, per shape. */
const shapes: Record<string, (key: string) => string[]> = {
  // The hand-written line of scenario 1.
  hand: (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) VALUES ${values(key, 'now()')}`],
  // Courier, keyless: plain VALUES, clock_timestamp().
  keyless: () => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) VALUES ${values(null, 'clock_timestamp()')}`],
  // Courier, keyed (session prod3): a SELECT of the row, the one lock as an InitPlan.
  keyed: (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) SELECT ${values(key, 'clock_timestamp()').slice(1, -1)} WHERE ${oneLock(randomInt(2 ** 31))}`],
  // Courier, keyed, before session prod3 (still the form for several rows or keys): a
  // VALUES list in FROM, the locks as an unnest/sort InitPlan.
  before: (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) SELECT * FROM (VALUES ${values(key, 'clock_timestamp()')}) AS v WHERE ${sortedLocks(randomInt(2 ** 31))}`],
  // The parts of `before`: the VALUES list in FROM without a lock, and with the one-key lock.
  'from-values': (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) SELECT * FROM (VALUES ${values(key, 'clock_timestamp()')}) AS v`],
  'from-values-one-lock': (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) SELECT * FROM (VALUES ${values(key, 'clock_timestamp()')}) AS v WHERE ${oneLock(randomInt(2 ** 31))}`],
  // The part of `keyed`: a SELECT of the row without a lock.
  'select-row': (key) => [`INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) SELECT ${values(key, 'clock_timestamp()').slice(1, -1)}`],
  // The lock in a statement of its own before a VALUES insert (before session prod).
  separate: (key) => [`SELECT pg_advisory_xact_lock(${lockNamespace}, ${randomInt(2 ** 31)})`, `INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) VALUES ${values(key, 'clock_timestamp()')}`],
  // A trivial statement of its own before a VALUES insert: what `separate` pays beside its lock.
  trivial: (key) => ['SELECT 1', `INSERT INTO ${outbox} (${OUTBOX_COLUMNS}) VALUES ${values(key, 'clock_timestamp()')}`],
};
const selected = (process.argv[4] ?? 'hand,keyless,keyed,before,separate').split(',');

const client = new pg.Client({ connectionString: URLS.postgresql });
await client.connect();
const pid = ((await client.query('SELECT pg_backend_pid() AS pid')).rows[0] as { pid: number }).pid;
const backendNs = () => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);

/** One transaction; returns [the outbox statements' round trip, the backend's CPU for the whole transaction], in µs. */
async function tx(shape: string): Promise<[number, number]> {
  const key = `o-${(serial += 1)}`;
  const cpuBefore = backendNs();
  await client.query('BEGIN');
  await client.query(`INSERT INTO ${orders} (id, customer_id, total_cents, created_at) VALUES ('${key}', 'c-1', 12345, now())`);
  let elapsed = 0;
  for (const sql of shapes[shape]!(key)) {
    const started = performance.now();
    await client.query(sql);
    elapsed += performance.now() - started;
  }
  await client.query('COMMIT');
  return [elapsed * 1000, (backendNs() - cpuBefore) / 1000];
}

try {
  for (const shape of selected) for (let i = 0; i < 100; i += 1) await tx(shape);
  const cpu = new Map<string, number[]>();
  const rtt = new Map<string, number[]>();
  for (let round = 0; round < rounds; round += 1) {
    for (const shape of round % 2 === 0 ? selected : [...selected].reverse()) {
      for (let i = 0; i < count; i += 1) {
        const [elapsed, used] = await tx(shape);
        (rtt.get(shape) ?? rtt.set(shape, []).get(shape)!).push(elapsed);
        (cpu.get(shape) ?? cpu.set(shape, []).get(shape)!).push(used);
      }
    }
  }
  // Quantiles over every transaction of a shape: the low ones are what load inflates least.
  const quantiles = (list: number[]) => {
    const sorted = [...list].sort((a, b) => a - b);
    return [0.1, 0.25, 0.5].map((q) => sorted[Math.floor(sorted.length * q)]!.toFixed(0)).join(' / ');
  };
  console.log(`per transaction, p10 / p25 / p50 over ${rounds} alternated blocks of ${count}:`);
  for (const shape of selected) {
    console.log(`${shape.padEnd(9)} backend CPU ${quantiles(cpu.get(shape)!)} µs, outbox statement(s) round trip ${quantiles(rtt.get(shape)!)} µs`);
  }
} finally {
  await client.end();
  await db.close();
}
