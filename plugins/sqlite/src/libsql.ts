import { ConfigError } from '@courier/core';
import {
  classifyDriverError,
  createDialect,
  resolveTableNames,
  SqlInboxStore,
  SqlOutboxStore,
  SqlStoreCore,
  toDriverStatement,
  type CourierTablesConfig,
  type DriverErrorKind,
  type OutboxPendingRow,
  type OutboxWriter,
  type RunResult,
  type SqlExecutor,
  type SqlOutboxStoreOptions,
  type SqlRow,
} from '@courier/sql-engine';
import type { Client, InArgs, ResultSet, Transaction } from '@libsql/client';
import { beginWithRetry, describe, gateOf, settleWrites, sqliteValue, trackWrite } from './write-gate.js';

/**
 * The `@libsql/client` implementation of the engine's {@link SqlExecutor}, for a local file
 * (`file:` URL). Statements run with `execute` on the given `Transaction`; one given no
 * transaction runs in a transaction of its own. An array parameter is expanded into one `?`
 * per element; a `… RETURNING` statement counts its rows (libsql reports 0 affected for it).
 *
 * Transactions take turns per client in this process (see `WriteGate`) and begin with
 * `client.transaction('write')` (`BEGIN IMMEDIATE`), retried with timers on `SQLITE_BUSY`
 * while another process holds the write lock. Why: each libsql transaction has a connection
 * of the client's pool to itself, and SQLite's busy handler sleeps on the event loop's thread,
 * so a second transaction of the same process waiting for the lock blocks the holder's COMMIT
 * until its busy timeout runs out and then fails (measured: a 2 s timeout, then
 * `SQLITE_BUSY`, every time). Keep the client's `timeout` at its default 0 for the same reason.
 */
export class LibsqlExecutor implements SqlExecutor<Transaction> {
  readonly #client: Client;

  constructor(client: Client) {
    this.#client = client;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: Transaction): Promise<SqlRow[]> {
    if (tx === undefined) return this.transaction((own) => this.all(sql, params, own));
    return rowsOf(await tx.execute(statement(sql, params)));
  }

  /** Affected row count and insert id of a statement. */
  async run(sql: string, params: readonly unknown[] = [], tx?: Transaction): Promise<RunResult> {
    if (tx === undefined) return this.transaction((own) => this.run(sql, params, own));
    const result = await tx.execute(statement(sql, params));
    const affectedRows = result.columns.length > 0 ? result.rows.length : result.rowsAffected;
    return { affectedRows, insertId: result.lastInsertRowid };
  }

  /** Runs `work` in a write transaction of its own (see the class comment). */
  transaction<T>(work: (tx: Transaction) => Promise<T>): Promise<T> {
    return runTransaction(this.#client, work);
  }

  /** Runs a statement on the client, outside any transaction (the journal mode pragma). */
  async untransacted(sql: string): Promise<SqlRow[]> {
    return rowsOf(await this.#client.execute(sql));
  }

  /** Nothing to do: every transaction this package runs holds the write lock from its `BEGIN IMMEDIATE`. */
  async prologue(): Promise<void> {}

  /** libsql's errors carry SQLite's extended code (`SQLITE_CONSTRAINT_UNIQUE`) apart from the primary one. */
  classifyError(error: unknown): DriverErrorKind {
    const extended = (error as { extendedCode?: unknown } | null)?.extendedCode;
    if (typeof extended === 'string') return classifyDriverError({ code: extended, message: (error as Error).message, cause: (error as Error).cause });
    return classifyDriverError(error);
  }
}

function statement(sql: string, params: readonly unknown[]): { sql: string; args: InArgs } {
  const driver = toDriverStatement(sql, params, 'question');
  return { sql: driver.sql, args: driver.parameters.map(sqliteValue) as InArgs };
}

function rowsOf(result: ResultSet): SqlRow[] {
  return result.rows.map((row) => {
    const out: Record<string, unknown> = {};
    result.columns.forEach((column, index) => {
      out[column] = row[index];
    });
    return out;
  });
}

async function runTransaction<T>(client: Client, work: (tx: Transaction) => Promise<T>): Promise<T> {
  return gateOf(client).run(async () => {
    const tx = await beginWithRetry(() => client.transaction('write'));
    try {
      const result = await work(tx);
      // A publish not awaited is part of this transaction: wait for it, roll back if it failed.
      await settleWrites(tx);
      await tx.commit();
      return result;
    } catch (error) {
      await settleWrites(tx).catch(() => undefined);
      if (!tx.closed) await tx.rollback().catch(() => undefined);
      throw error;
    } finally {
      tx.close();
    }
  });
}

/**
 * Runs `work` in a write transaction on `client` and owns its BEGIN and COMMIT: waits for
 * the transactions of `@courier/sqlite` already running on that client in this process,
 * begins `BEGIN IMMEDIATE` (waiting with timers while another process holds the write lock,
 * up to 30 s), commits when `work` resolves and rolls back when it throws, rethrowing its
 * error. Await every `publish` inside `work`.
 *
 * Prefer it to `client.transaction('write')` in a process that also runs a relay or a
 * consumer on the same client: a transaction begun beside theirs fails with `SQLITE_BUSY`
 * (or blocks the event loop for the client's `timeout`) instead of waiting its turn.
 */
export function withTransaction<T>(client: Client, work: (tx: Transaction) => Promise<T>): Promise<T> {
  if (!isClient(client)) throw new ConfigError(`withTransaction needs a @libsql/client Client (\`createClient({ url: 'file:…' })\`), got ${describe(client)}`);
  return runTransaction(client, work);
}

/** Arguments shared by {@link LibsqlOutboxStore} and {@link LibsqlInboxStore}. */
export interface LibsqlStoreConfig extends CourierTablesConfig {
  /** The application's `@libsql/client` Client on a local file (`file:` URL); not closed by the store. */
  readonly client: Client;
}

/** Arguments of {@link LibsqlOutboxStore}. */
export interface LibsqlOutboxStoreConfig extends LibsqlStoreConfig, Omit<SqlOutboxStoreOptions, 'wakeups'> {}

/** Arguments of {@link LibsqlInboxStore}. */
export type LibsqlInboxStoreConfig = LibsqlStoreConfig;

class LibsqlStoreCore extends SqlStoreCore<Transaction, LibsqlExecutor> {
  readonly client: Client;

  constructor(config: LibsqlStoreConfig, what: string) {
    if (config === null || typeof config !== 'object' || !isClient(config.client)) {
      throw new ConfigError(`'client' is required: pass the application's @libsql/client Client (\`createClient({ url: 'file:…' })\`), got ${describe(config?.client)}`);
    }
    if (config.client.protocol !== 'file') {
      throw new ConfigError(`'client' must be on a local file (\`createClient({ url: 'file:…' })\`), got protocol ${JSON.stringify(config.client.protocol)}: remote libsql servers are not tested with Courier`);
    }
    const names = resolveTableNames(config);
    super({
      executor: new LibsqlExecutor(config.client),
      dialect: createDialect('sqlite', names),
      names,
      what,
      packageName: '@courier/sqlite',
      schemaHint: 'create it with `await outboxStore.ensureSchema()` (idempotent, safe from several processes at once)',
    });
    this.client = config.client;
  }
}

/**
 * The outbox on `@libsql/client` (local file): the engine's `SqlOutboxStore` with the SQLite
 * dialect, joined to the application's libsql `Transaction`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(tx, …)` (what `bus.outbox(tx).publish()` calls) writes the rows at once on `tx`
 *   and returns a promise to await before `tx.commit()`. The rows commit with `tx` or not at
 *   all; a rollback (or a rolled-back savepoint) leaves nothing.
 * - Refused with a `ConfigError` naming the fix, before anything is written: the `Client`
 *   itself (it would autocommit each row), a transaction already committed, rolled back or
 *   closed, or anything that is not a libsql `Transaction`.
 * - Claims, leases, fencing, per-key order, halts, pruning and the operator half are the
 *   engine's SQLite dialect, the same tables as the better-sqlite3, Kysely and MikroORM
 *   stores on SQLite. Several processes may share the file (WAL mode, set by `ensureSchema`).
 */
export class LibsqlOutboxStore extends SqlOutboxStore<Transaction, Transaction, Transaction, Promise<void>> {
  constructor(config: LibsqlOutboxStoreConfig) {
    const core = new LibsqlStoreCore(config, 'LibsqlOutboxStore');
    super({ ...config, core, join: (writer) => transactionJoin(writer) });
  }
}

/**
 * The idempotent inbox on `@libsql/client` (local file): the engine's `SqlInboxStore`, running
 * each handler in a write transaction of {@link withTransaction}, with `ctx.tx` that libsql
 * `Transaction` (`ctx.tx.execute(…)`, `bus.outbox(ctx.tx)`). The record, the handler's
 * writes and its outbox rows commit together or not at all.
 */
export class LibsqlInboxStore extends SqlInboxStore<Transaction, Transaction> {
  constructor(config: LibsqlInboxStoreConfig) {
    const core = new LibsqlStoreCore(config, 'LibsqlInboxStore');
    super({ core, transactions: { run: (work) => runTransaction(core.client, (tx) => work(tx, tx)) } });
  }
}

function transactionJoin(writer: OutboxWriter<Transaction>) {
  return {
    asyncAppend: true as const,
    resolve(unit: Transaction): Transaction {
      if (isClient(unit)) {
        throw new ConfigError(
          `'publish' got a libsql Client, which would commit each row on its own: publish inside withTransaction(client, async (tx) => …) from '@courier/sqlite', or on \`await client.transaction('write')\` before its commit()`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      if (!isTransaction(unit)) {
        throw new ConfigError(`'publish' needs a libsql Transaction (withTransaction(client, async (tx) => …) from '@courier/sqlite'), got ${describe(unit)}`, { code: 'UNIT_OF_WORK_REQUIRED' });
      }
      if (unit.closed) throw endedError();
      return unit;
    },
    add(tx: Transaction, rows: OutboxPendingRow[]): Promise<void> {
      const write = writer.write(rows, tx).then(
        () => writer.committed(),
        (error: unknown) => {
          // libsql refuses every statement of a settled transaction ('TRANSACTION_CLOSED'):
          // a misuse of the unit of work, not a storage fault.
          throw closedTransaction(error) ? endedError(error) : error;
        },
      );
      trackWrite(tx, write);
      return write;
    },
  };
}

function endedError(cause?: unknown): ConfigError {
  return new ConfigError(`'publish' got a libsql transaction that has already ended (committed, rolled back or closed): publish before its commit(), awaiting the publish`, {
    code: 'UNIT_OF_WORK_ENDED',
    cause,
  });
}

function closedTransaction(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current instanceof Error && !seen.has(current); current = current.cause) {
    seen.add(current);
    if ((current as { code?: unknown }).code === 'TRANSACTION_CLOSED') return true;
  }
  return false;
}

function isClient(value: unknown): value is Client {
  if (value === null || typeof value !== 'object') return false;
  const candidate = value as Partial<Record<keyof Client, unknown>>;
  return typeof candidate.execute === 'function' && typeof candidate.transaction === 'function' && typeof candidate.batch === 'function';
}

function isTransaction(value: unknown): value is Transaction {
  if (value === null || typeof value !== 'object') return false;
  const candidate = value as Partial<Record<keyof Transaction, unknown>>;
  return typeof candidate.execute === 'function' && typeof candidate.commit === 'function' && typeof candidate.rollback === 'function' && typeof candidate.closed === 'boolean';
}
