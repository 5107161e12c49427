// PostgreSQL takes an append's key locks inside its INSERT (one round trip): the locks
// must still be taken before the insert draws its sequence, or a producer that waited for
// a key could commit a smaller sequence than rows committed while it waited.
import { deferred, eventually } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { keyHash, resolveTableNames } from '../src/index.js';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

describe('append key locks on PostgreSQL', () => {
  // One row with one key, and two rows of one key, take the one-key lock (and one row a
  // SELECT of the row, no VALUES list); three keys take the sorted array of locks.
  it.each([[['k']], [['k', 'k']], [['k', 'j', 'i']]])('a producer waiting for a key draws its sequence after the wait (keys %j)', async (keys) => {
    const f = await createMikroOrmFixture('postgresql', { testId: testId() });
    open.push(f);
    const topic = f.tablePrefix;
    const namespace = resolveTableNames({ tablePrefix: f.tablePrefix }).lockNamespace;
    const lockOf = (key: string) => Number.parseInt(keyHash(topic, key)!.slice(0, 8), 16) | 0;
    // Another producer of key 'k' holds its lock (as an append does from its lock to COMMIT).
    const held = deferred();
    const release = deferred();
    const holder = f.orm.em.fork().transactional(async (em) => {
      await em.getConnection().execute('SELECT pg_advisory_xact_lock(?, ?)', [namespace, lockOf('k')], 'all', em.getTransactionContext());
      held.resolve();
      await release.promise;
    });
    await held.promise;
    const waiting = keys.map((key) => envelope(topic, key));
    const waiter = f.orm.em.fork().transactional(async (em) => {
      em.persist(em.create(f.Effect, { effectId: 'waiter' }));
      f.outbox.append(
        em,
        waiting.map((env, index) => ({ envelope: env, ...(index === 1 ? { delayMs: 60_000 } : index === 2 ? { notBefore: new Date(Date.now() + 60_000) } : {}) })),
      );
    });
    await eventually(async () => {
      const rows = await f.sql(`SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::bigint = ? AND objid::bigint = ?`, [
        namespace >>> 0,
        lockOf('k') >>> 0,
      ]);
      expect(Number(rows[0]!['n'])).toBe(1);
    });
    // While it waits, a keyless producer commits: its sequence is drawn now.
    const meanwhile = envelope(topic, null);
    await f.orm.em.fork().transactional(async (em) => {
      f.outbox.append(em, [{ envelope: meanwhile }]);
    });
    release.resolve();
    await Promise.all([holder, waiter]);
    const rows = await f.sql(`SELECT message_id, seq, state FROM ${f.table('outbox')} ORDER BY seq`);
    expect(rows.map((row) => row['message_id'])).toEqual([meanwhile.messageId, ...waiting.map((env) => env.messageId)]);
    expect(rows.every((row) => row['state'] === 'pending')).toBe(true);
    expect([...(await f.readEffects())]).toEqual(['waiter']);
  });

  it('keeps the delay and the schedule of a single row inserted with its lock', async () => {
    const f = await createMikroOrmFixture('postgresql', { testId: testId() });
    open.push(f);
    const rows = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'b'), envelope(f.tablePrefix, 'c')];
    const options = [{}, { delayMs: 3_600_000 }, { notBefore: new Date(Date.UTC(2999, 0, 1)) }];
    for (const [index, row] of rows.entries()) {
      await f.orm.em.fork().transactional(async (em) => {
        f.outbox.append(em, [{ envelope: row, ...options[index] }]);
      });
    }
    const stored = await f.sql(
      `SELECT message_id, msg_key, extract(epoch FROM available_at - created_at)::bigint AS wait_s, extract(year FROM available_at AT TIME ZONE 'UTC')::int AS year FROM ${f.table('outbox')} ORDER BY seq`,
    );
    expect(stored.map((row) => [row['message_id'], row['msg_key']])).toEqual(rows.map((env) => [env.messageId, env.key]));
    expect(stored.map((row) => Number(row['wait_s']))).toEqual([0, 3_600, Number(stored[2]!['wait_s'])]);
    expect(Number(stored[2]!['year'])).toBe(2999);
  });

  it('keeps delays and schedules of rows inserted with their locks', async () => {
    const f = await createMikroOrmFixture('postgresql', { testId: testId() });
    open.push(f);
    const rows = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'b'), envelope(f.tablePrefix, null)];
    await f.orm.em.fork().transactional(async (em) => {
      f.outbox.append(em, [{ envelope: rows[0]! }, { envelope: rows[1]!, delayMs: 3_600_000 }, { envelope: rows[2]!, notBefore: new Date(Date.UTC(2999, 0, 1)) }]);
    });
    const stored = await f.sql(
      `SELECT message_id, message_version, extract(epoch FROM available_at - created_at)::bigint AS wait_s, extract(year FROM available_at AT TIME ZONE 'UTC')::int AS year FROM ${f.table('outbox')} ORDER BY seq`,
    );
    expect(stored.map((row) => [row['message_id'], Number(row['message_version'])])).toEqual(rows.map((env) => [env.messageId, env.version]));
    expect(Number(stored[0]!['wait_s'])).toBe(0);
    expect(Number(stored[1]!['wait_s'])).toBe(3_600);
    expect(Number(stored[2]!['year'])).toBe(2999);
  });
});
