import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import { is } from 'drizzle-orm';
import { MySqlDatabase, MySqlTransaction } from 'drizzle-orm/mysql-core';
import { PgDatabase, PgTransaction } from 'drizzle-orm/pg-core';
import { BaseSQLiteDatabase, SQLiteTransaction } from 'drizzle-orm/sqlite-core';
import { DrizzleExecutor, type DrizzleRunner } from './drizzle-executor.js';

/**
 * The transaction type of a Drizzle database `Db`: what `db.transaction(async (tx) => …)`
 * hands its callback (`NodePgTransaction<…>`, `MySql2Transaction<…>`, `LibSQLTransaction<…>`).
 */
export type DrizzleTransactionOf<Db> = Db extends { transaction(work: (tx: infer Tx) => Promise<unknown>, ...rest: never[]): Promise<unknown> } ? Tx : never;

/** Arguments shared by {@link DrizzleOutboxStore} and {@link DrizzleInboxStore}. */
export interface DrizzleStoreConfig<Db> extends CourierTablesConfig {
  /**
   * The application's Drizzle database (`drizzle(pool)` of `drizzle-orm/node-postgres`,
   * or `drizzle-orm/mysql2`), not a transaction; the store never closes
   * its client. Relays and consumers open their transactions on it.
   */
  readonly db: Db;
}

/** Names the SQL family of a Drizzle database or transaction; `undefined` for anything else. */
export function detectDrizzleDialect(db: unknown): DialectName | undefined {
  if (is(db, PgDatabase)) return 'postgresql';
  if (is(db, MySqlDatabase)) return 'mysql';
  if (is(db, BaseSQLiteDatabase)) return 'sqlite';
  return undefined;
}

/** Whether `value` is a Drizzle transaction (PostgreSQL, MySQL or SQLite). */
export function isDrizzleTransaction(value: unknown): boolean {
  return is(value, PgTransaction) || is(value, MySqlTransaction) || is(value, SQLiteTransaction);
}

/**
 * The engine's store core on Drizzle: names and dialect from the config (the dialect read from
 * the Drizzle database's class), a {@link DrizzleExecutor} on the database, and this
 * package's remedies in its errors.
 */
export class DrizzleStoreCore<Db, Tx> extends SqlStoreCore<Tx, DrizzleExecutor<Tx>> {
  readonly db: Db;

  constructor(config: DrizzleStoreConfig<Db>, what: string) {
    if (config === null || typeof config !== 'object' || config.db === null || typeof config.db !== 'object' || typeof (config.db as { transaction?: unknown }).transaction !== 'function') {
      throw new ConfigError(`'db' is required: pass the application's Drizzle database (the value of drizzle(…))`);
    }
    if (isDrizzleTransaction(config.db)) {
      throw new ConfigError(`'db' is a Drizzle transaction: pass the Drizzle database itself (the store opens its own transactions on it; give the transaction to bus.outbox(tx) instead)`);
    }
    const dialectName = detectDrizzleDialect(config.db);
    if (dialectName === undefined) {
      throw new ConfigError(`'db' (${(config.db as object).constructor?.name ?? 'an object'}) is not a Drizzle database Courier knows: use drizzle-orm/node-postgres or drizzle-orm/mysql2`);
    }
    if (dialectName === 'sqlite') {
      // Neither SQLite driver of Drizzle can join (tested in test/sqlite-drivers.test.ts and,
      // for libsql, measured on drizzle-orm 0.45 with @libsql/client 0.18):
      // - better-sqlite3: db.transaction() hands its callback to better-sqlite3's synchronous
      //   transaction, which refuses a callback returning a promise, so a publish (which awaits
      //   its INSERT) cannot run inside one;
      // - libsql: each transaction gets a new connection, BEGUN before any statement of
      //   Courier's can set a busy timeout, so concurrent writers failed with SQLITE_BUSY at
      //   once, and with the client's busy `timeout` set the conformance suite stalled.
      throw new ConfigError(
        `'db' is a Drizzle SQLite database, which @courier/drizzle cannot join: better-sqlite3's Drizzle transactions are synchronous (a publish awaits its INSERT, so it cannot run inside one) and libsql's open a connection per transaction that concurrent writers find busy; for SQLite use @courier/kysely or @courier/knex`,
      );
    }
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectName, names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new DrizzleExecutor<Tx>(config.db as unknown as DrizzleRunner, dialect.name, dialect.transactionPrologue),
      dialect,
      names,
      what,
      packageName: '@courier/drizzle',
      schemaHint: `create it with \`await store.ensureSchema()\` (on a store built with { ${['db', ...options].join(', ')} }), or add Courier's tables to your Drizzle schema (courierTables from @courier/drizzle) and run drizzle-kit`,
    });
    this.db = config.db;
  }
}
