import { ClosedError, CourierError, StorageError } from '@courier/core';
import type { CourierTableNames } from './courier-tables.js';
import { SCHEMA_VERSION, upgradeSql, type SqlDialect } from './dialects/sql-dialect.js';
import { toNumber, type SqlExecutor } from './executor.js';
import { toStorageError } from './storage-errors.js';

/** What an adapter gives {@link SqlStoreCore}: the executor, the dialect over the resolved names, and the texts its errors use. */
export interface SqlStoreCoreConfig<Tx, E extends SqlExecutor<Tx>> {
  /** The adapter's executor; every statement of the stores runs on it. */
  readonly executor: E;
  /** The dialect of the database, built over `names` (`createDialect`). */
  readonly dialect: SqlDialect;
  /** The resolved table names (`resolveTableNames`). */
  readonly names: CourierTableNames;
  /** The store's name in `ClosedError`s (`'MikroOrmOutboxStore'`). */
  readonly what: string;
  /** The remedy a `SCHEMA_MISSING` error gives (how to create or migrate the schema with this adapter). */
  readonly schemaHint: string;
  /** The package to upgrade when the schema is newer than this release (`'@courier/mikro-orm'`). */
  readonly packageName: string;
}

/**
 * Plumbing the outbox and inbox stores share, whatever the adapter: names, the dialect, the
 * executor, the schema check and creation, and close() bookkeeping (refuse new work, wait
 * for in-flight work). An adapter builds one and hands it to {@link SqlOutboxStore} /
 * {@link SqlInboxStore}.
 */
export class SqlStoreCore<Tx, E extends SqlExecutor<Tx> = SqlExecutor<Tx>> {
  readonly names: CourierTableNames;
  readonly dialect: SqlDialect;
  /** The executor every statement of the stores runs on. */
  readonly runner: E;
  readonly schemaHint: string;
  readonly #what: string;
  readonly #packageName: string;
  readonly #inFlight = new Set<Promise<unknown>>();
  #closed = false;
  #schemaChecked: Promise<void> | undefined;

  constructor(config: SqlStoreCoreConfig<Tx, E>) {
    this.#what = config.what;
    this.#packageName = config.packageName;
    this.names = config.names;
    this.dialect = config.dialect;
    this.runner = config.executor;
    this.schemaHint = config.schemaHint;
  }

  get closed(): boolean {
    return this.#closed;
  }

  assertOpen(): void {
    if (this.#closed) throw new ClosedError(this.#what);
  }

  /**
   * Runs one store operation: refuses it when closed or aborted, checks the schema once,
   * tracks it for close(), and turns database errors into `StorageError`s.
   */
  async operation<T>(name: string, signal: AbortSignal | undefined, work: () => Promise<T>): Promise<T> {
    this.assertOpen();
    throwIfAborted(signal, name);
    const running = (async () => {
      try {
        await this.checkSchema();
        return await work();
      } catch (error) {
        throw toStorageError(error, name, this.schemaHint);
      }
    })();
    this.#inFlight.add(running);
    try {
      return await running;
    } finally {
      this.#inFlight.delete(running);
    }
  }

  /** Tracks work that close() must wait for (e.g. an inbox run) without wrapping its errors. */
  async track<T>(work: Promise<T>): Promise<T> {
    this.#inFlight.add(work);
    try {
      return await work;
    } finally {
      this.#inFlight.delete(work);
    }
  }

  /**
   * Verifies once that the schema exists at this release's version; otherwise throws a
   * `StorageError` with code `SCHEMA_MISSING` saying how to create or migrate it. A failed
   * check is retried on the next call.
   */
  checkSchema(): Promise<void> {
    this.#schemaChecked ??= this.#readSchemaVersion().catch((error: unknown) => {
      this.#schemaChecked = undefined;
      throw error;
    });
    return this.#schemaChecked;
  }

  async #readSchemaVersion(): Promise<void> {
    let rows;
    try {
      await this.dialect.prepareDatabase?.(this.runner);
      rows = await this.runner.all(`SELECT value FROM ${this.dialect.table('meta')} WHERE name = 'schema_version'`);
    } catch (error) {
      throw toStorageError(error, 'schema check', this.schemaHint);
    }
    const version = rows.length === 0 ? 0 : toNumber(rows[0]?.['value']);
    if (version < SCHEMA_VERSION) {
      throw new StorageError(`the courier schema ('${this.names.meta}') is at version ${version}, this release needs ${SCHEMA_VERSION}; ${this.schemaHint}`, {
        code: 'SCHEMA_MISSING',
        retriable: false,
      });
    }
    if (version > SCHEMA_VERSION) {
      throw new StorageError(
        `the courier schema ('${this.names.meta}') is at version ${version}, newer than this release understands (${SCHEMA_VERSION}); upgrade ${this.#packageName}`,
        { code: 'SCHEMA_MISSING', retriable: false },
      );
    }
  }

  /**
   * Creates every Courier table, index and seed row that is missing and upgrades tables of
   * an older schema version (idempotent, safe to run from several processes at once). For
   * production, prefer the migrations.
   */
  async ensureSchema(): Promise<void> {
    this.assertOpen();
    const statements = this.dialect.schemaStatements();
    const versionSql = `SELECT value FROM ${this.dialect.table('meta')} WHERE name = 'schema_version'`;
    try {
      if (this.dialect.name === 'postgresql') {
        // Concurrent CREATE … IF NOT EXISTS can still collide in the catalog; one
        // transaction under an advisory lock makes racing callers take turns.
        await this.runner.transaction(async (trx) => {
          // count(): the lock function returns void, a column type some data layers cannot read (Prisma's raw queries).
          await this.runner.all('SELECT count(pg_advisory_xact_lock(?, 0))', [this.names.lockNamespace], trx);
          for (const statement of statements) await this.runner.run(statement, [], trx);
          const version = toNumber((await this.runner.all(versionSql, [], trx))[0]?.['value']);
          for (const statement of upgradeSql(this.dialect, version)) await this.runner.run(statement, [], trx);
        });
      } else {
        // MySQL commits DDL implicitly; each statement is idempotent on its own, the
        // upgrade included, so racing callers may both run it. One transaction per
        // statement, without SQLite's write lock: it writes to the meta table, which may
        // not exist yet (and a lone first statement waits for the lock like BEGIN IMMEDIATE).
        await this.dialect.prepareDatabase?.(this.runner);
        for (const statement of statements) await this.runner.transaction((trx) => this.runner.run(statement, [], trx), { writeLock: false });
        const version = toNumber((await this.runner.all(versionSql))[0]?.['value']);
        for (const statement of upgradeSql(this.dialect, version)) {
          try {
            await this.runner.run(statement);
          } catch (error) {
            // A racing caller made this change first (no ADD COLUMN IF NOT EXISTS here).
            if (!this.dialect.alreadyUpgraded?.(error)) throw error;
          }
        }
      }
    } catch (error) {
      throw toStorageError(error, 'ensureSchema', this.schemaHint);
    }
    this.#schemaChecked = undefined;
  }

  /** Refuses new work and waits for in-flight operations. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    while (this.#inFlight.size > 0) {
      await Promise.allSettled([...this.#inFlight]);
    }
  }
}

/** Throws `CourierError` code `ABORTED` when `signal` is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined, operation: string): void {
  if (signal?.aborted) throw new CourierError('ABORTED', `'${operation}' was aborted`, { cause: signal.reason });
}

/**
 * Deletes rows of `table` whose `column` is at least `olderThanMs` old (database clock),
 * `batchSize` per statement, each batch its own short transaction, until a batch comes
 * back short. Returns the count.
 */
export async function pruneInBatches<Tx>(
  core: SqlStoreCore<Tx>,
  table: 'outbox' | 'inbox' | 'inboxStarts',
  column: string,
  publishedOnly: boolean,
  olderThanMs: number,
  batchSize: number,
  signal: AbortSignal | undefined,
): Promise<number> {
  const sql = core.dialect.pruneBatchSql(table, column, publishedOnly);
  let deleted = 0;
  for (;;) {
    throwIfAborted(signal, 'prune');
    const result = await core.runner.transaction((trx) => core.runner.run(sql, [Math.round(olderThanMs), batchSize], trx), {
      readCommitted: core.dialect.readCommitted,
    });
    deleted += result.affectedRows;
    if (result.affectedRows < batchSize) return deleted;
  }
}
