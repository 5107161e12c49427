// What joining means on mysql2, as the README states it, on MariaDB: a rollback to a
// savepoint takes only what followed it while the transaction commits its own messages, the
// same key included; a Pool, a callback-API connection, a connection in autocommit and one
// whose withTransaction ended are refused with a ConfigError naming the fix, writing nothing.
import { uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import type { PoolConnection } from 'mysql2/promise';
import { afterEach, describe, expect, it } from 'vitest';
import { settleAppends, withTransaction } from '../src/index.js';
import { createMysql2Fixture, type Mysql2Fixture } from './support/fixture.js';

const fixtures: Mysql2Fixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function open() {
  const fixture = await createMysql2Fixture({ testId: uniqueId() });
  fixtures.push(fixture);
  const Work = defineMessage('mysql2.Work', { version: 1, topic: 'mysql2.work' });
  const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
  // MySQL/MariaDB keep ids in a binary column: the driver returns a Buffer.
  const rows = async () =>
    (await fixture.sql(`SELECT message_id FROM ${fixture.table('outbox')} ORDER BY seq`)).map((row) =>
      Buffer.isBuffer(row['message_id']) ? row['message_id'].toString('utf8') : String(row['message_id']),
    );
  return { fixture, Work, bus, rows };
}

/** The error `work` throws or rejects with (undefined when it succeeds). */
async function failureOf(work: () => unknown): Promise<unknown> {
  try {
    await work();
    return undefined;
  } catch (error) {
    return error;
  }
}

describe('joining a mysql2 transaction on MariaDB', () => {
  it('a rollback to a savepoint takes only what followed it; the rest commits, the same key included', async () => {
    const { fixture, Work, bus, rows } = await open();
    const connection = await fixture.pool.getConnection();
    try {
      await connection.beginTransaction();
      const before = await bus.outbox(connection).publish(Work, { n: 1 }, { key: 'k' });
      await connection.query('SAVEPOINT courier_sp');
      // Not awaited: the writes started belong to the savepoint; settleAppends waits for them
      // before rolling back to it.
      void bus.outbox(connection).publish(Work, { n: 2 }, { key: 'k' });
      void bus.outbox(connection).publish(Work, { n: 3 }, { key: 'other' });
      await settleAppends(connection);
      await connection.query('ROLLBACK TO SAVEPOINT courier_sp');
      const after = await bus.outbox(connection).publish(Work, { n: 4 }, { key: 'k' });
      await connection.commit();
      expect(await rows()).toEqual([before, after]);
      const claimed = await fixture.outbox.claim({ owner: 'test', limit: 10, leaseMs: 30_000, perKey: 10 });
      expect(claimed.records.map((record) => record.envelope.messageId)).toEqual([before, after]);
    } finally {
      connection.release();
    }
  });

  it('refuses a Pool, a callback-API connection, a connection in autocommit and an ended one, writing nothing', async () => {
    const { fixture, Work, bus, rows } = await open();
    const fromPool = await failureOf(() => bus.outbox(fixture.pool as unknown as PoolConnection).publish(Work, { n: 1 }));
    expect(fromPool).toBeInstanceOf(ConfigError);
    expect(fromPool).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('withTransaction(pool') });

    const connection = await fixture.pool.getConnection();
    try {
      const callbackApi = connection.connection as unknown as PoolConnection;
      const fromCallback = await failureOf(() => bus.outbox(callbackApi).publish(Work, { n: 2 }));
      expect(fromCallback).toBeInstanceOf(ConfigError);
      expect(fromCallback).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('connection.promise()') });

      // Autocommit: publish starts the write; its promise rejects when the check runs, and
      // settleAppends reports the same refusal to a commit path that did not await it.
      const published = bus.outbox(connection).publish(Work, { n: 3 });
      expect(published).toBeInstanceOf(Promise);
      const autocommit = await failureOf(() => published);
      expect(autocommit).toBeInstanceOf(ConfigError);
      expect(autocommit).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('beginTransaction()') });
      expect(await failureOf(() => settleAppends(connection))).toBe(autocommit);
    } finally {
      connection.release();
    }

    let kept: PoolConnection | undefined;
    await withTransaction(fixture.pool, async (conn) => {
      kept = conn;
    });
    const late = await failureOf(() => bus.outbox(kept!).publish(Work, { n: 4 }));
    expect(late).toBeInstanceOf(ConfigError);
    expect(late).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    expect(await rows()).toEqual([]);
  });
});
