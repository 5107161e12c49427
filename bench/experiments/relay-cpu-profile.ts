// Where the relay process's time goes during a drain (bench/README.md, "MariaDB relay process
// profile (8)"): drains a seeded backlog (PostgreSQL or MariaDB) into RabbitMQ with Courier's
// relay in this process, as scenario 2 / 8 does, and prints
// - the event loop's utilisation over the drain (busy share: is the relay CPU-bound or waiting),
// - how the relay's loops overlap: each store call and each transport publish is timed, so
//   the share of the drain with 0, 1, 2… claims in flight and the mean claim shows whether
//   the loops run side by side or take turns,
// - with `cpu`, V8's sampling CPU profile by package, by function and by the first Courier
//   frame on the stack (garbage collection and idle are their own lines); the profile is also
//   written as a `.cpuprofile` file for Chrome DevTools.
//
//   node --conditions=@courier/source --import tsx experiments/relay-cpu-profile.ts <postgresql|mariadb> [cpu|timing] [rows] [out.cpuprofile|-] [keyless|keyed] [keep|delete]
//
// `keyless` seeds the measured backlog without keys (scenario 2 / 8's keyless line); `-` for no profile file;
// `delete` runs the outbox with `publishedRows: 'delete'` (completion deletes the rows).
//
// A 2,000-row drain first warms the code and the connections up; only the measured drain is
// profiled and timed.
import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import { performance } from 'node:perf_hooks';
import { createBus, type OutboxStore } from '@courier/core';
import { SqlRunner } from '@courier/mikro-orm/sql-kit';
import type { EntityManager } from '@mikro-orm/core';
import { BenchBroker, openDb, runId, seedBacklog, until, type Dialect } from '../src/setup.js';
import { attribute, type CpuProfile } from './cpu-profile.js';
import { serverCpu } from './server-cpu.js';

const dialect: Dialect = process.argv[2] === 'mariadb' ? 'mariadb' : 'postgresql';
const mode = process.argv[3] === 'timing' ? 'timing' : 'cpu';
const rows = Number(process.argv[4] ?? 20_000);
const out = process.argv[5] === '-' ? undefined : process.argv[5];
const keyless = process.argv[6] === 'keyless';
const publishedRows = process.argv[7] === 'delete' ? 'delete' : 'keep';
const WARM_UP = 2_000;

function print(title: string, totals: Map<string, number>, total: number, limit: number): void {
  console.log(`\n${title}`);
  for (const [key, ms] of [...totals].sort((a, b) => b[1] - a[1]).slice(0, limit)) {
    console.log(`  ${((ms * 1000) / rows).toFixed(1).padStart(6)} µs/msg ${((100 * ms) / total).toFixed(1).padStart(5)}%  ${key}`);
  }
}

interface Span {
  readonly what: string;
  readonly start: number;
  end: number;
  count: number;
}

/** Wraps every method of `target` so each call's start and end land in `spans` (named by the method). */
function timed<T extends object>(target: T, spans: Span[], count: (method: string, result: unknown) => number): T {
  return new Proxy(target, {
    get(object, property) {
      const value: unknown = Reflect.get(object, property, object);
      if (typeof value !== 'function' || typeof property !== 'string') return value;
      return (...args: unknown[]) => {
        const span: Span = { what: property, start: performance.now(), end: Number.NaN, count: 0 };
        spans.push(span);
        const result = (value as (...a: unknown[]) => unknown).apply(object, args);
        if (!(result instanceof Promise)) {
          span.end = performance.now();
          return result;
        }
        return result.then((resolved) => {
          span.end = performance.now();
          span.count = count(property, resolved);
          return resolved;
        });
      };
    },
  });
}

/** Share of [from, to] with exactly n of `spans` open, for each n seen; and the mean number open. */
function overlap(spans: readonly Span[], from: number, to: number): { shares: Map<number, number>; mean: number } {
  // A call still running at the end (a helper loop's last claim) counts as open until then.
  const events = spans.flatMap((span) => [
    { at: Math.min(to, Math.max(from, span.start)), delta: 1 },
    { at: Number.isNaN(span.end) ? to : Math.max(from, Math.min(to, span.end)), delta: -1 },
  ]);
  // Opens before closes at the same instant, so a call that ended before the window never counts as -1 open.
  events.sort((a, b) => a.at - b.at || b.delta - a.delta);
  const shares = new Map<number, number>();
  let open = 0;
  let last = from;
  let area = 0;
  for (const event of events) {
    shares.set(open, (shares.get(open) ?? 0) + (event.at - last));
    area += open * (event.at - last);
    last = event.at;
    open += event.delta;
  }
  shares.set(open, (shares.get(open) ?? 0) + (to - last));
  for (const [n, ms] of shares) shares.set(n, ms / (to - from));
  return { shares, mean: area / (to - from) };
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? Number.NaN : sorted[Math.floor(sorted.length / 2)]!;
}

/** The statement's kind: its first words, enough to tell the claim's statements apart. */
function statementKind(sql: string): string {
  const text = sql.replace(/\s+/g, ' ').trim();
  if (text.startsWith('SELECT')) return text.includes('SKIP LOCKED') ? 'SELECT heads … SKIP LOCKED' : `SELECT ${text.slice(7, 40)}…`;
  if (text.startsWith('DELETE') && text.includes('lease_token = ?')) return 'DELETE completion';
  if (text.startsWith('UPDATE')) {
    if (text.includes("state = 'published'")) return 'UPDATE completion';
    if (text.includes('lease_owner = ?')) return 'UPDATE lease';
    if (text.includes('LAST_INSERT_ID')) return 'UPDATE token counter';
    return `UPDATE ${text.slice(7, 40)}…`;
  }
  return text.slice(0, 40);
}

// Every statement Courier's stores run goes through SqlRunner.all / run: time each one.
const statementSpans: Span[] = [];
for (const method of ['all', 'run'] as const) {
  const original = SqlRunner.prototype[method] as (this: SqlRunner, sql: string, ...rest: unknown[]) => Promise<unknown>;
  (SqlRunner.prototype as unknown as Record<string, unknown>)[method] = async function (this: SqlRunner, sql: string, ...rest: unknown[]) {
    const span: Span = { what: statementKind(sql), start: performance.now(), end: Number.NaN, count: 0 };
    statementSpans.push(span);
    try {
      return await original.call(this, sql, ...rest);
    } finally {
      span.end = performance.now();
    }
  };
}

const prefix = `${runId()}_cpu`;
const db = await openDb(dialect, { prefix, wakeups: false, publishedRows });
const broker = new BenchBroker(prefix);
const transport = broker.transport();
const storeSpans: Span[] = [];
const publishSpans: Span[] = [];
const store = timed(db.outbox as OutboxStore<EntityManager, void>, storeSpans, (method, result) =>
  method === 'claim' || method === 'completeAndClaim' ? ((result as { records?: unknown[] }).records?.length ?? 0) : 0,
);
const timedTransport = timed(transport, publishSpans, (method, result) => (method === 'publish' ? (result as unknown[]).length : 0));
const bus = createBus<EntityManager>({ outbox: store, inbox: db.inbox, transport: timedTransport, relay: { pollIntervalMs: 600_000 } });
const session = new Session();
try {
  await broker.declareSink();
  await seedBacklog(db, WARM_UP);
  await bus.start({ relay: true, consumers: false });
  bus.wake();
  await until(() => bus.health().counters.published >= WARM_UP, 600_000, 'the warm-up drain');
  await seedBacklog(db, rows, { from: WARM_UP + 1, keyless });
  if (mode === 'cpu') {
    session.connect();
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 200 });
    await session.post('Profiler.start');
  }
  storeSpans.length = 0;
  publishSpans.length = 0;
  statementSpans.length = 0;
  const lockStatus = async () =>
    dialect === 'mariadb' ? new Map((await db.sql("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock%'")).map((row) => [String(row['Variable_name']), Number(row['Value'])])) : new Map<string, number>();
  const locksBefore = await lockStatus();
  const serversBefore = serverCpu();
  const elu = performance.eventLoopUtilization();
  const cpu = process.cpuUsage();
  const started = performance.now();
  bus.wake();
  await until(() => bus.health().counters.published >= WARM_UP + rows, 600_000, `the drain of ${rows}`, 2);
  const ended = performance.now();
  const used = process.cpuUsage(cpu);
  const loop = performance.eventLoopUtilization(elu);
  const seconds = (ended - started) / 1000;
  console.log(
    `${dialect}${keyless ? " (keyless)" : ""}, publishedRows ${publishedRows}: ${rows} messages in ${seconds.toFixed(2)} s = ${(rows / seconds).toFixed(0)} msg/s; ` +
      `CPU ${((used.user + used.system) / 1e6).toFixed(2)} s = ${((used.user + used.system) / rows).toFixed(1)} µs/msg (user ${(used.user / rows).toFixed(1)}, system ${(used.system / rows).toFixed(1)}); ` +
      `event loop busy ${(loop.utilization * 100).toFixed(0)}% of the drain`,
  );
  const serversAfter = serverCpu();
  console.log(
    `server CPU over the drain (whole processes, shared with anything else running): ` +
      [...serversAfter]
        .map(([name, seconds]) => `${name} ${(seconds - (serversBefore.get(name) ?? 0)).toFixed(2)} s = ${(((seconds - (serversBefore.get(name) ?? 0)) * 1e6) / rows).toFixed(0)} µs/msg`)
        .join(', '),
  );
  const locksAfter = await lockStatus();
  if (dialect === 'mariadb') {
    const d = (name: string) => (locksAfter.get(name) ?? 0) - (locksBefore.get(name) ?? 0);
    console.log(`InnoDB row lock waits over the drain (server-wide): ${d('Innodb_row_lock_waits')} waits, ${d('Innodb_row_lock_time')} ms waited`);
  }
  for (const kind of [...new Set(statementSpans.map((span) => span.what))]) {
    const spans = statementSpans.filter((span) => span.what === kind && !Number.isNaN(span.end));
    const ms = spans.map((span) => span.end - span.start);
    const open = overlap(spans, started, ended);
    console.log(
      `statement ${kind}: ${ms.length}, median ${median(ms).toFixed(1)} ms, sum ${(ms.reduce((a, b) => a + b, 0) / 1000).toFixed(2)} s, ` +
        `mean in flight ${open.mean.toFixed(2)}, ≥ 2 in flight ${(((1 - (open.shares.get(0) ?? 0) - (open.shares.get(1) ?? 0)) * 100).toFixed(0))}% of the drain`,
    );
  }
  const claims = storeSpans.filter((span) => span.what === 'claim' || span.what === 'completeAndClaim');
  const claimMs = claims.filter((span) => !Number.isNaN(span.end)).map((span) => span.end - span.start);
  const full = claims.filter((span) => span.count > 0);
  console.log(
    `claims: ${claims.length} (${full.length} with rows, ${(full.reduce((sum, span) => sum + span.count, 0) / Math.max(1, full.length)).toFixed(0)} rows each); ` +
      `claim call median ${median(claimMs).toFixed(1)} ms, mean ${(claimMs.reduce((a, b) => a + b, 0) / Math.max(1, claimMs.length)).toFixed(1)} ms`,
  );
  const others = [...new Set(storeSpans.map((span) => span.what))].filter((what) => what !== 'claim' && what !== 'completeAndClaim');
  for (const what of others) {
    const ms = storeSpans.filter((span) => span.what === what && !Number.isNaN(span.end)).map((span) => span.end - span.start);
    console.log(`store.${what}: ${ms.length} calls, median ${median(ms).toFixed(1)} ms`);
  }
  const publishMs = publishSpans.filter((span) => span.what === 'publish' && !Number.isNaN(span.end)).map((span) => span.end - span.start);
  console.log(`transport.publish: ${publishMs.length} batches, median ${median(publishMs).toFixed(1)} ms from call to the last confirm`);
  const claimsOpen = overlap(claims, started, ended);
  const publishesOpen = overlap(publishSpans.filter((span) => span.what === 'publish'), started, ended);
  const fmt = (shares: Map<number, number>) => [...shares].sort((a, b) => a[0] - b[0]).map(([n, share]) => `${n}: ${(share * 100).toFixed(0)}%`).join(', ');
  console.log(`claims in flight (share of the drain): ${fmt(claimsOpen.shares)}; mean ${claimsOpen.mean.toFixed(2)}`);
  console.log(`publishes awaiting confirms (share of the drain): ${fmt(publishesOpen.shares)}; mean ${publishesOpen.mean.toFixed(2)}`);
  const either = overlap([...claims, ...publishSpans.filter((span) => span.what === 'publish')], started, ended);
  console.log(`neither a claim nor a publish in flight: ${(((either.shares.get(0) ?? 0) * 100).toFixed(1))}% of the drain`);
  if (mode === 'cpu') {
    const { profile } = (await session.post('Profiler.stop')) as unknown as { profile: CpuProfile };
    if (out) await writeFile(out, JSON.stringify(profile));
    const { byPackage, byFunction, byCourier, total } = attribute(profile);
    console.log(`\nCPU profile: ${total.toFixed(0)} ms sampled over the drain (incl. idle)`);
    print('self time by package of the running script ((…) are V8: GC, idle, native)', byPackage, total, 20);
    print('self time by the first Courier frame on the stack', byCourier, total, 25);
    print('self time by function (← the nearest scripted caller)', byFunction, total, 40);
  }
} finally {
  if (mode === 'cpu') session.disconnect();
  await bus.stop({ timeoutMs: 10_000 });
  await transport.close();
  await broker.close();
  await db.close();
}
