// 12. End to end flat out against its slowest part alone (issue 14, target 10), in one
// process: producers → outbox → relay → RabbitMQ → consumer (inbox) on PostgreSQL. Each part
// is first measured alone on the same tables and queue — producers with nothing draining,
// then the relay draining what they wrote with no consumer, then the consumer taking what
// the relay published — and then all of them at once. A pipeline can go no faster than its
// slowest part; the ratio says how much running the parts together costs on top of that.
import type { Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { BenchBroker, benchBus, closedLoopProducers, openDb, OrderPlaced, produceOrder, TimedTransport, TOPIC, until, type BenchDb } from '../setup.js';
import type { Scenario } from './context.js';
import { WRITERS } from './producer.js';

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

export const pipelineScenario: Scenario = {
  id: 12,
  name: 'end to end vs its slowest part alone',
  services: ['postgresql', 'rabbitmq'],
  async run({ quick, prefix, report }) {
    const seconds = quick ? 2 : 10;
    const db = await openDb('postgresql', { prefix, poolMax: WRITERS + 12 });
    const broker = new BenchBroker(prefix);
    const parts = new Parts(db, broker);
    try {
      broker.track(CONSUMER);
      const provisioner = broker.transport();
      await provisioner.provision({ consumer: CONSUMER, topics: [TOPIC], ordered: false });
      await provisioner.close();

      // Producers alone: nothing drains the outbox.
      const producerSide = parts.bus();
      let startedAt = performance.now();
      const written = await parts.produce(producerSide.bus, seconds);
      const producerRate = perSecond(written, startedAt);

      // The relay alone: it drains what the producers wrote; no consumer runs.
      startedAt = performance.now();
      await producerSide.bus.start({ relay: true, consumers: false });
      await until(() => producerSide.transport.confirmed >= written, 600_000, `the relay to publish ${written} messages`, 5);
      const relayRate = perSecond(written, startedAt);
      await producerSide.bus.stop({ timeoutMs: 10_000 });
      await producerSide.transport.close();

      // The consumer alone: it takes what the relay published.
      const consumerSide = parts.bus();
      startedAt = performance.now();
      await consumerSide.bus.start({ relay: false, consumers: true });
      await until(() => parts.handled >= written, 600_000, `the consumer to handle ${written} messages`, 5);
      const consumerRate = perSecond(written, startedAt);
      await consumerSide.bus.stop({ timeoutMs: 10_000 });
      await consumerSide.transport.close();

      // All at once: from the first commit to the last message handled.
      const together = parts.bus();
      parts.handled = 0;
      await together.bus.start();
      startedAt = performance.now();
      const sent = await parts.produce(together.bus, seconds);
      await until(() => parts.handled >= sent, 600_000, `${sent} messages end to end`, 5);
      const endToEnd = perSecond(sent, startedAt);
      await together.bus.stop({ timeoutMs: 10_000 });
      await together.transport.close();

      const unit = 'msg/s';
      report.measure(`producers alone (${WRITERS} writers, nothing draining)`, producerRate, unit);
      report.measure('relay alone (drains their backlog, no consumer)', relayRate, unit);
      report.measure(`consumer alone (inbox, concurrency ${CONCURRENCY})`, consumerRate, unit);
      const slowest = Math.min(producerRate, relayRate, consumerRate);
      const slowestName = slowest === producerRate ? 'producers' : slowest === relayRate ? 'relay' : 'consumer';
      report.measure(`slowest part alone (${slowestName})`, slowest, unit);
      const measured = report.measure('end to end, all at once (first commit → last handled)', endToEnd, unit, { vs: `slowest part alone (${slowestName})` });
      report.target('end to end ≥ 0.80 × its slowest part alone (one process)', `${measured.ratio?.toFixed(3)}`, (measured.ratio ?? 0) >= 0.8);
      report.note(
        `${written.toLocaleString('en-US')} then ${sent.toLocaleString('en-US')} messages (${seconds} s of ${WRITERS} closed-loop producers each); one process on PostgreSQL + RabbitMQ; ` +
          'the handler does nothing but the inbox record. The separate-processes variant of this target is not measured yet.',
      );
    } finally {
      await broker.close();
      await db.close();
    }
  },
};
