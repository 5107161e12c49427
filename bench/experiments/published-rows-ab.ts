// `publishedRows: 'keep'` against `'delete'` side by side (bench/README.md, "Deleting published
// rows at completion"): the relay drain of scenario 2 / 8 (distinct keys, then keyless) and the
// store's completeAndClaim loop (2d), both modes in every round, their order alternated round
// by round, each drain between two raw publish loops of its round. Per drain it prints msg/s,
// the ratio to the round's raw loop, this process's CPU per message (the relay), and the
// database server's CPU per message: all server processes (autovacuum, WAL writer and anything
// else running on the machine included) and, on PostgreSQL, the relay's own backends (found by
// application_name). Also the 1-minute load average at each round.
//
//   node --conditions=@courier/source --import tsx experiments/published-rows-ab.ts <postgresql|mariadb> [rows] [rounds]
import { readFileSync } from 'node:fs';
import { DEFAULT_RELAY_BATCH_SIZE } from '@courier/core';
import { processCost, rawPublishLoop } from '../src/ceilings.js';
import { relayDrain, storeCombinedLoop, truncate } from '../src/scenarios/drain.js';
import { serverCpu } from './server-cpu.js';
import { BenchBroker, openDb, runId, seedBacklog, type BenchDb, type Dialect } from '../src/setup.js';

const dialect: Dialect = process.argv[2] === 'mariadb' ? 'mariadb' : 'postgresql';
const rows = Number(process.argv[3] ?? 100_000);
const rounds = Number(process.argv[4] ?? 3);
const MODES = ['keep', 'delete'] as const;
type Mode = (typeof MODES)[number];

const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ')[0]!;
const serverName = dialect === 'postgresql' ? 'postgres' : 'mariadbd';

/** CPU seconds of the backends whose application_name is `name` (PostgreSQL), by pid, from /proc. */
async function backendCpu(db: BenchDb, name: string): Promise<Map<number, number>> {
  const ticks = new Map<number, number>();
  if (db.dialect !== 'postgresql') return ticks;
  for (const row of await db.sql('SELECT pid FROM pg_stat_activity WHERE application_name = ?', [name])) {
    const pid = Number(row['pid']);
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      ticks.set(pid, (Number(fields[11]) + Number(fields[12])) / 100);
    } catch {
      // Ended meanwhile.
    }
  }
  return ticks;
}

/** What one measured span cost: the server's CPU and the relay's own backends' (PostgreSQL), per message. */
interface ServerCost {
  serverUs: number;
  backendsUs: number;
}

/** A span whose server costs land in `into` (see relayDrain's `span`). */
function serverSpan(db: BenchDb, name: string, into: ServerCost): { start(): Promise<void>; end(): Promise<void> } {
  let serverBefore = 0;
  let backendsBefore = new Map<number, number>();
  return {
    async start() {
      backendsBefore = await backendCpu(db, name);
      serverBefore = serverCpu().get(serverName) ?? 0;
    },
    async end() {
      const serverAfter = serverCpu().get(serverName) ?? 0;
      const backendsAfter = await backendCpu(db, name);
      let backends = 0;
      // A backend that started during the span counts from zero; one that ended is lost (the pool keeps them open).
      for (const [pid, seconds] of backendsAfter) backends += seconds - (backendsBefore.get(pid) ?? 0);
      into.serverUs = ((serverAfter - serverBefore) * 1e6) / rows;
      into.backendsUs = db.dialect === 'postgresql' ? (backends * 1e6) / rows : Number.NaN;
    },
  };
}

interface Result extends ServerCost {
  rate: number;
  relayUs: number;
}

async function drain(db: BenchDb, name: string, keyless: boolean): Promise<Result> {
  const server: ServerCost = { serverUs: Number.NaN, backendsUs: Number.NaN };
  const run = await relayDrain(db, broker, rows, { keyless, span: serverSpan(db, name, server) });
  return { rate: run.rate, relayUs: (run.cpuSeconds * 1e6) / rows, ...server };
}

async function store(db: BenchDb, name: string): Promise<Result> {
  await seedBacklog(db, rows);
  const server: ServerCost = { serverUs: Number.NaN, backendsUs: Number.NaN };
  const span = serverSpan(db, name, server);
  await span.start();
  const cost = await processCost(async () => ({ rate: await storeCombinedLoop(db) }));
  await span.end();
  return { rate: cost.result.rate, relayUs: (cost.cpuSeconds * 1e6) / rows, ...server };
}

const prefix = `${runId()}_ab`;
const names: Record<Mode, string> = { keep: `${prefix}_keep`, delete: `${prefix}_delete` };
const dbs = {
  keep: await openDb(dialect, { prefix: names.keep, wakeups: false, publishedRows: 'keep', applicationName: names.keep }),
  delete: await openDb(dialect, { prefix: names.delete, wakeups: false, publishedRows: 'delete', applicationName: names.delete }),
};
const broker = new BenchBroker(prefix);
const print = (line: string) => console.log(line);
try {
  await broker.declareSink();
  await rawPublishLoop(broker, 2_000);
  for (const mode of MODES) {
    // Warm-up: code paths, connections, JIT.
    await relayDrain(dbs[mode], broker, 2_000);
    await truncate(dbs[mode]);
  }
  print(`${dialect}, ${rows.toLocaleString('en-US')} rows, ${rounds} rounds, batch ${DEFAULT_RELAY_BATCH_SIZE}`);
  print('| round | load | mode | what | msg/s | × raw | relay CPU µs/msg | server CPU µs/msg (all) | relay backends µs/msg |');
  print('|---|---|---|---|---:|---:|---:|---:|---:|');
  for (let round = 1; round <= rounds; round += 1) {
    const order: readonly Mode[] = round % 2 === 1 ? MODES : [...MODES].reverse();
    const rawBefore = await rawPublishLoop(broker, rows);
    const results: { mode: Mode; what: string; r: Result }[] = [];
    const atStart = load();
    for (const mode of order) {
      const db = dbs[mode];
      for (const keyless of [false, true]) {
        results.push({ mode, what: keyless ? 'relay drain, keyless' : 'relay drain, distinct keys', r: await drain(db, names[mode], keyless) });
        await truncate(db);
      }
      results.push({ mode, what: 'store completeAndClaim loop', r: await store(db, names[mode]) });
      await truncate(db);
    }
    const rawAfter = await rawPublishLoop(broker, rows);
    const raw = (rawBefore + rawAfter) / 2;
    for (const { mode, what, r } of results) {
      const ratio = what.startsWith('relay') ? (r.rate / raw).toFixed(3) : '';
      print(
        `| ${round} | ${atStart}–${load()} | ${mode} | ${what} | ${r.rate.toFixed(0)} | ${ratio} | ${r.relayUs.toFixed(1)} | ${r.serverUs.toFixed(1)} | ${Number.isNaN(r.backendsUs) ? '—' : r.backendsUs.toFixed(1)} |`,
      );
    }
    print(`| ${round} | | | raw publish loop (before / after) | ${rawBefore.toFixed(0)} / ${rawAfter.toFixed(0)} | | | | |`);
  }
} finally {
  await broker.close();
  await dbs.keep.close();
  await dbs.delete.close();
}
