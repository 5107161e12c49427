import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig } from '@courier/sql-engine';
import type { Pool, PoolClient } from 'pg';
import { PgExecutor } from './pg-executor.js';
import { TransactionStatusWatch } from './transaction-status.js';

/** Arguments shared by {@link PgOutboxStore} and {@link PgInboxStore}. */
export interface PgStoreConfig extends CourierTablesConfig {
  /** The application's `pg` Pool: the relay's and the consumer's statements run on it (not ended by the store). */
  readonly pool: Pool;
  /**
   * Run the store's statements as named prepared statements, parsed and planned once per
   * connection. Default true. Turn off behind a pooler that cannot keep prepared statements
   * across transactions (PgBouncer in transaction mode before 1.21).
   */
  readonly preparedStatements?: boolean;
}

/**
 * The engine's store core on node-postgres: names from the config, the PostgreSQL dialect,
 * a {@link PgExecutor} on the pool, this package's remedies in its errors, and the
 * transaction status of the pool's clients.
 */
export class PgStoreCore extends SqlStoreCore<PoolClient, PgExecutor> {
  /** The transaction status of clients (the pool's from their creation, others from first sight). */
  readonly status = new TransactionStatusWatch();
  readonly pool: Pool;

  constructor(config: PgStoreConfig, what: string) {
    if (config === null || typeof config !== 'object' || config.pool === null || typeof config.pool !== 'object' || typeof config.pool.connect !== 'function') {
      throw new ConfigError(`${what}: 'pool' is required: pass the application's pg Pool (new pg.Pool({ connectionString }))`);
    }
    const names = resolveTableNames(config);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new PgExecutor(config.pool, { preparedStatements: config.preparedStatements !== false }),
      dialect: createDialect('postgresql', names),
      names,
      what,
      packageName: '@courier/pg',
      schemaHint: `create it with \`await store.ensureSchema()\` (or \`courier schema create\`${options.length > 0 ? ` with { ${options.join(', ')} }` : ''})`,
    });
    this.pool = config.pool;
    this.status.followPool(config.pool);
  }
}
