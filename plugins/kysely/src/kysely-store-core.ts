import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import type { Kysely, Transaction } from 'kysely';
import { KyselyExecutor } from './kysely-executor.js';

/** Arguments shared by {@link KyselyOutboxStore} and {@link KyselyInboxStore}. */
export interface KyselyStoreConfig<DB> extends CourierTablesConfig {
  /** The application's `Kysely` instance (not a transaction; not destroyed by the store). Relays and consumers open their transactions on it. */
  readonly db: Kysely<DB>;
  /**
   * The SQL family of `db`. Default: read from the Kysely adapter's class
   * (`PostgresAdapter`, `MysqlAdapter`, `SqliteAdapter`, or a subclass of one); set it for a
   * third-party dialect whose adapter is none of them.
   */
  readonly dialect?: DialectName;
}

/**
 * Names the SQL family of a Kysely instance by its adapter's class chain; `undefined` for a
 * dialect Courier does not know (MSSQL, or a third-party adapter that extends none of the
 * built-in ones).
 */
export function detectKyselyDialect(db: Kysely<unknown>): DialectName | undefined {
  const adapter: unknown = db.getExecutor().adapter;
  for (let proto: unknown = Object.getPrototypeOf(adapter); proto !== null && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
    const name = (proto as { constructor?: { name?: unknown } }).constructor?.name;
    if (typeof name !== 'string') continue;
    if (/^Postgres/i.test(name)) return 'postgresql';
    if (/^(MySql|MariaDb)/i.test(name)) return 'mysql';
    if (/sqlite/i.test(name)) return 'sqlite';
  }
  return undefined;
}

/**
 * The engine's store core on Kysely: names and dialect from the config (the dialect read from
 * the Kysely adapter unless set), a {@link KyselyExecutor} on the `Kysely` instance, and this
 * package's remedies in its errors.
 */
export class KyselyStoreCore<DB> extends SqlStoreCore<Transaction<DB>, KyselyExecutor<DB>> {
  readonly db: Kysely<DB>;

  constructor(config: KyselyStoreConfig<DB>, what: string) {
    if (config === null || typeof config !== 'object' || config.db === null || typeof config.db !== 'object' || typeof config.db.transaction !== 'function') {
      throw new ConfigError(`'db' is required: pass the application's Kysely instance`);
    }
    if (config.db.isTransaction) {
      throw new ConfigError(`'db' is a Kysely transaction: pass the Kysely instance itself (the store opens its own transactions on it; give the transaction to bus.outbox(trx) instead)`);
    }
    const dialectName = config.dialect ?? detectKyselyDialect(config.db as Kysely<unknown>);
    if (dialectName === undefined) {
      const adapter = (config.db.getExecutor().adapter as object).constructor.name;
      throw new ConfigError(`the Kysely adapter '${adapter}' is not one Courier knows: use Kysely's PostgresDialect, MysqlDialect or SqliteDialect, or set 'dialect' to 'postgresql', 'mysql' or 'sqlite'`);
    }
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectName, names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new KyselyExecutor(config.db, dialect.name, dialect.transactionPrologue),
      dialect,
      names,
      what,
      packageName: '@courier/kysely',
      schemaHint: `create it with \`await store.ensureSchema()\` (on a store built with { ${['db', ...options].join(', ')} })`,
    });
    this.db = config.db;
  }
}
