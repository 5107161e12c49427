// The log-tailing relay (@courier/pg-logical, issue 38) against the polling relay (LISTEN/NOTIFY
// wake-ups on, its best) on PostgreSQL, in one run, with an in-process transport that confirms
// at once (so the numbers are the relays' own path, not a broker's):
// - idle latency: single-row commits spaced 20 ms apart, commit resolved → transport called (p50/p99/max);
// - live drain: transactions of 100 rows committed back to back by 4 producers, first commit →
//   last publish, in msg/s, beside "raw": the same producers' commit rate with no relay running;
// - the relay's own PostgreSQL backends' CPU per message during the drain (found by
//   application_name; the log-tail relay's walsender included), from /proc.
//
// Options (fifth argument, comma-separated): `backlog` commits every row before the relay starts
// (the log-tail store already reads its slot, so both relays face the same backlog) and times
// relay start → last publish instead of the live drain; `pipelined` makes the transport declare
// ordered pipelining, so the relay claims up to a batch per key (`perKey`), as with Kafka.
//
//   node --conditions=@courier/source --import tsx src/log-tail.ts [rows] [idleRows] [modes] [backlog,pipelined]
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createBus, defineMessage, noopLogger, type Envelope, type PublishResult, type Transport } from '@courier/core';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import { dropReplicationSlot, PgLogicalOutboxStore } from '@courier/pg-logical';
import type { EntityManager, MikroORM, Options } from '@mikro-orm/core';
import pg from 'pg';

const URL = process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test';
const ROWS = Number(process.argv[2] ?? 10_000);
const IDLE_ROWS = Number(process.argv[3] ?? 200);
const PRODUCERS = 4;
const PER_TX = 100;
const SHAPE = new Set((process.argv[5] ?? '').split(',').filter((word) => word !== ''));
for (const word of SHAPE) if (word !== 'backlog' && word !== 'pipelined') throw new Error(`unknown option '${word}' (expected backlog, pipelined)`);
const BACKLOG = SHAPE.has('backlog');
const PIPELINED = SHAPE.has('pipelined');
const Tick = defineMessage('bench.Tick', { version: 1 });
const admin = new pg.Pool({ connectionString: URL, max: 2 });

class ConfirmingTransport implements Transport {
  readonly capabilities = { orderingByKey: true, orderedPipelining: PIPELINED, nativeDelay: false, nativeDeadLetter: false, maxMessageBytes: 1 << 20 };
  readonly seenAt = new Map<string, number>();
  publish(messages: readonly Envelope[]): Promise<readonly PublishResult[]> {
    const now = performance.now();
    for (const message of messages) if (!this.seenAt.has(message.messageId)) this.seenAt.set(message.messageId, now);
    return Promise.resolve(messages.map((message) => ({ messageId: message.messageId, ok: true as const })));
  }
  subscribe(): never {
    throw new Error('publishes only');
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

async function orm(applicationName: string): Promise<MikroORM> {
  const { MikroORM: PgOrm } = await import('@mikro-orm/postgresql');
  return PgOrm.init({ clientUrl: URL, entities: [], debug: false, discovery: { warnWhenNoEntities: false }, pool: { min: 0, max: 16 }, driverOptions: { connection: { application_name: applicationName } } } as Options);
}

async function backendSeconds(applicationName: string, slot?: string): Promise<Map<number, number>> {
  const { rows } = await admin.query<{ pid: number }>(
    'SELECT pid FROM pg_stat_activity WHERE application_name = $1 UNION SELECT active_pid FROM pg_replication_slots WHERE slot_name = $2 AND active_pid IS NOT NULL',
    [applicationName, slot ?? ''],
  );
  const out = new Map<number, number>();
  for (const { pid } of rows) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      out.set(pid, (Number(fields[11]) + Number(fields[12])) / 100);
    } catch {
      // Ended meanwhile.
    }
  }
  return out;
}

function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

async function produce(producer: MikroORM, bus: ReturnType<typeof createBus<EntityManager>>, rows: number): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: PRODUCERS }, async () => {
      while (next < rows) {
        const start = next;
        next += PER_TX;
        await producer.em.fork().transactional(async (em) => {
          for (let i = start; i < Math.min(rows, start + PER_TX); i++) bus.outbox(em).publish(Tick, { i }, { key: `k${i % 64}` });
        });
      }
    }),
  );
}

/**
 * Wraps the store's claim, completeAndClaim and complete with wall-clock timers (calls, rows,
 * mean ms per call) — where a relay loop's round trips go. The relay's loops overlap, so the
 * sums may exceed the drain's duration.
 */
function timeStoreCalls(store: object): { describe(): string } {
  const totals = new Map<string, { calls: number; rows: number; ms: number }>();
  const target = store as Record<string, unknown>;
  for (const name of ['claim', 'completeAndClaim', 'complete']) {
    const original = target[name];
    if (typeof original !== 'function') continue;
    const entry = { calls: 0, rows: 0, ms: 0 };
    totals.set(name, entry);
    target[name] = async (...args: unknown[]) => {
      const began = performance.now();
      const result = (await (original as (...a: unknown[]) => Promise<unknown>).apply(store, args)) as { records?: readonly unknown[] } | number;
      entry.ms += performance.now() - began;
      entry.calls += 1;
      entry.rows += typeof result === 'number' ? result : (result.records?.length ?? 0);
      return result;
    };
  }
  return {
    describe: () =>
      [...totals]
        .filter(([, entry]) => entry.calls > 0)
        .map(([name, entry]) => `${name} ${entry.calls} calls, ${(entry.rows / entry.calls).toFixed(0)} rows and ${(entry.ms / entry.calls).toFixed(1)} ms each`)
        .join('; '),
  };
}

/** Drain rates by mode, for the ratios printed at the end. */
const rates: Record<string, number[]> = {};

async function run(mode: 'polling' | 'log-tail' | 'raw'): Promise<string> {
  const id = `bench_lt_${randomBytes(4).toString('hex')}`;
  const relayName = `${id}_relay`;
  const producerOrm = await orm(`${id}_producer`);
  const relayOrm = await orm(relayName);
  const tablePrefix = `${id}_`;
  // Wake-ups on: the producer's commits NOTIFY the polling relay (its best case).
  const producerStore = new MikroOrmOutboxStore({ orm: producerOrm, tablePrefix });
  await producerStore.ensureSchema();
  const transport = new ConfirmingTransport();
  const producer = createBus({ outbox: producerStore, transport, logger: noopLogger });
  let store: MikroOrmOutboxStore | PgLogicalOutboxStore<EntityManager> | undefined;
  if (mode === 'polling') store = new MikroOrmOutboxStore({ orm: relayOrm, tablePrefix });
  if (mode === 'log-tail') {
    store = new PgLogicalOutboxStore<EntityManager>({
      store: new MikroOrmOutboxStore({ orm: relayOrm, tablePrefix, wakeups: false }),
      connection: { connectionString: URL, application_name: relayName },
      slot: id,
      tables: { tablePrefix },
    });
    await store.watch(() => undefined);
    while (!store.streaming) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const calls = store ? timeStoreCalls(store) : undefined;
  const relay = store ? createBus({ outbox: store, transport, logger: noopLogger }) : undefined;
  try {
    if (BACKLOG && relay) {
      // The same backlog for both: committed with no relay running (the log-tail store reads its
      // slot meanwhile, so the rows wait in its memory as they would behind a slow relay).
      await produce(producerOrm, producer, ROWS);
      const before = await backendSeconds(relayName, id);
      const started = performance.now();
      await relay.start({ consumers: false });
      while (transport.seenAt.size < ROWS) await new Promise((resolve) => setTimeout(resolve, 2));
      const done = performance.now();
      const after = await backendSeconds(relayName, id);
      let cpu = 0;
      for (const [pid, seconds] of after) cpu += seconds - (before.get(pid) ?? 0);
      const counts = store instanceof PgLogicalOutboxStore ? ` (claimed from the log ${store.claimed.logged}, swept ${store.claimed.swept})` : '';
      (rates[mode] ??= []).push((ROWS / (done - started)) * 1000);
      return `${mode}: backlog drain ${((ROWS / (done - started)) * 1000).toFixed(0)} msg/s (${(done - started).toFixed(0)} ms); relay backends ${((cpu * 1e6) / ROWS).toFixed(1)} µs CPU/msg${counts}; ${calls!.describe()}`;
    }
    await relay?.start({ consumers: false });
    let idle = '';
    if (relay) {
      const latencies: number[] = [];
      for (let i = 0; i < IDLE_ROWS; i++) {
        let messageId = '';
        await producerOrm.em.fork().transactional(async (em) => {
          messageId = producer.outbox(em).publish(Tick, { i }, { key: `idle${i % 8}` });
        });
        const committedAt = performance.now();
        while (!transport.seenAt.has(messageId)) await new Promise((resolve) => setImmediate(resolve));
        latencies.push(transport.seenAt.get(messageId)! - committedAt);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      latencies.sort((a, b) => a - b);
      idle = `idle commit→publish p50 ${percentile(latencies, 50).toFixed(2)} ms p99 ${percentile(latencies, 99).toFixed(2)} ms max ${latencies.at(-1)!.toFixed(2)} ms; `;
    }
    const before = await backendSeconds(relayName, id);
    const published = transport.seenAt.size;
    const started = performance.now();
    await produce(producerOrm, producer, ROWS);
    const committed = performance.now();
    if (relay) while (transport.seenAt.size < published + ROWS) await new Promise((resolve) => setTimeout(resolve, 2));
    const done = performance.now();
    const after = await backendSeconds(relayName, id);
    let cpu = 0;
    for (const [pid, seconds] of after) cpu += seconds - (before.get(pid) ?? 0);
    const rate = (ROWS / (done - started)) * 1000;
    (rates[mode] ??= []).push(rate);
    if (!relay) return `raw (commits only, no relay): ${rate.toFixed(0)} msg/s`;
    const counts = store instanceof PgLogicalOutboxStore ? ` (claimed from the log ${store.claimed.logged}, swept ${store.claimed.swept})` : '';
    return `${mode}: ${idle}live drain ${rate.toFixed(0)} msg/s (producers done after ${(committed - started).toFixed(0)} ms, last publish +${(done - committed).toFixed(0)} ms); relay backends ${((cpu * 1e6) / ROWS).toFixed(1)} µs CPU/msg${counts}`;
  } finally {
    await relay?.stop();
    await store?.close();
    await producerStore.close();
    if (mode === 'log-tail') await dropReplicationSlot(admin, id, { publication: `${id}_pub` }).catch(async () => {
      await new Promise((resolve) => setTimeout(resolve, 500));
      await dropReplicationSlot(admin, id, { publication: `${id}_pub` });
    });
    for (const table of ['outbox', 'inbox', 'inbox_starts', 'inbox_halts', 'inbox_held', 'inbox_parked', 'meta']) await admin.query(`DROP TABLE IF EXISTS "${tablePrefix}${table}"`);
    await admin.query(`DROP SEQUENCE IF EXISTS "${tablePrefix}outbox_token_seq"`).catch(() => undefined);
    await producerOrm.close();
    await relayOrm.close();
  }
}

console.log(`[log-tail bench] PostgreSQL, ${ROWS} rows (64 keys, ${PRODUCERS} producers × ${PER_TX}-row transactions), ${BACKLOG ? 'backlog drain' : `${IDLE_ROWS} idle rows, live drain`}, ${PIPELINED ? 'pipelined transport (perKey = batch)' : 'transport without pipelining (perKey 1)'}, load ${readFileSync('/proc/loadavg', 'utf8').split(' ')[0]}`);
for (const mode of (process.argv[4]?.split(',') ?? ['raw', 'polling', 'log-tail', 'polling', 'log-tail']) as ('raw' | 'polling' | 'log-tail')[]) console.log(`  ${await run(mode)}`);
const median = (values: readonly number[] | undefined) => (values && values.length > 0 ? [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]! : Number.NaN);
const [raw, polling, logTail] = [median(rates['raw']), median(rates['polling']), median(rates['log-tail'])];
console.log(`  ratios (medians): log-tail / polling ${(logTail / polling).toFixed(2)}; polling / raw ${(polling / raw).toFixed(2)}; log-tail / raw ${(logTail / raw).toFixed(2)} (raw: the producers' commit rate with no relay)`);
await admin.end();
