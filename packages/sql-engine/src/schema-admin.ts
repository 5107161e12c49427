import { SCHEMA_VERSION, upgradeSql } from './dialects/sql-dialect.js';
import { toNumber } from './executor.js';
import type { SqlStoreCore } from './sql-store-core.js';
import { classifyDriverError, toStorageError } from './storage-errors.js';

/** Schema status and migration for operator tools: see {@link sqlSchemaAdmin}. */
export interface SqlSchemaAdmin {
  /** The version found (0: no schema) and the one this release needs. */
  status(): Promise<{ current: number; target: number }>;
  /** The SQL that would bring the schema to this release's version; empty when it is current. */
  pendingSql(): Promise<string[]>;
  /** Creates or upgrades the schema (the stores' `ensureSchema()`). */
  apply(): Promise<void>;
}

/**
 * Schema status and migration on any adapter's {@link SqlStoreCore} (the `courier migrate`
 * command's `schema` member).
 *
 * Guarantees: `status` and `pendingSql` change nothing (a missing meta table reads as
 * version 0; an unreachable database rejects with a retriable `StorageError`);
 * `pendingSql` is empty exactly when the schema is current and is the same idempotent SQL
 * the migrations and `ensureSchema()` run; `apply` is `ensureSchema()`: idempotent, safe
 * from several processes at once.
 */
export function sqlSchemaAdmin<Tx>(core: SqlStoreCore<Tx>): SqlSchemaAdmin {
  const currentVersion = async (): Promise<number> => {
    try {
      await core.dialect.prepareDatabase?.(core.runner);
      const rows = await core.runner.all(`SELECT value FROM ${core.dialect.table('meta')} WHERE name = 'schema_version'`);
      return rows.length === 0 ? 0 : toNumber(rows[0]?.['value']);
    } catch (error) {
      // A missing table is version 0; anything else (the database away) is reported.
      if (classifyDriverError(error) === 'schema') return 0;
      throw toStorageError(error, 'schema status', core.schemaHint);
    }
  };
  return {
    async status() {
      return { current: await currentVersion(), target: SCHEMA_VERSION };
    },
    async pendingSql() {
      const current = await currentVersion();
      if (current >= SCHEMA_VERSION) return [];
      return current === 0 ? core.dialect.schemaStatements() : upgradeSql(core.dialect, current);
    },
    apply: () => core.ensureSchema(),
  };
}
