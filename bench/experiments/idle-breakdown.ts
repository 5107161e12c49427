// Where the producer's transaction spends its time at idle (scenario 5 sends 5 msg/s): the
// same transaction kinds as producer-cost.ts, but paced one every `paceMs` instead of
// back to back, with every statement's round trip timed at the driver (pg.Client.query,
// from the call to its answer) so a transaction's wall time splits into the database's
// answers and what runs in this process between them.
//
//   node --conditions=@courier/source --import tsx experiments/idle-breakdown.ts [perRound] [rounds] [modes] [paceMs]
//   modes: comma list of raw,business,hand,courier,relay (default raw,business,courier,relay);
//   relay is courier with the bus started on RabbitMQ, so each commit wakes the relay in
//   this process as in scenario 5.
//
// Rounds alternate the modes (A, B, A, B…) so a change of machine load hits them alike.
import { createBus, InMemoryBroker, type Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import pg from 'pg';
import { LatencyHistogram } from '../src/histogram.js';
import { handWrittenInsert, pgPool, rawPgProducerTx } from '../src/ceilings.js';
import { BenchBroker, benchBus, openDb, OrderPlaced, orderPayload, outboxValues, runId, sleep, statementShape } from '../src/setup.js';

type Mode = 'raw' | 'business' | 'hand' | 'courier' | 'relay';

const perRound = Number(process.argv[2] ?? 30);
const rounds = Number(process.argv[3] ?? 4);
const modes = (process.argv[4] ?? 'raw,business,courier,relay').split(',') as Mode[];
const paceMs = Number(process.argv[5] ?? 200);

/** Round trips of the transaction being measured, in order: [shape, ms]. */
let trips: [string, number][] | undefined;
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]): unknown {
  const into = trips;
  if (!into) return query.apply(this, args);
  const shape = statementShape(args[0], 40);
  const started = performance.now();
  const record = () => void into.push([shape, performance.now() - started]);
  const last = args.at(-1);
  if (typeof last === 'function') {
    args[args.length - 1] = (...results: unknown[]) => {
      record();
      return (last as (...a: unknown[]) => unknown)(...results);
    };
    return query.apply(this, args);
  }
  const result = query.apply(this, args);
  if (result && typeof (result as Promise<unknown>).then === 'function') (result as Promise<unknown>).then(record, record);
  return result;
} as typeof pg.Client.prototype.query;

const prefix = `bench_${runId()}_idle`;
const db = await openDb('postgresql', { prefix, poolMax: 16 });
const insert = handWrittenInsert(db);
const pool = pgPool(1);
const quiet = createBus<EntityManager>({ outbox: db.outbox, transport: new InMemoryBroker().connect() });
const broker = new BenchBroker(prefix);
let relayBus: Bus<EntityManager> | undefined;
let serial = 0;

async function once(mode: Mode): Promise<void> {
  const id = `o-${(serial += 1)}`;
  if (mode === 'raw') return rawPgProducerTx(pool, db, id);
  const bus = mode === 'relay' ? relayBus! : quiet;
  await db.orm.em.fork().transactional(async (em) => {
    em.persist(em.create(db.Order, { id, customerId: `c-${id.slice(-6)}`, totalCents: 12_345, createdAt: new Date() }));
    if (mode === 'hand') await em.getConnection().execute(insert, outboxValues(id), 'run', em.getTransactionContext());
    else if (mode === 'courier' || mode === 'relay') bus.outbox(em).publish(OrderPlaced, orderPayload(id), { key: id });
  });
}

try {
  if (modes.includes('relay')) {
    relayBus = benchBus(db, broker.transport());
    await relayBus.start();
  }
  for (const mode of modes) for (let i = 0; i < 20; i += 1) await once(mode);
  const wall = new Map<Mode, LatencyHistogram>(modes.map((mode) => [mode, new LatencyHistogram()]));
  const inDb = new Map<Mode, LatencyHistogram>(modes.map((mode) => [mode, new LatencyHistogram()]));
  const perShape = new Map<Mode, Map<string, number[]>>(modes.map((mode) => [mode, new Map()]));
  for (let round = 0; round < rounds; round += 1) {
    for (const mode of round % 2 === 0 ? modes : [...modes].reverse()) {
      for (let i = 0; i < perRound; i += 1) {
        await sleep(paceMs);
        const mine: [string, number][] = [];
        trips = mine;
        const started = performance.now();
        await once(mode);
        const elapsed = performance.now() - started;
        trips = undefined;
        wall.get(mode)!.recordMs(elapsed);
        inDb.get(mode)!.recordMs(mine.reduce((sum, [, ms]) => sum + ms, 0));
        const shapes = perShape.get(mode)!;
        for (const [shape, ms] of mine) shapes.set(shape, [...(shapes.get(shape) ?? []), ms]);
      }
    }
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
  console.log(`${perRound} × ${rounds} transactions per mode, one every ${paceMs} ms (+ its own time)`);
  for (const mode of modes) {
    const w = wall.get(mode)!.summary();
    const d = inDb.get(mode)!.summary();
    console.log(`${mode.padEnd(8)} wall p50 ${w.p50} p95 ${w.p95} p99 ${w.p99} ms; in statements p50 ${d.p50} p95 ${d.p95} ms`);
    for (const [shape, values] of perShape.get(mode)!) {
      console.log(`    ${(values.length / (perRound * rounds)).toFixed(2)} × median ${median(values).toFixed(2)} ms  ${shape}`);
    }
  }
} finally {
  await relayBus?.stop().catch(() => undefined);
  await broker.close().catch(() => undefined);
  await pool.end().catch(() => undefined);
  await db.close();
}
