import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import type { Knex } from 'knex';
import { KnexExecutor } from './knex-executor.js';

/** Arguments shared by {@link KnexOutboxStore} and {@link KnexInboxStore}. */
export interface KnexStoreConfig extends CourierTablesConfig {
  /** The application's `Knex` instance (not a transaction; not destroyed by the store). Relays and consumers open their transactions on it. */
  readonly knex: Knex;
  /** The SQL family. Default: from the knex client (`pg`, `mysql2`/`mysql`, `better-sqlite3`/`sqlite3`). */
  readonly dialect?: DialectName;
  /**
   * PostgreSQL: run Courier's statements as named prepared statements on knex's connections
   * (parsed and planned once per connection; at most 256 texts). Default `true`; set `false`
   * behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode
   * before 1.21). Ignored on MySQL/MariaDB and SQLite.
   */
  readonly preparedStatements?: boolean;
}

/** Names the SQL family of a knex instance by its client's dialect; `undefined` for one Courier does not know (MSSQL, Oracle). */
export function detectKnexDialect(knex: Knex): DialectName | undefined {
  const client = knex.client as { dialect?: unknown; config?: { client?: unknown } };
  const name = String(client.dialect ?? client.config?.client ?? '');
  if (/^(postgres|postgresql|pg|pgnative)$/i.test(name)) return 'postgresql';
  if (/^(mysql|mysql2)$/i.test(name)) return 'mysql';
  if (/^(sqlite3|better-sqlite3)$/i.test(name)) return 'sqlite';
  return undefined;
}

/** True for a `Knex.Transaction` (knex marks them; a `Knex` instance is a function without the mark). */
export function isKnexTransaction(value: unknown): value is Knex.Transaction {
  return typeof value === 'function' && (value as { isTransaction?: unknown }).isTransaction === true;
}

/**
 * The engine's store core on Knex: names and dialect from the config (the dialect read from
 * the knex client unless set), a {@link KnexExecutor} on the `Knex` instance, and this
 * package's remedies in its errors.
 */
export class KnexStoreCore extends SqlStoreCore<Knex.Transaction, KnexExecutor> {
  readonly knex: Knex;

  constructor(config: KnexStoreConfig, what: string) {
    if (config === null || typeof config !== 'object' || typeof config.knex !== 'function' || typeof config.knex.transaction !== 'function') {
      throw new ConfigError(`'knex' is required: pass the application's Knex instance`);
    }
    if (isKnexTransaction(config.knex)) {
      throw new ConfigError(`'knex' is a Knex transaction: pass the Knex instance itself (the store opens its own transactions on it; give the transaction to bus.outbox(trx) instead)`);
    }
    if (config.preparedStatements !== undefined && typeof config.preparedStatements !== 'boolean') {
      throw new ConfigError(`'preparedStatements' must be true or false, got ${JSON.stringify(config.preparedStatements)}`);
    }
    const dialectName = config.dialect ?? detectKnexDialect(config.knex);
    if (dialectName === undefined) {
      const client = String((config.knex.client as { dialect?: unknown }).dialect);
      throw new ConfigError(`the knex client '${client}' is not one Courier knows: use pg, mysql2 or better-sqlite3, or set 'dialect' to 'postgresql', 'mysql' or 'sqlite'`);
    }
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectName, names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new KnexExecutor(config.knex, dialect.name, dialect.transactionPrologue, { preparedStatements: config.preparedStatements }),
      dialect,
      names,
      what,
      packageName: '@courier/knex',
      schemaHint: `create it with \`await store.ensureSchema()\` (on a store built with { ${['knex', ...options].join(', ')} })`,
    });
    this.knex = config.knex;
  }
}
