// Database errors become StorageErrors whose `retriable` flag tells the engine whether
// to retry: connection loss, deadlocks, lock and statement timeouts and serialization
// failures are retriable; constraint and syntax errors are not.
import { eventually } from '@courier/conformance';
import { StorageError } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { classifyDriverError } from '../src/index.js';
import { driverMessage, toStorageError } from '@courier/sql-engine';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { claimAll, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

function driverError(fields: Record<string, unknown>, message = 'driver error'): Error {
  return Object.assign(new Error(message), fields);
}

describe('classifyDriverError', () => {
  it.each([
    ['PostgreSQL serialization failure', { code: '40001' }, 'transient'],
    ['PostgreSQL deadlock', { code: '40P01' }, 'transient'],
    ['PostgreSQL lock timeout', { code: '55P03' }, 'transient'],
    ['PostgreSQL statement timeout', { code: '57014' }, 'transient'],
    ['PostgreSQL admin shutdown', { code: '57P01' }, 'transient'],
    ['PostgreSQL connection failure', { code: '08006' }, 'transient'],
    ['PostgreSQL unique violation', { code: '23505' }, 'duplicate'],
    ['PostgreSQL not-null violation', { code: '23502' }, 'permanent'],
    ['PostgreSQL syntax error', { code: '42601' }, 'permanent'],
    ['PostgreSQL invalid byte sequence', { code: '22021' }, 'permanent'],
    ['PostgreSQL untranslatable character', { code: '22P05' }, 'permanent'],
    ['PostgreSQL value too long', { code: '22001' }, 'permanent'],
    ['PostgreSQL NUL in the statement text', { code: '08P01' }, 'permanent', 'INSERT INTO t VALUES (\'a\u0000\') - invalid message format'],
    ['PostgreSQL other protocol violation', { code: '08P01' }, 'transient'],
    ['MySQL data too long', { errno: 1406, code: 'ER_DATA_TOO_LONG' }, 'permanent'],
    ['MySQL incorrect string value', { errno: 1366, code: 'ER_TRUNCATED_WRONG_VALUE_FOR_FIELD' }, 'permanent'],
    ['MySQL packet too large', { errno: 1153, code: 'ER_NET_PACKET_TOO_LARGE', fatal: true }, 'permanent'],
    ['SQLite too big', { code: 'SQLITE_TOOBIG' }, 'permanent'],
    ['PostgreSQL missing table', { code: '42P01' }, 'schema'],
    ['MySQL deadlock', { errno: 1213, code: 'ER_LOCK_DEADLOCK' }, 'transient'],
    ['MySQL lock wait timeout', { errno: 1205, code: 'ER_LOCK_WAIT_TIMEOUT' }, 'transient'],
    ['MySQL server gone', { errno: 2006 }, 'transient'],
    ['MySQL duplicate key', { errno: 1062, code: 'ER_DUP_ENTRY' }, 'duplicate'],
    ['MySQL syntax error', { errno: 1064, code: 'ER_PARSE_ERROR' }, 'permanent'],
    ['MySQL missing table', { errno: 1146, code: 'ER_NO_SUCH_TABLE' }, 'schema'],
    ['mariadb connector socket closed', { errno: 45009, code: 'ER_SOCKET_UNEXPECTED_CLOSE' }, 'transient'],
    ['SQLite busy', { code: 'SQLITE_BUSY' }, 'transient'],
    ['connection refused', { code: 'ECONNREFUSED' }, 'transient'],
  ] as const)('%s is %s', (_, fields, kind, message?: string) => {
    expect(classifyDriverError(driverError(fields, message))).toBe(kind);
  });

  it('looks through cause chains and knows pg client messages', () => {
    expect(classifyDriverError(new Error('wrapped', { cause: driverError({ code: '40P01' }) }))).toBe('transient');
    expect(classifyDriverError(new Error('Connection terminated unexpectedly'))).toBe('transient');
    expect(classifyDriverError(new Error('something else'))).toBe('permanent');
  });

  it('toStorageError sets retriable and codes accordingly', () => {
    expect(toStorageError(driverError({ code: '40001' }), 'claim', 'hint')).toMatchObject({ retriable: true, code: 'STORAGE' });
    expect(toStorageError(driverError({ errno: 1062 }), 'append', 'hint')).toMatchObject({ retriable: false, code: 'DUPLICATE_MESSAGE_ID' });
    expect(toStorageError(driverError({ code: '42601' }), 'claim', 'hint')).toMatchObject({ retriable: false, code: 'STORAGE' });
    const schema = toStorageError(driverError({ code: '42P01' }), 'claim', 'run the migrations');
    expect(schema).toMatchObject({ retriable: false, code: 'SCHEMA_MISSING' });
    expect(schema.message).toMatch(/run the migrations/);
  });
});

describe('real failures', () => {
  it.each(['postgresql', 'mariadb'] as const)('%s: a killed connection is a retriable StorageError, and a retry works', async (dialect) => {
    const fixture = await createMikroOrmFixture(dialect, { testId: testId() }, { orm: { pool: { min: 1, max: 1 } } });
    const killer = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(fixture, killer);
    const [row] = await fixture.sql(dialect === 'postgresql' ? 'SELECT pg_backend_pid() AS pid' : 'SELECT CONNECTION_ID() AS pid');
    const pid = Number(row?.['pid']);
    await killer.sql(dialect === 'postgresql' ? 'SELECT pg_terminate_backend(?)' : `KILL ${pid}`, dialect === 'postgresql' ? [pid] : []);
    const error = await claimAll(fixture).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    // Some pools notice the dead connection before using it; then the claim just works.
    if (error !== undefined) {
      expect(error).toBeInstanceOf(StorageError);
      expect((error as StorageError).retriable).toBe(true);
    }
    // The pool discards the dead connection; a retry (the relay backs off and retries) works.
    await eventually(async () => expect((await claimAll(fixture)).records).toEqual([]), { timeoutMs: 10_000 });
  });

  // Issue 29: a value the database cannot store fails the same way every time. PostgreSQL
  // answered a statement holding U+0000 with 08P01 "invalid message format", which was taken
  // for a connection problem ("a retry may succeed"); MariaDB refuses 64 KiB in TEXT (1406).
  // The message named the whole statement with its bound values (message bodies).
  it.each([
    ['postgresql', 'CREATE TABLE %t (v text)', 'secret-body-\u0000-value'],
    ['postgresql', 'CREATE TABLE %t (v varchar(10))', 'secret-body-too-long-for-ten'],
    ['mariadb', 'CREATE TABLE %t (v TEXT)', `secret-body-${'x'.repeat(70_000)}`],
  ] as const)('%s: a value it cannot store (%s) is a non-retriable StorageError naming the driver message, not the values', async (dialect, create, value) => {
    const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(fixture);
    const table = `${testId()}_unstorable`;
    await fixture.sql(create.replace('%t', table));
    try {
      const error = await fixture.sql(`INSERT INTO ${table} (v) VALUES (?)`, [value]).then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect(error, 'the database refused the value').toBeDefined();
      const mapped = toStorageError(error, 'append', 'hint');
      expect(mapped).toMatchObject({ retriable: false, code: 'STORAGE' });
      expect(mapped.message).toMatch(/^'append' failed: /);
      expect(mapped.message, 'no bound value in the message').not.toContain('secret-body');
      expect(mapped.message, 'no statement in the message').not.toMatch(/INSERT INTO/i);
      expect(driverMessage(error).length).toBeGreaterThan(0);
      expect(String((mapped.cause as Error).message), 'the statement stays in the cause').toMatch(/INSERT INTO/i);
    } finally {
      await fixture.sql(`DROP TABLE ${table}`);
    }
  });

  it('a syntax error of the database is not retriable', async () => {
    const fixture = await createMikroOrmFixture('postgresql', { testId: testId() });
    open.push(fixture);
    const error = await fixture.sql('SELEC 1').then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(toStorageError(error, 'probe', 'hint')).toMatchObject({ retriable: false });
  });
});
