import { ConfigError } from '@courier/core';
import { createDialect, resolveTableNames, type CourierTablesConfig, type DialectName } from '@courier/sql-engine';

/** Arguments of {@link courierMigrationSql}. */
export interface CourierMigrationSqlOptions extends CourierTablesConfig {
  /** The database: `'postgresql'`, `'mysql'` (MySQL/MariaDB) or `'sqlite'` — your Prisma datasource's provider. */
  readonly provider: DialectName;
}

/**
 * The SQL that creates Courier's tables, indexes and seed rows at this release's schema
 * version, as one script for a Prisma migration (`prisma/migrations/<timestamp>_courier/migration.sql`):
 * Courier's tables need no Prisma model. The statements are idempotent (`IF NOT EXISTS`,
 * seed rows inserted only when missing), so the script is safe on a database where
 * `store.ensureSchema()` already created them. The same SQL as `ensureSchema()` and
 * `courier migrate --print` on an empty database, for the given names.
 */
export function courierMigrationSql(options: CourierMigrationSqlOptions): string {
  const provider: unknown = options?.provider;
  if (provider !== 'postgresql' && provider !== 'mysql' && provider !== 'sqlite') {
    throw new ConfigError(`'provider' must be 'postgresql', 'mysql' or 'sqlite', got ${JSON.stringify(provider)}`);
  }
  const dialect = createDialect(provider, resolveTableNames(options));
  const header = `-- Courier's outbox and inbox tables (@courier/prisma courierMigrationSql, provider ${provider}).\n-- Not modelled in schema.prisma: Courier reads and writes them with raw SQL.\n`;
  return `${header}${dialect.schemaStatements().map((statement) => `${statement.trim()};`).join('\n\n')}\n`;
}
