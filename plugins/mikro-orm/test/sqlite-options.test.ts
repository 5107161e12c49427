// withSqliteBusyTimeout is what users are told to wrap their libsql options in
// (README, "SQLite shared by several processes"); sqlite-fresh-connection.test.ts shows the
// timeout it sets is waited on, this file holds its merging rules.
import { describe, expect, it } from 'vitest';
import { SQLITE_BUSY_TIMEOUT_MS, withSqliteBusyTimeout } from '../src/index.js';
import { mikroOrmMajor } from '../src/mikro-orm-compat.js';
import { sqliteBusyTimeoutFor } from '../src/sqlite-options.js';

describe('withSqliteBusyTimeout', () => {
  it('adds the store busy timeout and keeps every other option', () => {
    const options = { dbName: 'shop.db', debug: false, driverOptions: { url: 'file:x', connection: { intMode: 'number' } } };
    expect(withSqliteBusyTimeout(options)).toEqual({
      dbName: 'shop.db',
      debug: false,
      driverOptions: { url: 'file:x', connection: { intMode: 'number', timeout: SQLITE_BUSY_TIMEOUT_MS } },
    });
  });

  it('works without driver options and does not modify what it was given', () => {
    const options = { dbName: 'shop.db' };
    const frozen = Object.freeze({ ...options, driverOptions: Object.freeze({ connection: Object.freeze({}) }) });
    expect(withSqliteBusyTimeout(options).driverOptions).toEqual({ connection: { timeout: 30_000 } });
    expect(options).toEqual({ dbName: 'shop.db' });
    expect(withSqliteBusyTimeout(frozen).driverOptions).toEqual({ connection: { timeout: 30_000 } });
  });

  it("lets the user's own timeout win", () => {
    expect(withSqliteBusyTimeout({ driverOptions: { connection: { timeout: 5_000 } } }).driverOptions).toEqual({ connection: { timeout: 5_000 } });
  });

  it('names the option that is not an object', () => {
    expect(() => withSqliteBusyTimeout({ driverOptions: 'file:x' })).toThrow('withSqliteBusyTimeout: driverOptions must be an object, got string');
    expect(() => withSqliteBusyTimeout({ driverOptions: { connection: null } })).toThrow('driverOptions.connection must be an object, got null');
  });

  it('follows the installed MikroORM major (the workspace tests with 6)', () => {
    expect(mikroOrmMajor()).toBe(6);
    expect(withSqliteBusyTimeout({}).driverOptions).toEqual(sqliteBusyTimeoutFor({}, 6).driverOptions);
  });

  // MikroORM 7 opens libsql's Database with driverOptions itself and ignores
  // driverOptions.connection (a busy timeout of 0 there: scripts/pack-smoke.mjs --mikro-orm 7
  // reads PRAGMA busy_timeout on a fresh ORM to prove it end to end).
  it('puts the timeout at the top of driverOptions for MikroORM 7, keeping every other option', () => {
    expect(sqliteBusyTimeoutFor({ dbName: 'shop.db', driverOptions: { intMode: 'number' } }, 7)).toEqual({
      dbName: 'shop.db',
      driverOptions: { intMode: 'number', timeout: SQLITE_BUSY_TIMEOUT_MS },
    });
    expect(sqliteBusyTimeoutFor({}, 7).driverOptions).toEqual({ timeout: SQLITE_BUSY_TIMEOUT_MS });
    expect(sqliteBusyTimeoutFor({ driverOptions: { timeout: 5_000 } }, 7).driverOptions).toEqual({ timeout: 5_000 });
  });
});
