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
import type { PrismaClientLike, PrismaRawClient, PrismaTransactionOptions } from './prisma-client.js';
import { toDriverError } from './prisma-errors.js';

/**
 * The engine's {@link SqlExecutor} on a Prisma Client: every statement is a
 * `$queryRawUnsafe` / `$executeRawUnsafe` with positional parameters (PostgreSQL `$n`,
 * MySQL/SQLite `?`) on the client or on the given interactive-transaction client, so it runs
 * on Prisma's driver adapter, its pool and its transactions. Values are always bound, never
 * interpolated.
 *
 * Guarantees: the engine's port contract (see `SqlExecutor`). Own transactions are Prisma
 * interactive transactions (`$transaction(fn, transactionOptions)`; READ COMMITTED on
 * MySQL/MariaDB when asked). With a prologue (SQLite) every own transaction starts with it,
 * and a statement given no transaction runs in a transaction of its own, so the prologue
 * precedes it. Prisma's errors are restated as the driver's (`PrismaDriverError`: SQLSTATE,
 * errno) so the engine classifies them.
 */
export class PrismaExecutor<Tx extends PrismaRawClient> implements SqlExecutor<Tx> {
  readonly #prisma: PrismaClientLike<Tx>;
  readonly #dialect: DialectName;
  readonly #style: PlaceholderStyle;
  readonly #prologue: TransactionPrologue | undefined;
  readonly #options: PrismaTransactionOptions;

  constructor(prisma: PrismaClientLike<Tx>, dialect: DialectName, prologue: TransactionPrologue | undefined, transactionOptions: PrismaTransactionOptions) {
    this.#prisma = prisma;
    this.#dialect = dialect;
    this.#style = dialect === 'postgresql' ? 'numbered' : 'question';
    this.#prologue = prologue;
    this.#options = transactionOptions;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: Tx): Promise<SqlRow[]> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.all(sql, params, own));
    const statement = this.#statement(sql, params);
    try {
      return withBuffers(await (tx ?? this.#prisma).$queryRawUnsafe<SqlRow[]>(statement.sql, ...statement.parameters));
    } catch (error) {
      throw toDriverError(error, this.#dialect);
    }
  }

  /** Affected row count of a statement (Prisma reports no insert id: the engine reads `LAST_INSERT_ID()` instead). */
  async run(sql: string, params: readonly unknown[] = [], tx?: Tx): Promise<RunResult> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.run(sql, params, own));
    const statement = this.#statement(sql, params);
    try {
      const affectedRows = await (tx ?? this.#prisma).$executeRawUnsafe(statement.sql, ...statement.parameters);
      return { affectedRows: Number(affectedRows), insertId: undefined };
    } catch (error) {
      throw toDriverError(error, this.#dialect);
    }
  }

  /** Runs `work` in a Prisma interactive transaction of its own: committed when it resolves, rolled back when it throws. */
  async transaction<T>(work: (tx: Tx) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const prismaOptions: PrismaTransactionOptions =
      options.readCommitted && this.#dialect === 'mysql' ? { ...this.#options, isolationLevel: 'ReadCommitted' } : this.#options;
    let workError: { error: unknown } | undefined;
    try {
      return await this.#prisma.$transaction(async (tx) => {
        try {
          await this.prologue(tx, options);
          return await work(tx);
        } catch (error) {
          workError = { error };
          throw error;
        }
      }, prismaOptions);
    } catch (error) {
      // Errors of `work` leave unchanged; Prisma's own (begin, commit, an expired transaction) are restated.
      if (workError !== undefined && workError.error === error) throw error;
      throw toDriverError(error, this.#dialect);
    }
  }

  /** Runs a statement on the client, outside any transaction and without the prologue. */
  async untransacted(sql: string): Promise<SqlRow[]> {
    try {
      return await this.#prisma.$queryRawUnsafe<SqlRow[]>(sql);
    } catch (error) {
      throw toDriverError(error, this.#dialect);
    }
  }

  /** Runs the prologue inside `tx` (a transaction the application opened); `writeLock: false` runs only the session part. */
  async prologue(tx: Tx, options: { writeLock?: boolean } = {}): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await this.all(statement, [], tx);
    if (options.writeLock === false) return;
    for (const statement of this.#prologue.writeLock) {
      try {
        await this.run(statement, [], tx);
      } catch (error) {
        // A missing table is reported by the statement that needs it, with the remedy,
        // not by the lock statement before it (which writes to the meta table).
        if (classifyDriverError(error) !== 'schema') throw error;
        return;
      }
    }
  }

  /**
   * Runs the prologue's session settings (SQLite's busy timeout) on the database now. Prisma's
   * better-sqlite3 adapter has one connection for the client's life, so this covers the
   * application's own transactions too. Idempotent.
   */
  async configureEveryConnection(): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await this.untransacted(statement);
  }

  /** Classifies with the engine's rules, after restating a Prisma error as the driver's. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(toDriverError(error, this.#dialect));
  }

  #statement(sql: string, params: readonly unknown[]) {
    const statement = toDriverStatement(sql, params, this.#style);
    return { sql: statement.sql, parameters: statement.parameters.map((value) => bindable(value, this.#dialect)) };
  }
}

/** Prisma binds strings, numbers, bigints, booleans, Dates, bytes and null; SQLite stores times as the engine's ISO text. */
function bindable(value: unknown, dialect: DialectName): unknown {
  if (value === undefined) return null;
  if (dialect === 'sqlite') {
    if (typeof value === 'boolean') return value ? 1 : 0;
    if (value instanceof Date) return value.toISOString();
  }
  return value;
}

/**
 * Prisma returns binary columns (MySQL's `varbinary` ids, topics and keys) as plain
 * `Uint8Array`s; the engine's row readers decode `Buffer`s, as every Node driver returns them.
 * A view over the same bytes, no copy.
 */
function withBuffers(rows: SqlRow[]): SqlRow[] {
  for (const row of rows) {
    for (const [column, value] of Object.entries(row)) {
      if (value instanceof Uint8Array && !Buffer.isBuffer(value)) {
        (row as Record<string, unknown>)[column] = Buffer.from(value.buffer, value.byteOffset, value.byteLength);
      }
    }
  }
  return rows;
}
