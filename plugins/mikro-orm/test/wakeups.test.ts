// PostgreSQL wake-ups: a relay in another process (here: another MikroORM on the same
// tables) hears commits through LISTEN/NOTIFY, NOTIFYs are coalesced, the LISTEN
// connection comes back after it is killed, and both can be turned off.
import { eventually } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { resolveTableNames } from '../src/index.js';
import { createMikroOrmFixture, type MikroOrmFixture, type MikroOrmFixtureOptions } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function fixture(id: string, options: MikroOrmFixtureOptions = {}): Promise<MikroOrmFixture> {
  const created = await createMikroOrmFixture('postgresql', { testId: id }, options);
  open.push(created);
  return created;
}

async function commit(producer: MikroOrmFixture, key: string | null = 'k'): Promise<void> {
  await producer.transaction(async (em) => producer.outbox.append(em, [{ envelope: envelope('wake', key) }]));
}

/** The part of knex's client the store opens LISTEN connections with (a raw `pg.Client`). */
interface RawConnectionSource {
  acquireRawConnection(): Promise<{ processID: number; query(sql: string): Promise<unknown> }>;
}

/** Backend pids LISTENing on the channel of `prefix`. */
async function listeners(observer: MikroOrmFixture, prefix: string): Promise<number[]> {
  const channel = resolveTableNames({ tablePrefix: prefix }).channel;
  const rows = await observer.sql(`SELECT pid FROM pg_stat_activity WHERE query = ?`, [`LISTEN "${channel}"`]);
  return rows.map((row) => Number(row['pid']));
}

describe('PostgreSQL LISTEN/NOTIFY wake-ups', () => {
  it('a relay of another process hears commits, and NOTIFYs are coalesced', async () => {
    const id = testId();
    const producer = await fixture(id);
    const relay = await fixture(id);
    let heard = 0;
    const stop = await relay.outbox.watch(() => {
      heard += 1;
    });
    try {
      await commit(producer);
      await eventually(() => expect(heard).toBeGreaterThan(0), { timeoutMs: 5_000 });
      heard = 0;
      const commits = 40;
      const started = Date.now();
      // A burst (the pool runs 10 at once), so there is something to coalesce even on a
      // loaded machine where one commit after another would each take over 50 ms.
      await Promise.all(Array.from({ length: commits }, (_, index) => commit(producer, `k${index}`)));
      await eventually(() => expect(heard).toBeGreaterThan(0), { timeoutMs: 5_000 });
      const count = heard;
      // At most one NOTIFY per 50 ms per process, whatever the commit rate: bounded by the
      // time taken, not by a guess of how fast the commits run.
      expect(count).toBeLessThanOrEqual(Math.ceil((Date.now() - started) / 50) + 1);
    } finally {
      await stop();
    }
    expect(await listeners(producer, relay.tablePrefix)).toEqual([]);
  });

  it('re-LISTENs after its connection is killed and wakes its listeners once on return', async () => {
    const id = testId();
    const producer = await fixture(id);
    const relay = await fixture(id);
    let heard = 0;
    const stop = await relay.outbox.watch(() => {
      heard += 1;
    });
    try {
      const [pid] = await listeners(producer, relay.tablePrefix);
      expect(pid).toBeGreaterThan(0);
      await producer.sql('SELECT pg_terminate_backend(?)', [pid]);
      await eventually(
        async () => {
          const now = await listeners(producer, relay.tablePrefix);
          expect(now).toHaveLength(1);
          expect(now[0]).not.toBe(pid);
        },
        { timeoutMs: 10_000 },
      );
      await eventually(() => expect(heard).toBeGreaterThan(0), { timeoutMs: 5_000 });
      heard = 0;
      await commit(producer);
      await eventually(() => expect(heard).toBeGreaterThan(0), { timeoutMs: 5_000 });
    } finally {
      await stop();
    }
  });

  it('closes the raw connection when LISTEN fails, and LISTENs on a fresh one later', async () => {
    const id = testId();
    const observer = await fixture(id);
    const relay = await fixture(id);
    // The store takes its LISTEN connections from this knex client.
    const client = (relay.orm.em.getConnection('write') as unknown as { getKnex(): { client: RawConnectionSource } }).getKnex().client;
    const acquire = client.acquireRawConnection.bind(client);
    const refused: number[] = [];
    client.acquireRawConnection = async () => {
      const connection = await acquire();
      if (refused.length === 0) {
        // Leave the first session in an aborted transaction: the server refuses the LISTEN
        // that follows (25P02), and the session stays open unless someone closes it.
        await connection.query('BEGIN');
        await connection.query('SELECT 1/0').catch(() => undefined);
        refused.push(connection.processID);
      }
      return connection;
    };
    const stop = await relay.outbox.watch(() => undefined);
    try {
      expect(refused).toHaveLength(1);
      await eventually(async () => expect(await observer.sql('SELECT pid FROM pg_stat_activity WHERE pid = ?', [refused[0]])).toEqual([]), {
        timeoutMs: 5_000,
      });
      await eventually(async () => expect(await listeners(observer, relay.tablePrefix)).toHaveLength(1), { timeoutMs: 10_000 });
    } finally {
      await stop();
    }
    expect(await listeners(observer, relay.tablePrefix)).toEqual([]);
  });

  it('with wake-ups off (PgBouncer transaction mode) there is no LISTEN, and in-process signals still arrive', async () => {
    const id = testId();
    const quiet = await fixture(id, { outbox: { wakeups: false } });
    let heard = 0;
    const stop = await quiet.outbox.watch(() => {
      heard += 1;
    });
    try {
      expect(await listeners(quiet, quiet.tablePrefix)).toEqual([]);
      await commit(quiet);
      await eventually(() => expect(heard).toBeGreaterThan(0), { timeoutMs: 5_000 });
    } finally {
      await stop();
    }
  });
});
