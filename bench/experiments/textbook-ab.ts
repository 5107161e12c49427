// Issue 40: Courier's relay against the textbook relay (`../src/textbook-relay.ts`), side by side
// (bench/README.md, "Issue 40: the textbook relay"). Each round drains the same backlog once per
// line, the lines' order reversed every other round, between two raw publish loops. Lines are
// named on the command line:
//   T<batch>            the textbook relay at that batch
//   C<batch>[w<window>][k]  Courier's relay (MikroORM store, the bench's default) at that batch,
//                       RabbitMQ confirm window (default 256), `k` keyless
//   P<batch>[w<window>][k]  the same on @courier/pg (node-postgres, named prepared statements)
//   …h<fillfactor>      (C and P lines) the prototype HOT lease (`./hot-lease-patch.ts`) on a
//                       table with that fill factor; …f<fillfactor> the fill factor alone
// Per line: msg/s, × the textbook line of the round (the first T line), relay CPU µs/msg (this
// process), and the CPU µs/msg of the relay's own PostgreSQL backends (from /proc; the Courier
// lines' backends found by application_name, the textbook's by pg_backend_pid()). At the end,
// each line's table's row updates and how many of them were HOT (pg_stat_user_tables, read after
// the stats flush), per message.
//
// With COURIER_AB_PROFILE=<folder>, each line's drain is also profiled (V8's sampling CPU profiler,
// 200 µs) into <folder>/<line>-r<round>.cpuprofile, for `./profile-summary.ts` (the profiler's own
// cost then shows in the CPU columns: compare those only between runs made alike).
//
//   node --conditions=@courier/source --import tsx experiments/textbook-ab.ts [rows] [rounds] T500 C250 C500 …
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import type { OutboxStore } from '@courier/core';
import { PgOutboxStore } from '@courier/pg';
import pg from 'pg';
import { processCost, rawPublishLoop } from '../src/ceilings.js';
import { relayDrain, truncate } from '../src/scenarios/drain.js';
import { URLS } from '../src/services.js';
import { BenchBroker, openDb, runId, type BenchDb } from '../src/setup.js';
import { TextbookOutbox, textbookRelay } from '../src/textbook-relay.js';
import { hotLease, setFillfactor } from './hot-lease-patch.js';

const rows = Number(process.argv[2] ?? 50_000);
const rounds = Number(process.argv[3] ?? 3);
const specs = process.argv.slice(4);
if (!Number.isSafeInteger(rows) || rows <= 0 || !Number.isSafeInteger(rounds) || rounds <= 0 || specs.length === 0) {
  throw new Error('usage: textbook-ab.ts <rows> <rounds> <line>… (lines: T500, C250, C500w1024k, P500 …)');
}

interface Line {
  readonly spec: string;
  readonly kind: 'T' | 'C' | 'P';
  readonly batch: number;
  readonly window: number | undefined;
  readonly keyless: boolean;
  /** `h`: the HOT lease prototype; `f`: the fill factor alone. */
  readonly table: { readonly kind: 'h' | 'f'; readonly fillfactor: number } | undefined;
}

const lines: Line[] = specs.map((spec) => {
  const match = /^([TCP])(\d+)(?:w(\d+))?(k?)(?:([hf])(\d+))?$/.exec(spec);
  if (!match) throw new Error(`line '${spec}' is not T<batch>, C<batch>[w<window>][k][h|f<fillfactor>] or P<batch>[w<window>][k][h|f<fillfactor>]`);
  const kind = match[1] as Line['kind'];
  if (kind === 'T' && (match[3] !== undefined || match[4] === 'k' || match[5] !== undefined)) throw new Error(`line '${spec}': the textbook relay has no window, keyless or table form`);
  const table = match[5] === undefined ? undefined : { kind: match[5] as 'h' | 'f', fillfactor: Number(match[6]) };
  return { spec, kind, batch: Number(match[2]), window: match[3] === undefined ? undefined : Number(match[3]), keyless: match[4] === 'k', table };
});

const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0]!;
const ticks = (pid: number): number => {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
};

/** CPU seconds by pid of the backends named `name`. */
async function backends(db: BenchDb, name: string): Promise<Map<number, number>> {
  const found = new Map<number, number>();
  for (const row of await db.sql('SELECT pid FROM pg_stat_activity WHERE application_name = ?', [name])) found.set(Number(row['pid']), ticks(Number(row['pid'])));
  return found;
}

const prefix = `${runId()}_tb`;
const broker = new BenchBroker(prefix);
// One set of Courier tables per Courier line (their HOT counts stay apart); one narrow table.
const dbs = new Map<string, BenchDb>();
const pools = new Map<string, pg.Pool>();
const name = (line: Line) => `${prefix}_${line.spec.toLowerCase()}`;
let textbook: TextbookOutbox | undefined;

interface Result {
  rate: number;
  relayUs: number;
  backendUs: number;
}

const profileDir = process.env['COURIER_AB_PROFILE'];
if (profileDir) mkdirSync(profileDir, { recursive: true });

/** `run(line)`, under V8's CPU profiler when COURIER_AB_PROFILE names a folder. */
async function profiled(line: Line, round: number): Promise<Result> {
  if (!profileDir) return run(line);
  const session = new Session();
  session.connect();
  try {
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 200 });
    await session.post('Profiler.start');
    const result = await run(line);
    const { profile } = await session.post('Profiler.stop');
    writeFileSync(`${profileDir}/${line.spec}-r${round}.cpuprofile`, JSON.stringify(profile));
    return result;
  } finally {
    session.disconnect();
  }
}

async function run(line: Line): Promise<Result> {
  if (line.kind === 'T') {
    await textbook!.seed(rows);
    let backendSeconds = Number.NaN;
    const cost = await processCost(() => textbookRelay(textbook!, broker, line.batch, (pid) => void (backendSeconds = ticks(pid))));
    return { rate: cost.result, relayUs: (cost.cpuSeconds * 1e6) / rows, backendUs: (backendSeconds * 1e6) / rows };
  }
  const db = dbs.get(line.spec)!;
  const app = name(line);
  let before = new Map<number, number>();
  let backendSeconds = 0;
  const span = {
    async start() {
      before = await backends(db, app);
    },
    async end() {
      for (const [pid, seconds] of await backends(db, app)) backendSeconds += seconds - (before.get(pid) ?? 0);
    },
  };
  const pool = pools.get(line.spec);
  const outbox = pool === undefined ? {} : { outbox: new PgOutboxStore({ pool, tablePrefix: `${app}_`, wakeups: false }) as OutboxStore<unknown> };
  const drained = await relayDrain(db, broker, rows, { keyless: line.keyless, batchSize: line.batch, ...(line.window === undefined ? {} : { confirmWindow: line.window }), span, ...outbox });
  await truncate(db);
  return { rate: drained.rate, relayUs: (drained.cpuSeconds * 1e6) / rows, backendUs: (backendSeconds * 1e6) / rows };
}

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

try {
  await broker.declareSink();
  for (const line of lines) {
    if (line.kind === 'T') {
      textbook ??= await TextbookOutbox.open(prefix);
      continue;
    }
    const app = name(line);
    const db = await openDb('postgresql', { prefix: app, wakeups: false, applicationName: app });
    dbs.set(line.spec, db);
    if (line.table?.kind === 'h') await hotLease(db.table('outbox'), line.table.fillfactor);
    if (line.table?.kind === 'f') await setFillfactor(db.table('outbox'), line.table.fillfactor);
    if (line.kind === 'P') pools.set(line.spec, new pg.Pool({ connectionString: URLS.postgresql, max: 4, application_name: app }));
  }
  await rawPublishLoop(broker, 2_000);
  for (const line of lines) if (line.kind !== 'T') await relayDrain(dbs.get(line.spec)!, broker, 2_000, { batchSize: line.batch }).then(() => truncate(dbs.get(line.spec)!));
  console.log(`${rows.toLocaleString('en-US')} rows, ${rounds} rounds, lines ${specs.join(' ')}`);
  console.log('| round | load | line | msg/s | × first T | relay CPU µs/msg | relay backends µs/msg |');
  console.log('|---|---|---|---:|---:|---:|---:|');
  const all = new Map<string, Result[]>(lines.map((line) => [line.spec, []]));
  const ratios = new Map<string, number[]>(lines.map((line) => [line.spec, []]));
  const reference = lines.find((line) => line.kind === 'T')?.spec;
  for (let round = 1; round <= rounds; round += 1) {
    const order = round % 2 === 1 ? lines : [...lines].reverse();
    const at = load();
    const rawBefore = await rawPublishLoop(broker, Math.min(rows, 20_000));
    const results = new Map<string, Result>();
    for (const line of order) results.set(line.spec, await profiled(line, round));
    const rawAfter = await rawPublishLoop(broker, Math.min(rows, 20_000));
    const base = reference === undefined ? undefined : results.get(reference)!.rate;
    for (const line of lines) {
      const r = results.get(line.spec)!;
      all.get(line.spec)!.push(r);
      const ratio = base === undefined ? Number.NaN : r.rate / base;
      ratios.get(line.spec)!.push(ratio);
      console.log(`| ${round} | ${at}–${load()} | ${line.spec} | ${r.rate.toFixed(0)} | ${ratio.toFixed(3)} | ${r.relayUs.toFixed(1)} | ${r.backendUs.toFixed(1)} |`);
    }
    console.log(`| ${round} | | raw publish loop before / after | ${rawBefore.toFixed(0)} / ${rawAfter.toFixed(0)} | | | |`);
  }
  console.log('\nmedians');
  console.log('| line | msg/s | × first T (median of the rounds\' ratios) | relay CPU µs/msg | relay backends µs/msg |');
  console.log('|---|---:|---:|---:|---:|');
  for (const line of lines) {
    const r = all.get(line.spec)!;
    console.log(
      `| ${line.spec} | ${median(r.map((x) => x.rate)).toFixed(0)} | ${median(ratios.get(line.spec)!).toFixed(3)} | ${median(r.map((x) => x.relayUs)).toFixed(1)} | ${median(r.map((x) => x.backendUs)).toFixed(1)} |`,
    );
  }
  // The tables' update counters: a backend flushes them at most once a second and when idle for 10 s.
  await new Promise((resolve) => setTimeout(resolve, 11_000));
  console.log('\nrow updates per message (pg_stat_user_tables; warm-ups included)');
  for (const line of lines) {
    const db = line.kind === 'T' ? undefined : dbs.get(line.spec)!;
    const table = line.kind === 'T' ? textbook!.table : db!.table('outbox');
    const client = new pg.Client({ connectionString: URLS.postgresql });
    await client.connect();
    try {
      const { rows: stats } = await client.query<{ n_tup_upd: string; n_tup_hot_upd: string; n_tup_del: string }>(
        `SELECT n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables WHERE relid = '${table}'::regclass`,
      );
      const stat = stats[0]!;
      const messages = rows * rounds + (line.kind === 'T' ? 0 : 2_001);
      console.log(`${line.spec}: ${(Number(stat.n_tup_upd) / messages).toFixed(2)} updates/msg, of which HOT ${(Number(stat.n_tup_hot_upd) / messages).toFixed(2)}; deletes ${(Number(stat.n_tup_del) / messages).toFixed(2)}`);
    } finally {
      await client.end();
    }
  }
} finally {
  await textbook?.close();
  for (const pool of pools.values()) await pool.end();
  for (const db of dbs.values()) await db.close();
  await broker.close();
}
