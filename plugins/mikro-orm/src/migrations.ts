import { StorageError } from '@courier/core';
import { createRequire } from 'node:module';
import type { Migration } from '@mikro-orm/migrations';
import { type CourierTablesConfig, createDialect, type DialectName, resolveTableNames, sqlSchemaAdmin, toNumber, toStorageError, upgradeSql } from '@courier/sql-engine';
import { dialectOf } from './detect-dialect.js';
import { StoreCore, type MikroOrmStoreConfig } from './store-core.js';

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
 * runs; every statement is idempotent (`IF NOT EXISTS`, insert-if-missing; on SQLite and
 * MySQL, where ADD COLUMN has no `IF NOT EXISTS`, an upgrade adds only the columns that are
 * missing), so running it over a schema made by `ensureSchema()`, or again after it stopped
 * half-way, is harmless; names are unique per table prefix,
 * so two Courier schemas (two prefixes) can live in one migrator. v1 creates the tables at
 * the current version, v2 upgrades tables created by an older release (MySQL/MariaDB: the
 * id columns become binary, compared byte for byte), v3 adds the inbox halt tables
 * (`poison: 'halt'`), v4 lets MySQL/MariaDB complete outbox rows in place (`state` an ENUM,
 * `published_at` never NULL; it rebuilds the outbox table there, a no-op elsewhere), v5 adds
 * the outbox's failure columns (`error_code`, `error_name`, `first_failed_at`: dead rows
 * selectable by code; rows that failed before read them as unknown), v6 adds `first_due_at`
 * (when a row first became due: `stats().oldestPendingAgeMs` counts a row in a retry's
 * backoff from it; rows failing or leased at the upgrade get their insert time), v7 adds
 * `leased_until` (the lease's end, so a claim changes no indexed column: a HOT update on
 * PostgreSQL, whose outbox also gets `fillfactor = 50`, for pages written from then on; rows
 * leased at the upgrade keep their lease). `down`
 * of v1 drops the tables; `down` of v3 drops the halt tables, and refuses (a non-retriable
 * `StorageError` naming the tables) while they hold any halted, held or parked message —
 * those were acknowledged to the broker and exist nowhere else; `down` of v4 only sets the
 * version back (v3 code works on the v4 columns).
 */
export function courierMigrations(config: CourierMigrationsConfig = {}): CourierMigration[] {
  const { Migration } = loadMigrations();
  const names = resolveTableNames(config);
  const dialectFor = (migration: Migration): ReturnType<typeof createDialect> =>
    createDialect(dialectOf((migration as unknown as { driver: { getPlatform(): object } }).driver.getPlatform(), config.dialect), names);
  // Every upgrade migration brings the tables from the version they record to the latest,
  // so v2 to v7 are no-ops once an earlier one ran; each may be re-run after a partial failure.
  const upgradeToLatest = async (migration: Migration): Promise<void> => {
    const dialect = dialectFor(migration);
    const rows = await migration.execute(`SELECT value FROM ${dialect.table('meta')} WHERE name = 'schema_version'`);
    const version = Number(rows[0]?.['value'] ?? 0);
    const statements = upgradeSql(dialect, version);
    if (!dialect.alreadyUpgraded) {
      // PostgreSQL: every statement is idempotent by itself (ADD COLUMN IF NOT EXISTS).
      for (const statement of statements) migration.addSql(statement);
      return;
    }
    // SQLite and MySQL have no ADD COLUMN IF NOT EXISTS: a re-run after an upgrade that stopped
    // half-way (a column added, the version not bumped) met "duplicate column" and failed. Run
    // one statement at a time and pass over a change that is already there, as ensureSchema()
    // does, so only what is missing is added. A failed statement leaves SQLite's transaction
    // usable, and MySQL commits DDL at once either way.
    for (const statement of statements) {
      try {
        await migration.execute(statement);
      } catch (error) {
        if (!dialect.alreadyUpgraded(error)) throw error;
      }
    }
  };

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
      await upgradeToLatest(this);
    }

    override down(): void {
      // The v2 columns stay: v1 code reads and writes them as well, and narrowing them back
      // could fail on ids that only v2 tells apart. Only the version goes back.
      this.addSql(`UPDATE ${dialectFor(this).table('meta')} SET value = 1 WHERE name = 'schema_version' AND value > 1`);
    }
  }

  // Adds the inbox halt tables to a schema at version 2 (a no-op where v1 or v2 already
  // brought it to the current version: both upgrade to the latest).
  class CourierSchemaV3 extends Migration {
    override async up(): Promise<void> {
      await upgradeToLatest(this);
    }

    override async down(): Promise<void> {
      const dialect = dialectFor(this);
      // Halted heads, held and parked messages were acknowledged to the broker when they were
      // kept here: these tables are their only copy, so dropping them would lose them.
      const kept: string[] = [];
      for (const table of ['inboxHalts', 'inboxHeld', 'inboxParked'] as const) {
        let count: number;
        try {
          const rows = await this.execute(`SELECT COUNT(*) AS n FROM ${dialect.table(table)}`);
          count = toNumber(rows[0]?.['n']);
        } catch (error) {
          // Not swallowed even for a missing table: on PostgreSQL the failed statement aborts
          // the migration's transaction, so nothing after it could run anyway.
          throw toStorageError(error, `migration Courier_${names.prefix}v3 down`, 'the halt tables v3 creates are missing: the schema is not at version 3');
        }
        if (count > 0) kept.push(`${count} row(s) in '${dialect.table(table)}'`);
      }
      if (kept.length > 0) {
        throw new StorageError(
          `refusing to undo migration 'Courier_${names.prefix}v3': ${kept.join(', ')} hold messages already acknowledged to the broker, which dropping the halt tables would lose; resume and drain the halted keys (\`courier halted list\`, \`courier halted resume --consumer\`), replay or purge the parked ones, then migrate down again`,
          { retriable: false },
        );
      }
      this.addSql(`DROP TABLE IF EXISTS ${dialect.table('inboxHalts')}`);
      this.addSql(`DROP TABLE IF EXISTS ${dialect.table('inboxHeld')}`);
      this.addSql(`DROP TABLE IF EXISTS ${dialect.table('inboxParked')}`);
      this.addSql(`UPDATE ${dialect.table('meta')} SET value = 2 WHERE name = 'schema_version' AND value > 2`);
    }
  }

  // MySQL/MariaDB: rebuilds the outbox with the v4 column types (see MySqlDialect); a
  // version bump elsewhere.
  class CourierSchemaV4 extends Migration {
    override async up(): Promise<void> {
      await upgradeToLatest(this);
    }

    override down(): void {
      // The v4 columns stay: v3 code reads and writes them alike (it never reads
      // published_at, and compares state to the same strings). Only the version goes back.
      this.addSql(`UPDATE ${dialectFor(this).table('meta')} SET value = 3 WHERE name = 'schema_version' AND value > 3`);
    }
  }

  // Adds the outbox failure columns (code, error name, first failure). `down` drops them:
  // v4 code never reads them, and what they held is also in last_error's text.
  class CourierSchemaV5 extends Migration {
    override async up(): Promise<void> {
      await upgradeToLatest(this);
    }

    override down(): void {
      const dialect = dialectFor(this);
      const outbox = dialect.table('outbox');
      // One column per statement: SQLite drops one at a time (3.35+).
      for (const column of ['error_code', 'error_name', 'first_failed_at']) this.addSql(`ALTER TABLE ${outbox} DROP COLUMN ${column}`);
      this.addSql(`UPDATE ${dialect.table('meta')} SET value = 4 WHERE name = 'schema_version' AND value > 4`);
    }
  }

  // Adds the outbox's first_due_at (and fills it for rows failing or leased at the upgrade).
  // `down` drops it: v5 code never reads it.
  class CourierSchemaV6 extends Migration {
    override async up(): Promise<void> {
      await upgradeToLatest(this);
    }

    override down(): void {
      const dialect = dialectFor(this);
      this.addSql(`ALTER TABLE ${dialect.table('outbox')} DROP COLUMN first_due_at`);
      this.addSql(`UPDATE ${dialect.table('meta')} SET value = 5 WHERE name = 'schema_version' AND value > 5`);
    }
  }

  // Adds the outbox's leased_until (and carries the leases taken under v6 into it); on
  // PostgreSQL also the fill factor. `down` moves each live lease's end back into
  // available_at, where v6 code keeps it, then drops the column; the fill factor stays (v6
  // code is indifferent to it; `ALTER TABLE … RESET (fillfactor)` if wanted).
  class CourierSchemaV7 extends Migration {
    override async up(): Promise<void> {
      await upgradeToLatest(this);
    }

    override down(): void {
      const dialect = dialectFor(this);
      const outbox = dialect.table('outbox');
      this.addSql(`UPDATE ${outbox} SET available_at = leased_until WHERE state = 'pending' AND leased_until IS NOT NULL AND leased_until > available_at`);
      this.addSql(`ALTER TABLE ${outbox} DROP COLUMN leased_until`);
      this.addSql(`UPDATE ${dialect.table('meta')} SET value = 6 WHERE name = 'schema_version' AND value > 6`);
    }
  }

  return [
    { name: `Courier_${names.prefix}v1`, class: CourierSchemaV1 },
    { name: `Courier_${names.prefix}v2`, class: CourierSchemaV2 },
    { name: `Courier_${names.prefix}v3`, class: CourierSchemaV3 },
    { name: `Courier_${names.prefix}v4`, class: CourierSchemaV4 },
    { name: `Courier_${names.prefix}v5`, class: CourierSchemaV5 },
    { name: `Courier_${names.prefix}v6`, class: CourierSchemaV6 },
    { name: `Courier_${names.prefix}v7`, class: CourierSchemaV7 },
  ];
}

/**
 * `@mikro-orm/migrations`, loaded when migrations are asked for: it pulls in umzug and a
 * command-line toolkit, measured at 1.2 s of a 7.3 s `courier stats` on a loaded 2-core
 * machine (CPU profile), which every operator command paid through `courierSchemaAdmin`
 * from this module without ever migrating. It is CommonJS (its ESM entry re-exports the
 * same objects), so a synchronous require keeps `courierMigrations()` synchronous.
 */
function loadMigrations(): typeof import('@mikro-orm/migrations') {
  return createRequire(import.meta.url)('@mikro-orm/migrations') as typeof import('@mikro-orm/migrations');
}

/** Arguments of {@link courierSchemaAdmin}: the same settings the stores get. */
export type CourierSchemaAdminConfig = MikroOrmStoreConfig;

/**
 * Schema status and migration for operator tools (the `courier migrate` command's
 * `schema` member): the version found, the SQL that would bring it to this release's
 * version, and applying it.
 *
 * Guarantees: `status` and `pendingSql` change nothing (a missing meta table reads as
 * version 0; an unreachable database rejects with a retriable `StorageError`);
 * `pendingSql` is empty exactly when the schema is current and is the same idempotent SQL
 * `courierMigrations` and `ensureSchema()` run; `apply` is `ensureSchema()`: idempotent,
 * safe from several processes at once. The ORM is the caller's and is not closed.
 */
export function courierSchemaAdmin(config: CourierSchemaAdminConfig): {
  status(): Promise<{ current: number; target: number }>;
  pendingSql(): Promise<string[]>;
  apply(): Promise<void>;
} {
  return sqlSchemaAdmin(new StoreCore(config, 'courier schema admin'));
}
