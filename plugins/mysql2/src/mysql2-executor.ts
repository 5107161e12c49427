import type { RunResult, SqlExecutor, SqlRow, TransactionOptions } from '@courier/sql-engine';
import type { Pool, PoolConnection, QueryOptions, ResultSetHeader } from 'mysql2/promise';
import { runInTransaction } from './transactions.js';

/**
 * The per-statement options every Courier statement runs with, whatever the application's
 * pool says: BIGINT and DECIMAL columns as strings (a sequence or fencing token past 2^53
 * would lose digits as a number; the engine's readers take strings), dates as strings (the
 * engine reads only its own epoch-millisecond expressions, so no time zone conversion of
 * the pool can shift them).
 */
const STATEMENT_OPTIONS = { supportBigNumbers: true, bigNumberStrings: true, dateStrings: true } as const;

/** `SERVER_STATUS_IN_TRANS` and `SERVER_STATUS_AUTOCOMMIT` of the MySQL protocol's OK packet. */
const SERVER_STATUS_IN_TRANS = 0x0001;
const SERVER_STATUS_AUTOCOMMIT = 0x0002;

/**
 * The mysql2 (promise API) implementation of the engine's {@link SqlExecutor}: statements
 * run with `query` (values escaped by mysql2 on the client, arrays expanded into lists, as
 * the engine's `IN (?)` expects) on the given connection or, without one, on the pool.
 *
 * Why `query` and not `execute` (server-side prepared statements): the engine's statements
 * differ by row count (`VALUES` tuples, `IN` lists), and `execute` neither expands arrays
 * nor keeps its statement cache small for such text; MariaDB's prepared-statement count is
 * also a server-wide limit (`max_prepared_stmt_count`) an application's pool shares.
 *
 * `transaction(work)` takes a connection from the pool, optionally sets READ COMMITTED for
 * that one transaction, begins, commits when `work` resolves and rolls back when it throws
 * (rethrowing the error unchanged). A connection whose rollback failed is destroyed, not
 * returned to the pool, since its transaction state is unknown.
 */
export class Mysql2Executor implements SqlExecutor<PoolConnection> {
  readonly #pool: Pool;

  constructor(pool: Pool) {
    this.#pool = pool;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: PoolConnection): Promise<SqlRow[]> {
    const [rows] = await (tx ?? this.#pool).query(options(sql, params));
    return Array.isArray(rows) ? (rows as SqlRow[]) : [];
  }

  /** Affected row count and insert id of a statement. */
  async run(sql: string, params: readonly unknown[] = [], tx?: PoolConnection): Promise<RunResult> {
    const [result] = await (tx ?? this.#pool).query<ResultSetHeader>(options(sql, params));
    return { affectedRows: Number(result.affectedRows ?? 0), insertId: result.insertId };
  }

  /** Runs `work` on a pooled connection in a transaction of its own (see the class comment). */
  async transaction<T>(work: (tx: PoolConnection) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const connection = await this.#pool.getConnection();
    return runInTransaction(connection, work, options.readCommitted === true);
  }

  /** Runs a statement on the pool, outside any transaction. */
  async untransacted(sql: string): Promise<SqlRow[]> {
    return this.all(sql);
  }

  /** MySQL/MariaDB need no prologue. */
  async prologue(): Promise<void> {}
}

/**
 * Whether `connection` is inside a transaction, read from the server status flags of an
 * OK packet (`DO 0`, which touches nothing): `true` when `SERVER_STATUS_IN_TRANS` is set, or
 * when autocommit is off (the next statement opens a transaction the application commits).
 * `false` means a statement would autocommit on its own.
 */
export async function inTransaction(connection: PoolConnection): Promise<boolean> {
  const [result] = await connection.query<ResultSetHeader>('DO 0');
  const status = Number(result.serverStatus ?? 0);
  return (status & SERVER_STATUS_IN_TRANS) !== 0 || (status & SERVER_STATUS_AUTOCOMMIT) === 0;
}

function options(sql: string, params: readonly unknown[]): QueryOptions {
  return { sql, values: params as unknown[], ...STATEMENT_OPTIONS };
}
