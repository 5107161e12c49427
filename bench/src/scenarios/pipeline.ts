// 12. End to end flat out against its slowest part alone (issue 14, target 10):
// producers → outbox → relay → RabbitMQ → consumer (inbox) on PostgreSQL, first in one
// process, then as separate processes (a producer process, a relay-only and a consumer-only
// process, as users deploy them). In each variant every part is first measured alone on the
// same tables and queue — producers with nothing draining, then the relay draining what
// they wrote with no consumer, then the consumer taking what the relay published — and then
// all of them at once. A pipeline can go no faster than its slowest part; the ratio says how
// much running the parts together costs on top of that.
import type { Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { BenchBroker, benchBus, closedLoopProducers, openDb, OrderPlaced, produceOrder, TimedTransport, TOPIC, until, type BenchDb } from '../setup.js';
import { ServingWorker, type WorkerFigures } from '../startup/serving-worker.js';
import type { Scenario, ScenarioContext } from './context.js';
import { WRITERS } from './producer.js';
import { builtPackages, workerConfig } from './startup.js';

const CONSUMER = 'bench-e2e';
const CONCURRENCY = 8;

/** A bus over the scenario's tables and a fresh transport; `handled` counts the consumer's runs. */
class Parts {
  handled = 0;
  #serial = 0;
  readonly db: BenchDb;
  readonly broker: BenchBroker;

  constructor(db: BenchDb, broker: BenchBroker) {
    this.db = db;
    this.broker = broker;
  }

  /** A bus whose transport counts confirms, with the scenario's one subscription (started or not by the caller). */
  bus(): { bus: Bus<EntityManager>; transport: TimedTransport } {
    const transport = new TimedTransport(this.broker.transport());
    const bus = benchBus(this.db, transport);
    bus.subscribe(
      CONSUMER,
      OrderPlaced,
      () => {
        this.handled += 1;
        return Promise.resolve();
      },
      { concurrency: CONCURRENCY },
    );
    return { bus, transport };
  }

  /** `WRITERS` closed loops of one producer transaction (an order row and its message) for `seconds`; resolves with how many committed. */
  async produce(bus: Bus<EntityManager>, seconds: number): Promise<number> {
    const run = await closedLoopProducers(WRITERS, seconds, () => produceOrder(this.db, bus, `e2e-${(this.#serial += 1)}`));
    return run.commits;
  }
}

function perSecond(count: number, startedAt: number): number {
  return count / ((performance.now() - startedAt) / 1000);
}

/** One variant's rates (msg/s): each part alone, then all at once. */
interface PartRates {
  readonly producers: number;
  readonly relay: number;
  readonly consumer: number;
  readonly endToEnd: number;
}

const UNIT = 'msg/s';

/**
 * Reports a variant's parts, its slowest part and the end-to-end line against it, and the
 * target; returns the end-to-end line's label. `variant` names the variant in every label.
 */
function reportVariant(report: ScenarioContext['report'], variant: string, rates: PartRates): string {
  const suffix = variant === 'one process' ? '' : `, ${variant}`;
  report.measure(`producers alone${suffix} (${WRITERS} writers, nothing draining)`, rates.producers, UNIT);
  report.measure(`relay alone${suffix} (drains their backlog, no consumer)`, rates.relay, UNIT);
  report.measure(`consumer alone${suffix} (inbox, concurrency ${CONCURRENCY})`, rates.consumer, UNIT);
  const slowest = Math.min(rates.producers, rates.relay, rates.consumer);
  const slowestName = slowest === rates.producers ? 'producers' : slowest === rates.relay ? 'relay' : 'consumer';
  const slowestLabel = `slowest part alone${suffix} (${slowestName})`;
  report.measure(slowestLabel, slowest, UNIT);
  const label = `end to end${suffix}, all at once (first commit → last handled)`;
  const measured = report.measure(label, rates.endToEnd, UNIT, { vs: slowestLabel });
  report.target(`end to end ≥ 0.80 × its slowest part alone (${variant})`, `${measured.ratio?.toFixed(3)}`, (measured.ratio ?? 0) >= 0.8);
  return label;
}

/** The one-process variant; returns its end-to-end line's label. */
async function oneProcess({ quick, prefix, report }: ScenarioContext): Promise<string> {
  const seconds = quick ? 2 : 10;
  const db = await openDb('postgresql', { prefix, poolMax: WRITERS + 12 });
  const broker = new BenchBroker(prefix);
  const parts = new Parts(db, broker);
  try {
    broker.track(CONSUMER);
    const provisioner = broker.transport();
    await provisioner.provision({ consumer: CONSUMER, topics: [TOPIC], ordered: false });
    await provisioner.close();

    // This process's CPU per message over a phase (from the last `cpuAt`), to set beside each worker's.
    let cpuAt = process.cpuUsage();
    const cpuPerMessage = (count: number): number => {
      const used = process.cpuUsage(cpuAt);
      return (used.user + used.system) / count;
    };

    // Producers alone: nothing drains the outbox.
    const producerSide = parts.bus();
    let startedAt = performance.now();
    const written = await parts.produce(producerSide.bus, seconds);
    const producerRate = perSecond(written, startedAt);
    const producerCpu = cpuPerMessage(written);

    // The relay alone: it drains what the producers wrote; no consumer runs.
    startedAt = performance.now();
    cpuAt = process.cpuUsage();
    await producerSide.bus.start({ relay: true, consumers: false });
    await until(() => producerSide.transport.confirmed >= written, 600_000, `the relay to publish ${written} messages`, 5);
    const relayRate = perSecond(written, startedAt);
    const relayCpu = cpuPerMessage(written);
    await producerSide.bus.stop({ timeoutMs: 10_000 });
    await producerSide.transport.close();

    // The consumer alone: it takes what the relay published.
    const consumerSide = parts.bus();
    startedAt = performance.now();
    cpuAt = process.cpuUsage();
    await consumerSide.bus.start({ relay: false, consumers: true });
    await until(() => parts.handled >= written, 600_000, `the consumer to handle ${written} messages`, 5);
    const consumerRate = perSecond(written, startedAt);
    const consumerCpu = cpuPerMessage(written);
    await consumerSide.bus.stop({ timeoutMs: 10_000 });
    await consumerSide.transport.close();

    // All at once: from the first commit to the last message handled.
    const together = parts.bus();
    parts.handled = 0;
    await together.bus.start();
    startedAt = performance.now();
    cpuAt = process.cpuUsage();
    const sent = await parts.produce(together.bus, seconds);
    await until(() => parts.handled >= sent, 600_000, `${sent} messages end to end`, 5);
    const endToEnd = perSecond(sent, startedAt);
    const togetherCpu = cpuPerMessage(sent);
    await together.bus.stop({ timeoutMs: 10_000 });
    await together.transport.close();

    const label = reportVariant(report, 'one process', { producers: producerRate, relay: relayRate, consumer: consumerRate, endToEnd });
    report.measure('one process: CPU per message, all at once', togetherCpu, 'µs', {
      note: `producers alone ${producerCpu.toFixed(0)} µs, relay alone ${relayCpu.toFixed(0)} µs, consumer alone ${consumerCpu.toFixed(0)} µs`,
    });
    report.note(
      `One process: ${written.toLocaleString('en-US')} then ${sent.toLocaleString('en-US')} messages (${seconds} s of ${WRITERS} closed-loop producers each) on PostgreSQL + RabbitMQ; ` +
        'the handler does nothing but the inbox record.',
    );
    return label;
  } finally {
    await broker.close();
    await db.close();
  }
}

/**
 * The separate-processes variant: a producer process (`WRITERS` closed loops), a relay-only
 * and a consumer-only process — the startup worker serving commands, on the built packages
 * as users run them — on tables and queues of their own, with the same workload and
 * durability as the one-process variant. The three processes are started (and idle) before
 * anything is measured; rates are taken from the workers' own clocks (no pipe round trip in
 * them). Per process it reports CPU per message of each phase and the peak RSS.
 */
async function separateProcesses({ quick, prefix, report }: ScenarioContext): Promise<string> {
  const seconds = quick ? 2 : 10;
  const ownPrefix = `${prefix}_procs`;
  const db = await openDb('postgresql', { prefix: ownPrefix, poolMax: 2 });
  const broker = new BenchBroker(ownPrefix);
  const workers: ServingWorker[] = [];
  try {
    broker.track(CONSUMER);
    const provisioner = broker.transport();
    await provisioner.provision({ consumer: CONSUMER, topics: [TOPIC], ordered: false });
    await provisioner.close();
    const built = builtPackages();
    const config = workerConfig(ownPrefix, broker.prefix, { consumer: CONSUMER, writers: WRITERS, idPrefix: 'e2e' });
    // Pools as the one process's 20 connections are used: a writer each, the relay's loops, the consumer's handlers.
    const start = (role: ServingWorker['role'], connections: number): ServingWorker => {
      const worker = new ServingWorker({ role, ormLoader: 'require' }, { ...config, ormOptions: { pool: { min: 0, max: connections } } }, built);
      workers.push(worker);
      return worker;
    };
    const producer = start('producer', WRITERS + 2);
    const relay = start('relay', 8);
    const consumer = start('consumer', CONCURRENCY + 4);
    const stats = () => Promise.all(workers.map((worker) => worker.request({ cmd: 'stats' })));
    const rate = (count: number, from: WorkerFigures, to: WorkerFigures) => count / ((to.at - from.at) / 1000);
    const cpuPerMessage = (count: number, from: WorkerFigures, to: WorkerFigures) => ((to.cpuSeconds - from.cpuSeconds) / count) * 1e6;
    await stats(); // all three serving

    const produced = await producer.request({ cmd: 'produce', seconds });
    const written = produced.count!;
    const relayStarted = await relay.request({ cmd: 'start' });
    const drained = await relay.request({ cmd: 'await', count: written });
    const consumerStarted = await consumer.request({ cmd: 'start' });
    const consumed = await consumer.request({ cmd: 'await', count: written });
    const alone = [
      { worker: producer, count: written, from: produced.before!, to: produced as WorkerFigures },
      { worker: relay, count: written, from: relayStarted.before!, to: drained as WorkerFigures },
      { worker: consumer, count: written, from: consumerStarted.before!, to: consumed as WorkerFigures },
    ];

    // All at once: the relay and the consumer are running (idle); from the producer's first commit to the consumer's last handled.
    const before = await stats();
    const together = await producer.request({ cmd: 'produce', seconds });
    const sent = together.count!;
    const done = await consumer.request({ cmd: 'await', count: written + sent });
    const after = await stats();
    await Promise.all(workers.map((worker) => worker.stop()));

    const label = reportVariant(report, 'separate processes', {
      producers: rate(written, produced.before!, produced),
      relay: rate(written, relayStarted.before!, drained),
      consumer: rate(written, consumerStarted.before!, consumed),
      endToEnd: rate(sent, together.before!, done),
    });
    for (const [index, worker] of workers.entries()) {
      const part = alone[index]!;
      const peakRss = after[index]!.maxRssMb;
      report.measure(`${worker.role} process: CPU per message, all at once`, cpuPerMessage(sent, before[index]!, after[index]!), 'µs', {
        note: `alone ${cpuPerMessage(part.count, part.from, part.to).toFixed(0)} µs; peak RSS ${peakRss.toFixed(0)} MB`,
      });
      report.measure(`${worker.role} process: peak RSS`, peakRss, 'MB');
    }
    report.note(
      `Separate processes: ${written.toLocaleString('en-US')} then ${sent.toLocaleString('en-US')} messages (${seconds} s of ${WRITERS} closed-loop producers in one producer process); ` +
        `a relay-only and a consumer-only process (the startup worker, ${built ? 'built packages on plain node' : 'sources through tsx: dist/ is not built'}), all three started before measuring; ` +
        'rates from the workers\' own clocks; CPU per message over each phase, peak RSS over the process\'s life (start-up included).',
    );
    return label;
  } finally {
    // No worker outlives the scenario, whatever failed (a stopped one is already gone).
    for (const worker of workers) worker.kill();
    await Promise.all(workers.map((worker) => worker.closed));
    await broker.close();
    await db.close();
  }
}

export const pipelineScenario: Scenario = {
  id: 12,
  name: 'end to end vs its slowest part alone',
  services: ['postgresql', 'rabbitmq'],
  async run(context) {
    // The variant run second meets a machine some minutes older: for A/B runs on a shared
    // machine, COURIER_BENCH_E2E_FIRST=processes swaps the order.
    const processesFirst = process.env['COURIER_BENCH_E2E_FIRST'] === 'processes';
    let one: string;
    let separate: string;
    if (processesFirst) {
      separate = await separateProcesses(context);
      one = await oneProcess(context);
    } else {
      one = await oneProcess(context);
      separate = await separateProcesses(context);
    }
    const line = (label: string) => context.report.measurements.find((each) => each.label === label)!;
    context.report.measure('end to end, separate processes vs one process', line(separate).value, UNIT, { vs: one });
    const cpu = (['producer', 'relay', 'consumer'] as const).reduce((sum, role) => sum + line(`${role} process: CPU per message, all at once`).value, 0);
    context.report.measure('separate processes: CPU per message, all at once (the three summed)', cpu, 'µs', { vs: 'one process: CPU per message, all at once' });
  },
};
