// The one busy timeout of the SQLite store: what its statements set, and what the ORM's own
// connections should open with when several processes share a file.
import { SQLITE_BUSY_TIMEOUT_MS } from '@courier/sql-engine';
import { libsqlDriverOptionsWithTimeout, mikroOrmMajor, type MikroOrmMajor } from './mikro-orm-compat.js';

// The timeout itself is the engine's (its SQLite dialect sets it in every store transaction).
export { SQLITE_BUSY_TIMEOUT_MS } from '@courier/sql-engine';

/** The `driverOptions` {@link withSqliteBusyTimeout} returns: the timeout is in one of the two places. */
export interface SqliteBusyTimeoutDriverOptions {
  /** Where MikroORM 7 passes it to libsql (milliseconds). */
  readonly timeout?: number;
  /** Where MikroORM 6 passes it to libsql (through knex). */
  readonly connection?: { readonly timeout?: number };
}

/**
 * Returns a copy of `MikroORM.init` options for `@mikro-orm/libsql` whose connections wait
 * {@link SQLITE_BUSY_TIMEOUT_MS} for another process's lock from the moment libsql opens
 * them: `driverOptions.connection.timeout` (milliseconds) with MikroORM 6,
 * `driverOptions.timeout` with MikroORM 7 (the installed `@mikro-orm/core` decides; 7 ignores
 * the place 6 reads, and 6 the place 7 reads).
 *
 * Why it is needed: MikroORM's init reads the schema before any Courier store exists to
 * give the connection its busy timeout, and a process recovering the journal of one that
 * was killed keeps readers out for a moment — without it, a process sharing the file can
 * die at start with `database is locked`. Guarantees: `options` is not modified; every
 * other option, and every other `driverOptions` / `driverOptions.connection` entry, is kept;
 * a `timeout` you set yourself wins. Throws a `TypeError` naming the option when
 * `driverOptions` or `driverOptions.connection` is present but not an object.
 */
export function withSqliteBusyTimeout<O extends object>(options: O): O & { readonly driverOptions: SqliteBusyTimeoutDriverOptions } {
  return sqliteBusyTimeoutFor(options, mikroOrmMajor());
}

/** {@link withSqliteBusyTimeout} for a given MikroORM major (tests run both on one install). */
export function sqliteBusyTimeoutFor<O extends object>(options: O, major: MikroOrmMajor): O & { readonly driverOptions: SqliteBusyTimeoutDriverOptions } {
  // Typed loosely on purpose: MikroORM's Options has only optional fields, and a plain
  // `{ dbName, entities }` literal must be accepted as it is.
  const driverOptions = plainObject((options as { readonly driverOptions?: unknown }).driverOptions, 'driverOptions');
  const connection = plainObject(driverOptions['connection'], 'driverOptions.connection');
  return { ...options, driverOptions: libsqlDriverOptionsWithTimeout(driverOptions, connection, SQLITE_BUSY_TIMEOUT_MS, major) };
}

function plainObject(value: unknown, name: string): Record<string, unknown> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new TypeError(`withSqliteBusyTimeout: ${name} must be an object, got ${value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value}`);
  }
  return value as Record<string, unknown>;
}
