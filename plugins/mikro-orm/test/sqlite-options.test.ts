// withSqliteBusyTimeout is what users are told to wrap their libsql options in
// (README, "SQLite shared by several processes"); sqlite-fresh-connection.test.ts shows the
// timeout it sets is waited on, this file holds its merging rules.
import { describe, expect, it } from 'vitest';
import { SQLITE_BUSY_TIMEOUT_MS, withSqliteBusyTimeout } from '../src/index.js';

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
    // Typed as MikroORM options are: an object literal with no option it reads is a TS weak-type error.
    const options: { dbName: string; driverOptions?: unknown } = { dbName: 'shop.db' };
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
});
