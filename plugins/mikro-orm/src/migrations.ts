import { Migration } from '@mikro-orm/migrations';
import { resolveTableNames, type CourierTablesConfig } from './courier-tables.js';
import { createDialect } from './dialects/create-dialect.js';
import type { DialectName } from './dialects/sql-dialect.js';

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
 * so two Courier schemas (two prefixes) can live in one migrator. `down` drops the tables.
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

  return [{ name: `Courier_${names.prefix}v1`, class: CourierSchemaV1 }];
}
