import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, SqlStoreCore, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';
import type { DataSource, EntityManager } from 'typeorm';
import { TypeOrmExecutor } from './typeorm-executor.js';

/** Arguments shared by {@link TypeOrmOutboxStore} and {@link TypeOrmInboxStore}. */
export interface TypeOrmStoreConfig extends CourierTablesConfig {
  /** The application's initialized `DataSource` (not destroyed by the store). Relays and consumers open their transactions on it. */
  readonly dataSource: DataSource;
}

/** Names the SQL family of a TypeORM `DataSource` from its `options.type`; `undefined` for one Courier does not serve. */
export function detectTypeOrmDialect(dataSource: DataSource): DialectName | undefined {
  const type = dataSource.options.type;
  if (type === 'postgres') return 'postgresql';
  if (type === 'mysql' || type === 'mariadb') return 'mysql';
  return undefined;
}

/**
 * TypeORM's SQLite-family DataSource types. Refused: every one of their drivers in TypeORM
 * 1.1.3 hands the same QueryRunner to every caller (`createQueryRunner()`:
 * `this.queryRunner ??= …`), and on better-sqlite3 a rollback of one transaction was seen to
 * undo another's commit (test/sqlite-refused.test.ts).
 */
const SQLITE_TYPES: ReadonlySet<string> = new Set(['better-sqlite3', 'sqlite', 'sqljs', 'capacitor', 'cordova', 'expo', 'nativescript', 'react-native']);

/** The engine's store core on TypeORM: names and dialect from the config, a {@link TypeOrmExecutor}, this package's remedies in its errors. */
export class TypeOrmStoreCore extends SqlStoreCore<EntityManager, TypeOrmExecutor> {
  readonly dataSource: DataSource;

  constructor(config: TypeOrmStoreConfig, what: string) {
    const dataSource = config?.dataSource as DataSource | undefined;
    if (dataSource === null || typeof dataSource !== 'object' || typeof dataSource.transaction !== 'function' || typeof dataSource.options !== 'object') {
      throw new ConfigError(`'dataSource' is required: pass the application's TypeORM DataSource`);
    }
    const dialectName = detectTypeOrmDialect(dataSource);
    if (SQLITE_TYPES.has(String(dataSource.options.type))) {
      throw new ConfigError(
        `the TypeORM DataSource type '${String(dataSource.options.type)}' is SQLite, which @courier/typeorm cannot join: TypeORM's SQLite drivers run every QueryRunner on one connection, so concurrent dataSource.transaction() calls nest as savepoints of one transaction and a rollback of one undoes what the other committed (Courier's relay and inbox work included); for SQLite use @courier/kysely, @courier/knex or @courier/sqlite`,
      );
    }
    if (dialectName === undefined) {
      throw new ConfigError(`the TypeORM DataSource type '${String(dataSource.options.type)}' is not one @courier/typeorm serves: use 'postgres', 'mysql' or 'mariadb'`);
    }
    const names = resolveTableNames(config);
    const dialect = createDialect(dialectName, names);
    const options: string[] = [];
    if (config.tablePrefix !== undefined) options.push(`tablePrefix: ${JSON.stringify(config.tablePrefix)}`);
    if (config.schema !== undefined) options.push(`schema: ${JSON.stringify(config.schema)}`);
    super({
      executor: new TypeOrmExecutor(dataSource, dialect.name),
      dialect,
      names,
      what,
      packageName: '@courier/typeorm',
      schemaHint: `create it with \`await store.ensureSchema()\` (on a store built with { ${['dataSource', ...options].join(', ')} })`,
    });
    this.dataSource = dataSource;
  }
}
