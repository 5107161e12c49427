import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import { dialectOf } from './detect-dialect.js';
import type { EntityManager, Transaction } from '@mikro-orm/core';
import { SqlRunner } from './sql-runner.js';

/**
 * The part of a `MikroORM` instance the stores use: its global EntityManager, from which
 * they fork and take the write connection. Any `MikroORM` instance of a SQL driver fits.
 */
export interface MikroOrmInstance {
  readonly em: EntityManager;
}

/** Arguments shared by {@link MikroOrmOutboxStore} and {@link MikroOrmInboxStore}. */
export interface MikroOrmStoreConfig extends CourierTablesConfig {
  /** The application's initialised MikroORM (not closed by the store). */
  readonly orm: MikroOrmInstance;
  /** Overrides dialect detection from the ORM's platform. */
  readonly dialect?: DialectName;
}

/**
 * The engine's store core on MikroORM: names and dialect from the config (the dialect
 * detected from the ORM's platform unless set), a {@link SqlRunner} on the ORM's write
 * connection, and this package's remedies in its errors.
 */
export class StoreCore extends SqlStoreCore<Transaction, SqlRunner> {
  readonly orm: MikroOrmInstance;

  constructor(config: MikroOrmStoreConfig, what: string) {
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectOf(config.orm.em.getPlatform(), config.dialect), names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new SqlRunner(config.orm.em.getConnection('write'), dialect.transactionPrologue),
      dialect,
      names,
      what,
      packageName: '@courier/mikro-orm',
      schemaHint:
        `create it with \`await store.ensureSchema()\`, or add \`...courierMigrations({ ${options.join(', ')} })\` ` +
        `(from '@courier/mikro-orm/migrations') to your MikroORM migrator's migrationsList and run the migrations`,
    });
    this.orm = config.orm;
  }
}
