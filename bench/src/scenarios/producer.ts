// 1. Producer: Courier's outbox publish vs the same MikroORM business write with a
// hand-written outbox insert (and raw node-postgres as a second line).
import { InMemoryBroker, createBus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { ADAPTER_PAIRS, adapterProducers } from '../adapter-producers.js';
import { closedLoop, handWrittenInsert } from '../ceilings.js';
import { openDb, OrderPlaced, orderPayload, outboxValues } from '../setup.js';
import { interleaved, type Scenario } from './context.js';

export const WRITERS = 8;

export const producerScenario: Scenario = {
  id: 1,
  name: 'producer commits (PostgreSQL)',
  services: ['postgresql'],
  async run({ quick, prefix, report, shared }) {
    const db = await openDb('postgresql', { prefix, poolMax: WRITERS + 2 });
    const adapters = adapterProducers(db, prefix, WRITERS);
    const broker = new InMemoryBroker();
    const transport = broker.connect();
    // The producer side only: no relay runs, so the transport is never used.
    const bus = createBus<EntityManager>({ outbox: db.outbox, transport });
    let serial = 0;
    const nextId = () => `o-${(serial += 1)}`;
    const order = (em: EntityManager, id: string) => em.persist(em.create(db.Order, { id, customerId: `c-${id.slice(-6)}`, totalCents: 12_345, createdAt: new Date() }));
    const insert = handWrittenInsert(db);
    const seconds = quick ? 1 : 4;
    // Each A/B pair runs back to back in every round; the other adapters' pairs (issue 31) after MikroORM's.
    const modes = ['business write only', 'hand-written outbox (MikroORM)', 'Courier outbox publish', 'Courier outbox publish, keyless', ...ADAPTER_PAIRS.flatMap((pair) => [pair.hand, pair.courier])] as const;
    try {
      const rates = await interleaved(modes, quick ? 1 : 3, (mode) =>
        closedLoop(WRITERS, seconds, async () => {
          const id = nextId();
          switch (mode) {
            case 'business write only':
              await db.orm.em.fork().transactional(async (em) => {
                order(em, id);
              });
              return;
            case 'hand-written outbox (MikroORM)':
              await db.orm.em.fork().transactional(async (em) => {
                order(em, id);
                await em.getConnection().execute(insert, outboxValues(id), 'run', em.getTransactionContext());
              });
              return;
            case 'Courier outbox publish':
              await db.orm.em.fork().transactional(async (em) => {
                order(em, id);
                bus.outbox(em).publish(OrderPlaced, orderPayload(id), { key: id });
              });
              return;
            case 'Courier outbox publish, keyless':
              // No key, so no per-key lock: beside the keyed line, what the lock costs.
              await db.orm.em.fork().transactional(async (em) => {
                order(em, id);
                bus.outbox(em).publish(OrderPlaced, orderPayload(id));
              });
              return;
            default:
              await adapters.run[mode](id);
              return;
          }
        }),
      );
      const unit = `commits/s (${WRITERS} writers)`;
      report.measure('business write only', rates['business write only'], unit, { note: 'no outbox row' });
      report.measure('hand-written outbox (MikroORM)', rates['hand-written outbox (MikroORM)'], unit);
      for (const pair of ADAPTER_PAIRS) report.measure(pair.hand, rates[pair.hand], unit, { note: `${pair.library}: order row + outbox row in one transaction` });
      const courier = report.measure('Courier outbox publish', rates['Courier outbox publish'], unit, { vs: 'hand-written outbox (MikroORM)' });
      report.measure('Courier outbox publish, keyless', rates['Courier outbox publish, keyless'], unit, { vs: 'hand-written outbox (MikroORM)', note: 'no key: no per-key lock' });
      report.measure('Courier outbox publish vs raw pg', rates['Courier outbox publish'], unit, { vs: 'hand-written outbox (raw pg)' });
      report.target('producer ≥ 0.95 × hand-written MikroORM outbox', `${courier.ratio?.toFixed(3)}`, (courier.ratio ?? 0) >= 0.95);
      for (const pair of ADAPTER_PAIRS) {
        const line = report.measure(pair.courier, rates[pair.courier], unit, { vs: pair.hand });
        report.target(`producer on ${pair.library} ≥ 0.95 × its hand-written outbox INSERT`, `${line.ratio?.toFixed(3)}`, (line.ratio ?? 0) >= 0.95);
      }
      report.note(
        `${WRITERS} writers, each a closed loop of one transaction (one order row + one outbox row, keyed by order id); ` +
          `${quick ? 1 : 3} interleaved rounds of ${seconds} s, medians. Courier's PostgreSQL insert takes the per-key advisory lock itself (INSERT … SELECT … WHERE, no statement of its own; session prod), and a coalesced NOTIFY follows commits.`,
      );
      shared.set('producerRate', rates['Courier outbox publish']);
    } finally {
      await adapters.close();
      await transport.close();
      await db.close();
    }
  },
};
