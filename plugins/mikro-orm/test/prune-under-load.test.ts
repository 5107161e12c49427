// prune deletes in bounded batches that never make producers wait: while it works
// through a large published history, producers keep committing under a short lock
// timeout, and none of them times out.
import type { EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type FixtureDialect, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const HISTORY = 30_000;
const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function seedHistory(fixture: MikroOrmFixture): Promise<void> {
  const outbox = fixture.table('outbox');
  const inbox = fixture.table('inbox');
  if (fixture.dialect === 'postgresql') {
    await fixture.sql(
      `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at, published_at) ` +
        `SELECT 'old-' || i, 'seed.Type', 1, 'seed', 'k' || (i % 50), md5('k' || (i % 50)), '2024-01-01T00:00:00.000Z', 'old-' || i, '{}', '{}', 'published', ` +
        `now() - interval '2 days', 0, now() - interval '2 days', now() - interval '2 days' FROM generate_series(1, ${HISTORY}) AS i`,
    );
    await fixture.sql(`INSERT INTO ${inbox} (message_id, consumer, processed_at) SELECT 'old-' || i, 'c', now() - interval '2 days' FROM generate_series(1, ${HISTORY}) AS i`);
  } else {
    await fixture.sql(
      `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at, published_at) ` +
        `SELECT CONCAT('old-', seq), 'seed.Type', 1, 'seed', CONCAT('k', seq % 50), MD5(CONCAT('k', seq % 50)), '2024-01-01T00:00:00.000Z', CONCAT('old-', seq), '{}', '{}', 'published', ` +
        `UTC_TIMESTAMP(3) - INTERVAL 2 DAY, 0, UTC_TIMESTAMP(3) - INTERVAL 2 DAY, UTC_TIMESTAMP(3) - INTERVAL 2 DAY FROM seq_1_to_${HISTORY}`,
    );
    await fixture.sql(`INSERT INTO ${inbox} (message_id, consumer, processed_at) SELECT CONCAT('old-', seq), 'c', UTC_TIMESTAMP(3) - INTERVAL 2 DAY FROM seq_1_to_${HISTORY}`);
  }
}

/** Makes the transaction of `em` give up on any lock wait after a short time. */
async function shortLockTimeout(fixture: MikroOrmFixture, em: EntityManager): Promise<void> {
  const trx = em.getTransactionContext();
  const sql = fixture.dialect === 'postgresql' ? `SET LOCAL lock_timeout = '200ms'` : 'SET SESSION innodb_lock_wait_timeout = 1';
  await em.getConnection().execute(sql, [], 'run', trx);
}

describe.each(['postgresql', 'mariadb'] as FixtureDialect[])('prune under load (%s)', (dialect) => {
  it('producers and the inbox keep committing under a short lock timeout while prune runs', { timeout: 120_000 }, async () => {
    const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(fixture);
    await seedHistory(fixture);
    let pruning = true;
    const failures: unknown[] = [];
    let commits = 0;
    const producer = async (index: number): Promise<void> => {
      let round = 0;
      while (pruning || round < 5) {
        round += 1;
        try {
          await fixture.transaction(async (em) => {
            await shortLockTimeout(fixture, em);
            // Own keys per producer (so only prune could make them wait), plus keyless rows.
            fixture.outbox.append(em, [{ envelope: envelope('load', `p${index}-${round % 3}`) }, { envelope: envelope('load', null) }]);
            await fixture.recordEffect(em, `p${index}-${round}`);
          });
          await fixture.inbox.run(`new-${index}-${round}`, 'c', async (em) => {
            await shortLockTimeout(fixture, em);
          });
          commits += 1;
        } catch (error) {
          failures.push(error);
        }
      }
    };
    const relay = async (): Promise<void> => {
      while (pruning) {
        const batch = await fixture.outbox.claim({ owner: 'relay', limit: 50, leaseMs: 30_000, perKey: 1 });
        if (batch.records.length > 0) await fixture.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
      }
    };
    const producers = Array.from({ length: 4 }, (_, index) => producer(index));
    const relaying = relay();
    const started = Date.now();
    const [outboxPruned, inboxPruned] = await Promise.all([
      fixture.outbox.prune(24 * 3_600_000, { batchSize: 500 }),
      fixture.inbox.prune(24 * 3_600_000, { batchSize: 500 }),
    ]).finally(() => {
      pruning = false;
    });
    const pruneMs = Date.now() - started;
    await Promise.all([...producers, relaying]);
    expect(failures.map(String)).toEqual([]);
    expect(outboxPruned).toBe(HISTORY);
    expect(inboxPruned).toBe(HISTORY);
    expect(commits).toBeGreaterThanOrEqual(20);
    console.log(`[prune-under-load] ${dialect}: pruned ${outboxPruned} outbox + ${inboxPruned} inbox rows in ${pruneMs} ms while producers committed ${commits} units of work; no lock timeout`);
  });
});
