import { ConfigError } from '@courier/core';
import type { CourierTableNames } from '../courier-tables.js';
import { MySqlDialect } from './mysql-dialect.js';
import { PostgresDialect } from './postgres-dialect.js';
import type { DialectName, SqlDialect } from './sql-dialect.js';
import { SqliteDialect } from './sqlite-dialect.js';

/**
 * Names the SQL family of a MikroORM platform by its class chain
 * (`PostgreSqlPlatform`, `MySqlPlatform` / `MariaDbPlatform`, `*SqlitePlatform` /
 * `LibSqlPlatform`); `undefined` for anything else (MongoDB, MSSQL).
 */
export function detectDialect(platform: object): DialectName | undefined {
  for (let proto: unknown = Object.getPrototypeOf(platform); proto !== null && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
    const name = (proto as { constructor?: { name?: unknown } }).constructor?.name;
    if (typeof name !== 'string') continue;
    if (/^PostgreSql/.test(name)) return 'postgresql';
    if (/^(MySql|MariaDb)/.test(name)) return 'mysql';
    if (/(Sqlite|LibSql)/i.test(name)) return 'sqlite';
  }
  return undefined;
}

/** Builds the adapter of `dialect` (or of the detected one) over `names`. */
export function createDialect(platform: object, names: CourierTableNames, dialect?: DialectName): SqlDialect {
  const resolved = dialect ?? detectDialect(platform);
  switch (resolved) {
    case 'postgresql':
      return new PostgresDialect(names);
    case 'mysql':
      return new MySqlDialect(names);
    case 'sqlite':
      if (names.schema !== undefined) throw new ConfigError(`'schema' is not supported on SQLite, got ${JSON.stringify(names.schema)}`);
      return new SqliteDialect(names);
    default:
      throw new ConfigError(
        `the MikroORM platform '${platform.constructor.name}' is not supported: use @mikro-orm/postgresql, @mikro-orm/mysql, @mikro-orm/mariadb or @mikro-orm/libsql, or set 'dialect' explicitly`,
      );
  }
}
