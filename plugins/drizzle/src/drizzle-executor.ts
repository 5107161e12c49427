import {
  classifyDriverError,
  toDriverStatement,
  type DialectName,
  type DriverErrorKind,
  type RunResult,
  type SqlExecutor,
  type SqlRow,
  type TransactionOptions,
  type TransactionPrologue,
} from '@courier/sql-engine';
import { SQL, sql, StringChunk, type SQLChunk } from 'drizzle-orm';

/**
 * What this package calls on a Drizzle database or transaction: `execute` (PostgreSQL,
 * MySQL), `all`/`run` (SQLite) and `transaction`. Every Drizzle database and transaction of
 * the supported drivers has them.
 */
export interface DrizzleRunner {
  transaction(work: (tx: never) => Promise<unknown>, config?: never): Promise<unknown>;
}

interface PgLike {
  execute(query: SQL): Promise<{ rows: unknown[]; rowCount?: number | null }>;
}
interface MySqlLike {
  execute(query: SQL): Promise<[unknown, unknown]>;
}
interface SqliteLike {
  all(query: SQL): Promise<unknown[]>;
  run(query: SQL): Promise<{ rowsAffected?: number; changes?: number; lastInsertRowid?: unknown }>;
}

/**
 * The engine's {@link SqlExecutor} on Drizzle: every statement becomes a Drizzle `SQL` object
 * made of raw text and bound parameters (`sql.param`), run with `execute` (node-postgres,
 * mysql2) or `all`/`run` (SQLite) on the Drizzle database or on the given transaction, so it
 * uses Drizzle's own connections, transactions and logger. Values are always bound, never
 * interpolated.
 *
 * Guarantees: the engine's port contract (see `SqlExecutor`). Own transactions use
 * `db.transaction()` (READ COMMITTED on MySQL/MariaDB when asked). With a prologue (SQLite)
 * every own transaction starts with it, and a statement given no transaction runs in a
 * transaction of its own, so the prologue precedes it.
 */
export class DrizzleExecutor<Tx> implements SqlExecutor<Tx> {
  readonly #db: DrizzleRunner;
  readonly #dialect: DialectName;
  readonly #prologue: TransactionPrologue | undefined;

  constructor(db: DrizzleRunner, dialect: DialectName, prologue?: TransactionPrologue) {
    this.#db = db;
    this.#dialect = dialect;
    this.#prologue = prologue;
  }

  /** Rows of a query. */
  async all(text: string, params: readonly unknown[] = [], tx?: Tx): Promise<SqlRow[]> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.all(text, params, own));
    const query = this.#statement(text, params);
    const target = (tx ?? this.#db) as unknown;
    switch (this.#dialect) {
      case 'postgresql':
        return (await (target as PgLike).execute(query)).rows as SqlRow[];
      case 'mysql': {
        const [rows] = await (target as MySqlLike).execute(query);
        return Array.isArray(rows) ? (rows as SqlRow[]) : [];
      }
      case 'sqlite':
        return (await (target as SqliteLike).all(query)) as SqlRow[];
    }
  }

  /** Affected row count (and insert id) of a statement. */
  async run(text: string, params: readonly unknown[] = [], tx?: Tx): Promise<RunResult> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.run(text, params, own));
    const query = this.#statement(text, params);
    const target = (tx ?? this.#db) as unknown;
    switch (this.#dialect) {
      case 'postgresql': {
        const result = await (target as PgLike).execute(query);
        // PostgreSQL reports a count for INSERT/UPDATE/DELETE; a `… RETURNING` read as `run` counts its rows.
        return { affectedRows: result.rowCount ?? result.rows.length, insertId: undefined };
      }
      case 'mysql': {
        const [header] = await (target as MySqlLike).execute(query);
        const { affectedRows, insertId } = (Array.isArray(header) ? { affectedRows: header.length, insertId: undefined } : header) as { affectedRows?: number; insertId?: unknown };
        return { affectedRows: affectedRows ?? 0, insertId };
      }
      case 'sqlite': {
        const result = await (target as SqliteLike).run(query);
        return { affectedRows: result.rowsAffected ?? result.changes ?? 0, insertId: result.lastInsertRowid };
      }
    }
  }

  /** Runs `work` in a Drizzle transaction of its own: committed when it resolves, rolled back when it throws. */
  transaction<T>(work: (tx: Tx) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const config = options.readCommitted && this.#dialect === 'mysql' ? { isolationLevel: 'read committed' } : undefined;
    const open = this.#db.transaction as unknown as (work: (tx: Tx) => Promise<T>, config?: unknown) => Promise<T>;
    return open.call(
      this.#db,
      async (tx: Tx) => {
        await this.prologue(tx, options);
        return work(tx);
      },
      config,
    );
  }

  /** Runs a statement on the Drizzle database, outside any transaction and without the prologue. */
  async untransacted(text: string): Promise<SqlRow[]> {
    const target = this.#db as unknown;
    const query = sql.raw(text);
    switch (this.#dialect) {
      case 'postgresql':
        return (await (target as PgLike).execute(query)).rows as SqlRow[];
      case 'mysql': {
        const [rows] = await (target as MySqlLike).execute(query);
        return Array.isArray(rows) ? (rows as SqlRow[]) : [];
      }
      case 'sqlite':
        return (await (target as SqliteLike).all(query)) as SqlRow[];
    }
  }

  /** Runs the prologue inside `tx` (a transaction the application opened); `writeLock: false` runs only the session part. */
  async prologue(tx: Tx, options: { writeLock?: boolean } = {}): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await this.#sqliteRun(tx, statement);
    if (options.writeLock === false) return;
    for (const statement of this.#prologue.writeLock) {
      try {
        await this.#sqliteRun(tx, statement);
      } catch (error) {
        // A missing table is reported by the statement that needs it, with the remedy,
        // not by the lock statement before it (which writes to the meta table).
        if (classifyDriverError(error) !== 'schema') throw error;
        return;
      }
    }
  }

  /** Errors of the drivers Drizzle wraps (pg, mysql2, libsql) reach the engine inside `DrizzleQueryError.cause`, which {@link classifyDriverError} follows. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  async #sqliteRun(tx: Tx, statement: string): Promise<void> {
    // PRAGMA returns a row on libsql: `all` reads it where `run` would too.
    await (tx as unknown as SqliteLike).all(sql.raw(statement));
  }

  /**
   * The engine's statement as a Drizzle `SQL`: the text between placeholders raw, each value
   * a bound parameter, so Drizzle numbers them in its dialect's style. The engine's `?`
   * (arrays expanded) are first numbered `$n` by `toDriverStatement`, which skips literals,
   * identifiers and comments, and then split at those numbers.
   *
   * Built as Drizzle's own `sql` template builds one (drizzle-orm 0.45 sql/sql.js): text as
   * `StringChunk`s, a string, number, bigint, boolean or null value as itself, which Drizzle
   * binds; anything else (a Date, a Buffer, undefined) wrapped in `sql.param`. Drizzle tests
   * every chunk against its entity classes when it renders the statement; `sql.raw` and
   * `sql.param` chunks took about three times the tests (profiled: ~16 µs of a publish's client
   * CPU in Drizzle's `is()`, bench/README.md, issue 32).
   */
  #statement(text: string, params: readonly unknown[]): SQL {
    if (params.length === 0 && !text.includes('?')) return sql.raw(text);
    const statement = toDriverStatement(text, params, 'numbered');
    // Bare values are chunks to Drizzle (its `sql` template leaves them so); SQLChunk's type omits them.
    const chunks: unknown[] = [];
    let from = 0;
    let expected = 1;
    for (const match of statement.sql.matchAll(/\$(\d+)(?!\d)/g)) {
      const index = Number(match[1]);
      // A `$n` that is not the next placeholder is part of the statement's own text.
      if (index !== expected) continue;
      chunks.push(new StringChunk(statement.sql.slice(from, match.index)));
      const raw = statement.parameters[index - 1];
      const value = this.#dialect === 'sqlite' ? sqliteValue(raw) : raw;
      chunks.push(isBareParam(value) ? value : sql.param(value));
      from = match.index + match[0].length;
      expected += 1;
    }
    if (expected - 1 !== statement.parameters.length) throw new Error(`the statement has ${expected - 1} placeholder(s) for ${statement.parameters.length} parameter(s)`);
    chunks.push(new StringChunk(statement.sql.slice(from)));
    return new SQL(chunks as SQLChunk[]);
  }
}

/** Values Drizzle binds as parameters when they stand alone in an `SQL`'s chunks (as its `sql` template leaves them). */
function isBareParam(value: unknown): value is string | number | bigint | boolean | null {
  return value === null || typeof value === 'string' || typeof value === 'number' || typeof value === 'bigint' || typeof value === 'boolean';
}

/** libsql binds numbers, bigints, strings, byte arrays, booleans and null; Courier stores times as ISO text on SQLite. */
function sqliteValue(value: unknown): unknown {
  if (value === undefined) return null;
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (value instanceof Date) return value.toISOString();
  return value;
}
