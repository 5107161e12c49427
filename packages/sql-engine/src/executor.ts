import { classifyDriverError, type DriverErrorKind } from './storage-errors.js';

/** A row as the driver returns it (column name → value; value types differ by driver, see the row readers). */
export type SqlRow = Readonly<Record<string, unknown>>;

/** The outcome of a statement that returns no rows. */
export interface RunResult {
  /** Rows the statement changed (MySQL: matched-and-changed, as the driver reports it). */
  readonly affectedRows: number;
  /** The driver's last insert id, where it reports one; the engine reads it only on MySQL/MariaDB. */
  readonly insertId: unknown;
}

/** What an executor runs at the start of its transactions (see {@link SqlExecutor.prologue}). */
export interface TransactionPrologue {
  /** Session settings, first in every transaction (SQLite: `PRAGMA busy_timeout`). */
  readonly session: readonly string[];
  /** A statement that makes the transaction a writer at once (SQLite's `BEGIN IMMEDIATE`), after `session`. */
  readonly writeLock: readonly string[];
}

/** Options of {@link SqlExecutor.transaction}. */
export interface TransactionOptions {
  /**
   * Ask for READ COMMITTED where the database's default is stricter (MySQL/MariaDB), so that
   * store transactions take no gap locks producers could queue behind. Ignored where READ
   * COMMITTED is already the default (PostgreSQL) or meaningless (SQLite).
   */
  readonly readCommitted?: boolean;
  /** `false` skips the prologue's write lock (schema creation, when the table it writes may not exist yet). */
  readonly writeLock?: boolean;
}

/**
 * The port the SQL engine runs on: one per driver or data layer (MikroORM, `pg`, …). `Tx` is
 * the driver's transaction object; the engine never looks inside it, it only hands back the
 * one `transaction` gave it (or one the caller's own transaction supplied).
 *
 * Guarantees an implementation gives:
 * - Placeholders are positional `?`, bound in order; an array parameter is bound where the
 *   dialect's SQL expects a list (`IN (?)` on MySQL/SQLite, `ARRAY[?]` on PostgreSQL) the way
 *   the driver expands it. Values are never interpolated by the engine.
 * - `all`/`run` given a `tx` run on that transaction's connection, in it; given none, they
 *   run on their own (autocommit, or, with a prologue, in a transaction of their own so the
 *   prologue precedes them on the same connection).
 * - `transaction(work)` commits when `work` resolves and rolls back when it throws (the
 *   error is rethrown unchanged), and runs the prologue first when there is one.
 * - Driver errors are thrown as the driver raised them: the engine classifies them
 *   (`classifyError`, or {@link classifyDriverError} by default) and maps them to Courier errors.
 */
export interface SqlExecutor<Tx> {
  /** Rows of a query. */
  all(sql: string, params?: readonly unknown[], tx?: Tx): Promise<SqlRow[]>;
  /** Affected row count (and insert id) of a statement. */
  run(sql: string, params?: readonly unknown[], tx?: Tx): Promise<RunResult>;
  /** Runs `work` in a transaction of its own: committed when it resolves, rolled back when it throws. */
  transaction<T>(work: (tx: Tx) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /** Runs a statement outside any transaction and without the prologue (pragmas that refuse to run in a transaction). */
  untransacted(sql: string): Promise<SqlRow[]>;
  /**
   * Runs the prologue inside `tx` before its first statement, for a transaction opened
   * elsewhere (the application's own). `writeLock: false` runs only the session part.
   * No-op for an executor without a prologue.
   */
  prologue(tx: Tx, options?: { writeLock?: boolean }): Promise<void>;
  /**
   * Makes every connection the data layer opens from now on run the prologue's session
   * settings before anything else uses it (where the data layer lets an adapter hook that);
   * idempotent. Optional: without it only the executor's own transactions get the settings.
   */
  configureEveryConnection?(): Promise<void>;
  /** How a driver error is to be treated; without it the engine uses {@link classifyDriverError}. */
  classifyError?(error: unknown): DriverErrorKind;
}

/** Reads a column that may come back as number, bigint or string (drivers differ). */
export function toBigInt(value: unknown): bigint {
  if (typeof value === 'bigint') return value;
  if (typeof value === 'number') return BigInt(Math.trunc(value));
  if (typeof value === 'string' && value.length > 0) return BigInt(value);
  throw new TypeError(`expected an integer column value, got ${typeof value}`);
}

/** Reads a numeric column that may come back as number, bigint or string; `null`/`undefined` read as 0. */
export function toNumber(value: unknown): number {
  if (value === null || value === undefined) return 0;
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  if (typeof value === 'string') return Number(value);
  return Number(value);
}

/** Reads a nullable string column (a `Buffer`, as some drivers return text, is decoded as UTF-8). */
export function toNullableString(value: unknown): string | null {
  if (value === null || value === undefined) return null;
  if (typeof value === 'string') return value;
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  return String(value);
}

/** How `executor` classifies `error`: its own {@link SqlExecutor.classifyError}, else {@link classifyDriverError}. */
export function classifyError(executor: Pick<SqlExecutor<never>, 'classifyError'>, error: unknown): DriverErrorKind {
  return executor.classifyError ? executor.classifyError(error) : classifyDriverError(error);
}
