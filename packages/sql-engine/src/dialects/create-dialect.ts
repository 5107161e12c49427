import { ConfigError } from '@courier/core';
import type { CourierTableNames } from '../courier-tables.js';
import { MySqlDialect } from './mysql-dialect.js';
import { PostgresDialect } from './postgres-dialect.js';
import type { DialectName, SqlDialect } from './sql-dialect.js';
import { SqliteDialect } from './sqlite-dialect.js';

/**
 * Builds the dialect `name` over `names`. An adapter knows its database (node-postgres is
 * PostgreSQL) or detects it from its data layer (the MikroORM adapter from the ORM's
 * platform) and passes the name. Throws a `ConfigError` for an unknown name, and for a
 * `schema` on SQLite (which has none).
 */
export function createDialect(name: DialectName, names: CourierTableNames): SqlDialect {
  switch (name) {
    case 'postgresql':
      return new PostgresDialect(names);
    case 'mysql':
      return new MySqlDialect(names);
    case 'sqlite':
      if (names.schema !== undefined) throw new ConfigError(`'schema' is not supported on SQLite, got ${JSON.stringify(names.schema)}`);
      return new SqliteDialect(names);
    default:
      throw new ConfigError(`'dialect' must be 'postgresql', 'mysql' or 'sqlite', got ${JSON.stringify(name)}`);
  }
}
