import { Migration } from '@mikro-orm/migrations';
import { resolveTableNames, type CourierTablesConfig } from './courier-tables.js';
import { createDialect } from './dialects/create-dialect.js';
import { upgradeSql, type DialectName } from './dialects/sql-dialect.js';

/** One entry of MikroORM's `migrations.migrationsList`. */
export interface CourierMigration {
  readonly name: string;
  readonly class: new (...args: ConstructorParameters<typeof Migration>) => Migration;
}

/** Arguments of {@link courierMigrations}: the same table settings the stores get. */
export interface CourierMigrationsConfig extends CourierTablesConfig {
  /** Overrides dialect detection from the migrating ORM's platform. */
  readonly dialect?: DialectName;
}

/**
 * The migrations that create (and later upgrade) Courier's tables, for your own MikroORM
 * migrator: `migrations: { migrationsList: [...courierMigrations(), ...yours] }`.
 *
 * Guarantees: the SQL is chosen for the migrating connection's dialect when the migration
 * runs; every statement is idempotent (`IF NOT EXISTS`, insert-if-missing), so running it
 * over a schema made by `ensureSchema()` is harmless; names are unique per table prefix,
 * so two Courier schemas (two prefixes) can live in one migrator. v1 creates the tables at
 * the current version, v2 upgrades tables created by an older release (MySQL/MariaDB: the
 * id columns become binary, compared byte for byte). `down` of v1 drops the tables.
 */
export function courierMigrations(config: CourierMigrationsConfig = {}): CourierMigration[] {
  const names = resolveTableNames(config);
  const dialectFor = (migration: Migration): ReturnType<typeof createDialect> =>
    createDialect((migration as unknown as { driver: { getPlatform(): object } }).driver.getPlatform(), names, config.dialect);

  class CourierSchemaV1 extends Migration {
    override up(): void {
      for (const statement of dialectFor(this).schemaStatements()) this.addSql(statement);
    }

    override down(): void {
      for (const statement of dialectFor(this).dropStatements()) this.addSql(statement);
    }
  }

  // Upgrades tables a v1 migration (or an older release's ensureSchema) created; a no-op
  // on tables created at version 2, which is what CourierSchemaV1 now creates.
  class CourierSchemaV2 extends Migration {
    override async up(): Promise<void> {
      const dialect = dialectFor(this);
      const rows = await this.execute(`SELECT value FROM ${dialect.table('meta')} WHERE name = 'schema_version'`);
      const version = Number(rows[0]?.['value'] ?? 0);
      for (const statement of upgradeSql(dialect, version)) this.addSql(statement);
    }

    override down(): void {
      // The v2 columns stay: v1 code reads and writes them as well, and narrowing them back
      // could fail on ids that only v2 tells apart. Only the version goes back.
      this.addSql(`UPDATE ${dialectFor(this).table('meta')} SET value = 1 WHERE name = 'schema_version' AND value > 1`);
    }
  }

  return [
    { name: `Courier_${names.prefix}v1`, class: CourierSchemaV1 },
    { name: `Courier_${names.prefix}v2`, class: CourierSchemaV2 },
  ];
}
