import {
  classifyDriverError,
  toDriverStatement,
  type DialectName,
  type DriverErrorKind,
  type PlaceholderStyle,
  type RunResult,
  type SqlExecutor,
  type SqlRow,
  type TransactionOptions,
  type TransactionPrologue,
} from '@courier/sql-engine';
import { CompiledQuery, type Kysely, type Transaction } from 'kysely';
import { registerCourierStatement } from './prepared-statements.js';

/**
 * The engine's {@link SqlExecutor} on Kysely: every statement is a `CompiledQuery.raw` run
 * with `executeQuery` on the `Kysely` instance or on the given `Transaction`, so it uses
 * Kysely's own connections and transactions. Values are always
 * bound (PostgreSQL `$n`, MySQL/SQLite `?`), never interpolated.
 *
 * On PostgreSQL every statement text with parameters that does not depend on a list's length is recorded
 * (at most 256), so a pool wrapped by {@link preparingCourierStatements} runs it as a named
 * prepared statement; on an unwrapped pool it runs unnamed, as Kysely sends everything.
 *
 * Guarantees: the engine's port contract (see `SqlExecutor`). Own transactions use
 * `db.transaction()` (READ COMMITTED on MySQL/MariaDB when asked). With a prologue (SQLite)
 * every own transaction starts with it, and a statement given no transaction runs in a
 * transaction of its own, so the prologue precedes it.
 */
export class KyselyExecutor<DB> implements SqlExecutor<Transaction<DB>> {
  readonly #db: Kysely<DB>;
  readonly #style: PlaceholderStyle;
  readonly #sqlite: boolean;
  readonly #prologue: TransactionPrologue | undefined;

  constructor(db: Kysely<DB>, dialect: DialectName, prologue?: TransactionPrologue) {
    this.#db = db;
    this.#style = dialect === 'postgresql' ? 'numbered' : 'question';
    this.#sqlite = dialect === 'sqlite';
    this.#prologue = prologue;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: Transaction<DB>): Promise<SqlRow[]> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.all(sql, params, own));
    const result = await this.#execute(sql, params, tx);
    return result.rows as SqlRow[];
  }

  /** Affected row count (and insert id) of a statement. */
  async run(sql: string, params: readonly unknown[] = [], tx?: Transaction<DB>): Promise<RunResult> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.run(sql, params, own));
    const result = await this.#execute(sql, params, tx);
    // PostgreSQL reports a count for INSERT/UPDATE/DELETE only; a `… RETURNING` read as `run`
    // counts its rows.
    const affected = result.numAffectedRows ?? (result.rows.length > 0 ? BigInt(result.rows.length) : 0n);
    return { affectedRows: Number(affected), insertId: result.insertId };
  }

  /** Runs `work` in a Kysely transaction of its own: committed when it resolves, rolled back when it throws. */
  transaction<T>(work: (tx: Transaction<DB>) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    let builder = this.#db.transaction();
    if (options.readCommitted && this.#style === 'question' && !this.#sqlite) builder = builder.setIsolationLevel('read committed');
    return builder.execute(async (tx) => {
      await this.prologue(tx, options);
      return work(tx);
    });
  }

  /** Runs a statement on the `Kysely` instance, outside any transaction and without the prologue. */
  async untransacted(sql: string): Promise<SqlRow[]> {
    return (await this.#db.executeQuery(CompiledQuery.raw(sql, []))).rows as SqlRow[];
  }

  /** Runs the prologue inside `tx` (a transaction the application opened); `writeLock: false` runs only the session part. */
  async prologue(tx: Transaction<DB>, options: { writeLock?: boolean } = {}): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await tx.executeQuery(CompiledQuery.raw(statement, []));
    if (options.writeLock === false) return;
    for (const statement of this.#prologue.writeLock) {
      try {
        await tx.executeQuery(CompiledQuery.raw(statement, []));
      } catch (error) {
        // A missing table is reported by the statement that needs it, with the remedy,
        // not by the lock statement before it (which writes to the meta table).
        if (classifyDriverError(error) !== 'schema') throw error;
        return;
      }
    }
  }

  /**
   * Runs the prologue's session settings (SQLite's busy timeout) on the database now.
   * Kysely's SQLite dialect has one connection for its whole life (the `better-sqlite3`
   * `Database` the application gave it), so this covers the application's own transactions
   * too. Idempotent.
   */
  async configureEveryConnection(): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await this.untransacted(statement);
  }

  /** Errors of the drivers Kysely's built-in dialects use (pg, mysql2, better-sqlite3) are what {@link classifyDriverError} knows. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  #execute(sql: string, params: readonly unknown[], tx: Transaction<DB> | undefined) {
    const statement = toDriverStatement(sql, params, this.#style);
    // A text that does not vary with a list's length is one a pool wrapped by
    // `preparingCourierStatements` may prepare. Statements without parameters (schema DDL,
    // which may hold several commands) stay on node-postgres's simple protocol.
    if (this.#style === 'numbered' && params.length > 0 && !params.some(Array.isArray)) registerCourierStatement(statement.sql);
    const parameters = this.#sqlite ? statement.parameters.map(sqliteValue) : statement.parameters;
    return (tx ?? this.#db).executeQuery(CompiledQuery.raw(statement.sql, [...parameters]));
  }
}

/** better-sqlite3 binds numbers, bigints, strings, buffers and null only. */
function sqliteValue(value: unknown): unknown {
  if (value === undefined) return null;
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (value instanceof Date) return value.toISOString();
  return value;
}
