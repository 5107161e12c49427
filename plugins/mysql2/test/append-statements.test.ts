// What a publish sends on MariaDB (issues 31/32): one statement, keyed or not — the INSERT
// checks that the connection is in a transaction itself (INSERT … SELECT … FROM DUAL WHERE
// @@in_transaction = 1 OR @@autocommit = 0) and takes the key's lock itself (a FOR UPDATE
// subquery on the lock table in the same WHERE), rather than a `DO 0` and a lock statement of
// their own, one round trip each in every publish. Outside a transaction that INSERT writes
// nothing and the publish is the ConfigError. An append of several rows is two statements: a
// SELECT that checks the transaction and takes the keys' locks, then the INSERT. The lock must still serialise the key's
// appenders (a second one waits for the first's commit and draws a greater seq) and must not
// hold up appenders of other keys; an append of several rows keeps their order.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { KEY_LOCK_BUCKETS, keyHash } from '@courier/sql-engine';
import type { PoolConnection } from 'mysql2/promise';
import { afterEach, describe, expect, it } from 'vitest';
import { settleAppends } from '../src/index.js';
import { createMysql2Fixture, type Mysql2Fixture } from './support/fixture.js';

const fixtures: Mysql2Fixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function open() {
  const fixture = await createMysql2Fixture({ testId: uniqueId() });
  fixtures.push(fixture);
  const Work = defineMessage('mysql2.Statements', { version: 1, topic: 'mysql2.statements' });
  const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
  return { fixture, Work, bus };
}

/** An envelope on this file's topic with `key`. */
function envelope(key: string) {
  return makeEnvelope({ topic: 'mysql2.statements', key });
}

/** Statements the server received on `connection` so far (its session's `Questions`, which the SHOW itself adds one to). */
async function questions(connection: PoolConnection): Promise<number> {
  const [rows] = await connection.query<({ Value: string } & import('mysql2').RowDataPacket)[]>(`SHOW SESSION STATUS LIKE 'Questions'`);
  return Number(rows[0]!.Value);
}

describe('the append on MariaDB (mysql2)', () => {
  it('a keyed publish is one statement, as a keyless one: the INSERT carrying the transaction check and the key lock', async () => {
    const { fixture, Work, bus } = await open();
    const connection = await fixture.pool.getConnection();
    try {
      await connection.beginTransaction();
      await bus.outbox(connection).publish(Work, { n: 0 }, { key: 'warm' });
      const before = await questions(connection);
      await bus.outbox(connection).publish(Work, { n: 1 }, { key: 'k' });
      const keyed = (await questions(connection)) - before - 1;
      const middle = await questions(connection);
      await bus.outbox(connection).publish(Work, { n: 2 });
      const keyless = (await questions(connection)) - middle - 1;
      await connection.commit();
      expect({ keyed, keyless }).toEqual({ keyed: 1, keyless: 1 });
      const rows = await fixture.sql(`SELECT msg_key FROM ${fixture.table('outbox')} ORDER BY seq`);
      expect(rows.map((row) => (row['msg_key'] === null ? null : String(row['msg_key'])))).toEqual(['warm', 'k', null]);
    } finally {
      connection.release();
    }
  });

  it("an append of several keyed rows is two statements, the check that takes the keys' locks and the INSERT; an appender of one of the keys waits for its commit", async () => {
    const { fixture, Work, bus } = await open();
    const [first, second] = await Promise.all([fixture.pool.getConnection(), fixture.pool.getConnection()]);
    try {
      await first.beginTransaction();
      await bus.outbox(first).publish(Work, { n: 0 }, { key: 'warm' });
      const rows = [envelope('b'), envelope('a'), envelope('b')];
      const before = await questions(first);
      await fixture.outbox.append(first, rows.map((row) => ({ envelope: row })));
      expect((await questions(first)) - before - 1, 'statements of the three-row append').toBe(2);

      await second.beginTransaction();
      let secondDone = false;
      const secondWritten = bus
        .outbox(second)
        .publish(Work, { n: 1 }, { key: 'a' })
        .then((id) => {
          secondDone = true;
          return id;
        });
      // The second appender is held by the first's lock on 'a' (give it time to get past it if it could).
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(secondDone).toBe(false);
      await first.commit();
      const secondId = await secondWritten;
      await second.commit();

      const stored = await fixture.sql(`SELECT message_id FROM ${fixture.table('outbox')} ORDER BY seq`);
      expect(stored.map((row) => String(row['message_id'])).slice(1)).toEqual([...rows.map((row) => row.messageId), secondId]);
    } finally {
      for (const connection of [first, second]) {
        await connection.rollback().catch(() => undefined);
        connection.release();
      }
    }
  });

  it('outside a transaction a publish is still one statement, which writes nothing: the publish is the ConfigError', async () => {
    const { fixture, Work, bus } = await open();
    const connection = await fixture.pool.getConnection();
    try {
      for (const key of ['k', undefined]) {
        const before = await questions(connection);
        const failure = await bus
          .outbox(connection)
          .publish(Work, { n: 1 }, key === undefined ? {} : { key })
          .then(
            () => undefined,
            (error: unknown) => error,
          );
        const sent = (await questions(connection)) - before - 1;
        expect(failure, `publish ${key === undefined ? 'without' : 'with'} a key`).toBeInstanceOf(ConfigError);
        expect(failure).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('beginTransaction()') });
        expect(sent, `statements of the refused publish ${key === undefined ? 'without' : 'with'} a key`).toBe(1);
        await settleAppends(connection).catch(() => undefined);
      }
      // Several keyed rows at once: the check is a statement of its own, and it writes nothing.
      const refused = await fixture.outbox.append(connection, [{ envelope: envelope('a') }, { envelope: envelope('b') }]).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(refused).toBeInstanceOf(ConfigError);
      expect(refused).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED' });
      expect(await fixture.sql(`SELECT seq FROM ${fixture.table('outbox')}`)).toEqual([]);
    } finally {
      connection.release();
    }
  });

  it('a connection with autocommit off counts as in a transaction (its INSERT opens one): a rollback leaves nothing, a commit keeps the rows in order', async () => {
    const { fixture, Work, bus } = await open();
    const connection = await fixture.pool.getConnection();
    try {
      await connection.query('SET autocommit = 0');
      await bus.outbox(connection).publish(Work, { n: 0 }, { key: 'k' });
      await connection.rollback();
      expect(await fixture.sql(`SELECT seq FROM ${fixture.table('outbox')}`)).toEqual([]);

      const rows = [envelope('b'), envelope('a'), envelope('b')];
      await fixture.outbox.append(connection, rows.map((row) => ({ envelope: row })));
      const single = await bus.outbox(connection).publish(Work, { n: 1 });
      await connection.commit();
      const stored = await fixture.sql(`SELECT message_id FROM ${fixture.table('outbox')} ORDER BY seq`);
      expect(stored.map((row) => String(row['message_id']))).toEqual([...rows.map((row) => row.messageId), single]);
    } finally {
      await connection.query('SET autocommit = 1').catch(() => undefined);
      connection.release();
    }
  });

  it("a second appender of the key waits for the first's commit and draws a greater seq; an appender of another key does not wait", async () => {
    const { fixture, Work, bus } = await open();
    const [first, second, other] = await Promise.all([fixture.pool.getConnection(), fixture.pool.getConnection(), fixture.pool.getConnection()]);
    try {
      await first.beginTransaction();
      const firstId = await bus.outbox(first).publish(Work, { n: 1 }, { key: 'k' });

      await second.beginTransaction();
      let secondDone = false;
      const secondWritten = bus
        .outbox(second)
        .publish(Work, { n: 2 }, { key: 'k' })
        .then((id) => {
          secondDone = true;
          return id;
        });

      await other.beginTransaction();
      // A key whose lock bucket differs from 'k''s (the dialect's bucket of a key hash).
      const bucket = (key: string) => Number.parseInt(keyHash('mysql2.statements', key)!.slice(0, 8), 16) % KEY_LOCK_BUCKETS;
      expect(bucket('another key')).not.toBe(bucket('k'));
      const otherId = await bus.outbox(other).publish(Work, { n: 3 }, { key: 'another key' });
      await other.commit();

      // The second appender is still held by the first's lock (give it time to get past it if it could).
      await new Promise((resolve) => setTimeout(resolve, 500));
      expect(secondDone).toBe(false);
      await first.commit();
      const secondId = await secondWritten;
      await second.commit();

      const rows = await fixture.sql(`SELECT message_id, seq FROM ${fixture.table('outbox')} ORDER BY seq`);
      const order = rows.map((row) => (Buffer.isBuffer(row['message_id']) ? row['message_id'].toString('utf8') : String(row['message_id'])));
      expect(order).toEqual([firstId, otherId, secondId]);
    } finally {
      for (const connection of [first, second, other]) {
        await connection.rollback().catch(() => undefined);
        connection.release();
      }
    }
  });
});
