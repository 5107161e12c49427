import { ConfigError } from '@courier/core';
import type { DialectName } from '@courier/sql-engine';

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

/** The dialect of `platform`, or `dialect` when set; a `ConfigError` naming the platform when it is not a supported one. */
export function dialectOf(platform: object, dialect?: DialectName): DialectName {
  const resolved = dialect ?? detectDialect(platform);
  if (resolved === undefined) {
    throw new ConfigError(
      `the MikroORM platform '${platform.constructor.name}' is not supported: use @mikro-orm/postgresql, @mikro-orm/mysql, @mikro-orm/mariadb or @mikro-orm/libsql, or set 'dialect' explicitly`,
    );
  }
  return resolved;
}
