// 6. Inbox: handler transactions per second with deduplication vs without.
import { closedLoop } from '../ceilings.js';
import { openDb } from '../setup.js';
import { interleaved, type Scenario } from './context.js';

const WORKERS = 8;

export const inboxScenario: Scenario = {
  id: 6,
  name: 'inbox: handler transactions with dedup vs without',
  services: ['postgresql'],
  async run({ quick, prefix, report }) {
    const db = await openDb('postgresql', { prefix, poolMax: WORKERS + 2 });
    let serial = 0;
    const seconds = quick ? 1 : 4;
    const modes = ['handler transaction, no inbox', 'Courier consumer path, first delivery (inbox.run)', 'redelivered suspect (recordStart + inbox.run)'] as const;
    try {
      const rates = await interleaved(modes, quick ? 1 : 3, (mode) =>
        closedLoop(WORKERS, seconds, async () => {
          serial += 1;
          const messageId = `m-${serial}`;
          // The handler's effect: one business row written through the unit of work.
          const effect = (em: import('@mikro-orm/core').EntityManager) => {
            em.persist(em.create(db.Order, { id: messageId, customerId: 'c-1', totalCents: 12_345, createdAt: new Date() }));
            return Promise.resolve();
          };
          switch (mode) {
            case 'handler transaction, no inbox':
              await db.orm.em.fork().transactional(effect);
              return;
            case 'Courier consumer path, first delivery (inbox.run)':
              await db.inbox.run(messageId, 'bench', effect);
              return;
            case 'redelivered suspect (recordStart + inbox.run)':
              await db.inbox.recordStart(messageId, 'bench');
              await db.inbox.run(messageId, 'bench', effect);
              return;
          }
        }),
      );
      const unit = `tx/s (${WORKERS} workers)`;
      report.measure('handler transaction, no inbox', rates['handler transaction, no inbox'], unit);
      const courier = report.measure('Courier consumer path, first delivery (inbox.run)', rates['Courier consumer path, first delivery (inbox.run)'], unit, { vs: 'handler transaction, no inbox' });
      report.measure('redelivered suspect (recordStart + inbox.run)', rates['redelivered suspect (recordStart + inbox.run)'], unit, { vs: 'handler transaction, no inbox' });
      report.target('inbox ≥ 0.90 × no inbox', `${courier.ratio?.toFixed(3)}`, (courier.ratio ?? 0) >= 0.9);
      report.note(
        `store level, no broker: ${WORKERS} closed loops, ${quick ? 1 : 3} interleaved rounds of ${seconds} s, medians. A first delivery costs one ` +
          `commit (inbox.run); only a delivery the transport flags redelivered is a crash-loop suspect, whose start is counted first ` +
          `(recordStart, its own committed transaction), so it costs two.`,
      );
    } finally {
      await db.close();
    }
  },
};
