// 2. Relay drain PostgreSQL → RabbitMQ vs the raw publish loop; 3. a big backlog vs a
// small one; 8. the same drain from MariaDB.
import { rawClaimLoop, rawPublishLoop } from '../ceilings.js';
import { anyPending, BenchBroker, benchBus, openDb, seedBacklog, TimedTransport, until, type BenchDb, type Dialect } from '../setup.js';
import type { Scenario, ScenarioContext } from './context.js';

const BATCH = 100;

/** Empties the outbox between phases. */
async function truncate(db: BenchDb): Promise<void> {
  await db.sql(db.dialect === 'postgresql' ? `TRUNCATE ${db.table('outbox')}` : `TRUNCATE TABLE ${db.table('outbox')}`);
}

/**
 * Seeds `count` rows, then lets Courier's relay drain them to the sink queue; resolves
 * with messages per second from the wake-up to the last completed row. The relay and
 * its connection are warmed with one message first; polling is off, so the clock starts
 * at the wake-up.
 */
export async function relayDrain(db: BenchDb, broker: BenchBroker, count: number): Promise<{ rate: number; seedSeconds: number }> {
  const transport = new TimedTransport(broker.transport());
  const bus = benchBus(db, transport, { batchSize: BATCH, pollIntervalMs: 600_000 });
  try {
    await bus.start({ relay: true, consumers: false });
    await seedBacklog(db, 1, { from: 1_000_000_000 });
    bus.wake();
    await until(() => transport.confirmed >= 1 && bus.health().relay.sinceLastClaimMs >= 0, 30_000, 'the warm-up message');
    await until(async () => !(await anyPending(db)), 30_000, 'the warm-up message to complete', 20);
    const seedStarted = performance.now();
    await seedBacklog(db, count);
    const seedSeconds = (performance.now() - seedStarted) / 1000;
    const started = performance.now();
    bus.wake();
    await until(() => transport.confirmed >= count + 1, 3_600_000, `${count} confirms`, 10);
    await until(async () => !(await anyPending(db)), 60_000, 'the last rows to complete', 5);
    const elapsed = (performance.now() - started) / 1000;
    return { rate: count / elapsed, seedSeconds };
  } finally {
    await bus.stop({ timeoutMs: 10_000 });
    await transport.close();
  }
}

/** Courier's store alone: claim + complete batches until nothing is due (no transport). */
async function storeClaimLoop(db: BenchDb): Promise<number> {
  let done = 0;
  const started = performance.now();
  for (;;) {
    const batch = await db.outbox.claim({ owner: 'bench-store', limit: BATCH, leaseMs: 30_000, perKey: 1 });
    if (batch.records.length === 0) break;
    done += await db.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
  }
  return done / ((performance.now() - started) / 1000);
}

async function drainAgainstCeilings(dialect: Dialect, { quick, prefix, report, shared }: ScenarioContext): Promise<void> {
  const count = quick ? 2_000 : 100_000;
  const db = await openDb(dialect, { prefix, wakeups: false });
  const broker = new BenchBroker(prefix);
  try {
    await broker.declareSink();
    await rawPublishLoop(broker, Math.min(count, 2_000)); // warm-up: connection, queue, JIT
    const rawBefore = await rawPublishLoop(broker, count);
    const drain = await relayDrain(db, broker, count);
    const rawAfter = await rawPublishLoop(broker, count);
    const raw = (rawBefore + rawAfter) / 2;
    report.measure('raw amqplib publish loop, window 256', raw, 'msg/s', { note: `mean of ${Math.round(rawBefore)} before and ${Math.round(rawAfter)} after` });
    await truncate(db);
    await seedBacklog(db, count);
    const rawClaim = await rawClaimLoop(db, BATCH);
    report.measure('raw SQL claim + complete loop, batch 100', rawClaim, 'rows/s');
    await truncate(db);
    await seedBacklog(db, count);
    const storeClaim = await storeClaimLoop(db);
    report.measure('Courier store claim + complete, batch 100', storeClaim, 'rows/s', { vs: 'raw SQL claim + complete loop, batch 100' });
    const courier = report.measure(`Courier relay drain of ${count.toLocaleString('en-US')}`, drain.rate, 'msg/s', { vs: 'raw amqplib publish loop, window 256' });
    report.target('relay drain ≥ 0.70 × raw publish loop', `${courier.ratio?.toFixed(3)}`, (courier.ratio ?? 0) >= 0.7);
    report.note(
      `${count.toLocaleString('en-US')} seeded rows (distinct keys, ~190-byte envelopes), relay batch ${BATCH}, one relay, to a durable quorum queue capped at 1,000 (drop-head) ` +
        `so the broker never fills; persistent messages, publisher confirms (transport window 256).`,
    );
    shared.set(`drainRate.${dialect}`, drain.rate);
  } finally {
    await broker.close();
    await db.close();
  }
}

export const drainScenario: Scenario = {
  id: 2,
  name: 'relay drain PostgreSQL → RabbitMQ',
  services: ['postgresql', 'rabbitmq'],
  run: (context) => drainAgainstCeilings('postgresql', context),
};

export const mariaDbDrainScenario: Scenario = {
  id: 8,
  name: 'relay drain MariaDB → RabbitMQ',
  services: ['mariadb', 'rabbitmq'],
  run: (context) => drainAgainstCeilings('mariadb', context),
};

export const backlogScenario: Scenario = {
  id: 3,
  name: 'drain: big backlog vs small',
  services: ['postgresql', 'rabbitmq'],
  async run({ quick, prefix, report }) {
    const small = quick ? 2_000 : 10_000;
    const big = quick ? 20_000 : 1_000_000;
    const db = await openDb('postgresql', { prefix, wakeups: false });
    const broker = new BenchBroker(prefix);
    try {
      await broker.declareSink();
      const smallRun = await relayDrain(db, broker, small);
      await truncate(db);
      const bigRun = await relayDrain(db, broker, big);
      // Full runs drain the small backlog again after the big one, to even out drift.
      let smallRate = smallRun.rate;
      let note = 'before the big one';
      if (!quick) {
        await truncate(db);
        const smallAgain = await relayDrain(db, broker, small);
        smallRate = (smallRun.rate + smallAgain.rate) / 2;
        note = `mean of ${Math.round(smallRun.rate)} before and ${Math.round(smallAgain.rate)} after the big one`;
      }
      const label = `relay drain of ${small.toLocaleString('en-US')}`;
      report.measure(label, smallRate, 'msg/s', { note });
      const measured = report.measure(`relay drain of ${big.toLocaleString('en-US')}`, bigRun.rate, 'msg/s', { vs: label, note: `seeded in ${bigRun.seedSeconds.toFixed(1)} s by one INSERT … SELECT` });
      report.target(`${big.toLocaleString('en-US')}-row backlog ≥ 0.80 × ${small.toLocaleString('en-US')}-row`, `${measured.ratio?.toFixed(3)}`, (measured.ratio ?? 0) >= 0.8);
    } finally {
      await broker.close();
      await db.close();
    }
  },
};
