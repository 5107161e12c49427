import { classifyDriverError, type DriverErrorKind, type RunResult, type SqlExecutor, type SqlRow, type TransactionOptions, type TransactionPrologue } from '@courier/sql-engine';
import type { Connection, IsolationLevel, Transaction } from '@mikro-orm/core';

// The types and row readers moved to @courier/sql-engine; re-exported for `sql-kit` users.
export type { RunResult, SqlRow, TransactionPrologue } from '@courier/sql-engine';
export { toBigInt, toNullableString, toNumber } from '@courier/sql-engine';

/**
 * `IsolationLevel.READ_COMMITTED`, spelled out: a value import of `@mikro-orm/core` would
 * make Node's ESM loader lex the whole CommonJS package (hundreds of ms at start-up) even
 * when the application loaded MikroORM with `require`. Type-only imports cost nothing.
 */
export const READ_COMMITTED = 'read committed' as IsolationLevel;

/**
 * The MikroORM implementation of the engine's {@link SqlExecutor}: runs Courier's
 * hand-written SQL on a MikroORM connection, optionally inside a driver
 * transaction. Statements go through `Connection.execute`, so they appear in MikroORM's
 * query log like the ORM's own; values are bound with `?` placeholders and quoted by the
 * platform (MikroORM inlines them with the driver's own escaping).
 *
 * With a prologue (SQLite), every transaction starts with it, and statements given no
 * transaction run in one of their own, so the prologue always precedes them on the same
 * connection (the pool may replace the connection between two calls).
 */
export class SqlRunner implements SqlExecutor<Transaction> {
  readonly #connection: Connection;
  readonly #prologue: TransactionPrologue | undefined;

  constructor(connection: Connection, prologue?: TransactionPrologue) {
    this.#connection = connection;
    this.#prologue = prologue;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], trx?: Transaction): Promise<SqlRow[]> {
    if (trx === undefined && this.#prologue) return this.transaction((own) => this.all(sql, params, own));
    const result: unknown = await this.#connection.execute(sql, [...params], 'all', trx);
    return Array.isArray(result) ? (result as SqlRow[]) : [];
  }

  /** Affected row count of a statement. */
  async run(sql: string, params: readonly unknown[] = [], trx?: Transaction): Promise<RunResult> {
    if (trx === undefined && this.#prologue) return this.transaction((own) => this.run(sql, params, own));
    const result = (await this.#connection.execute(sql, [...params], 'run', trx)) as { affectedRows?: unknown; insertId?: unknown } | undefined;
    return { affectedRows: Number(result?.affectedRows ?? 0), insertId: result?.insertId };
  }

  /**
   * Makes every connection the ORM opens from now on run the prologue's session settings
   * (SQLite: `PRAGMA busy_timeout`) once, before anything else uses it, and runs them on
   * the current one now. Idempotent; no-op without a prologue.
   *
   * Why: the settings are per connection, and the transactions the application runs itself
   * (`em.transactional`, a flush) never pass through this runner. `@mikro-orm/libsql`
   * 6.6.16 replaces its connection every 10 s (its knex dialect deems a connection older
   * than that invalid), and libsql opens it with no busy timeout, so without this an
   * application write on a fresh connection fails at once with `SQLITE_BUSY` ("database
   * is locked") whenever another process holds the file — and that failure inside a
   * transaction leaves the connection unusable ("SQL statements in progress", then
   * knex's "Transaction query already complete"). Reproduced in
   * test/sqlite-fresh-connection.test.ts.
   *
   * It wraps the knex client's `acquireRawConnection` of the application's ORM (MikroORM 6
   * drivers are knex based; a connection without a knex client is left as it is and only
   * this runner's own transactions get the settings).
   */
  async configureEveryConnection(): Promise<void> {
    if (!this.#prologue || this.#prologue.session.length === 0) return;
    const client = knexClientOf(this.#connection);
    if (client !== undefined) {
      let statements = SESSION_STATEMENTS.get(client);
      if (statements === undefined) {
        const known = new Set<string>();
        statements = known;
        SESSION_STATEMENTS.set(client, known);
        const acquire = client.acquireRawConnection.bind(client);
        client.acquireRawConnection = async () => {
          const raw = await acquire();
          for (const sql of known) await client._query(raw, { sql, bindings: [], method: 'raw' });
          return raw;
        };
      }
      for (const statement of this.#prologue.session) statements.add(statement);
    }
    for (const statement of this.#prologue.session) await this.untransacted(statement);
  }

  /** Runs a statement outside any transaction and without the prologue (pragmas that refuse to run in a transaction). */
  async untransacted(sql: string): Promise<SqlRow[]> {
    const result: unknown = await this.#connection.execute(sql, [], 'all');
    return Array.isArray(result) ? (result as SqlRow[]) : [];
  }

  /**
   * Runs the prologue inside `trx` before its first statement, for a transaction opened
   * elsewhere (an `em.transactional()`). `writeLock: false` runs only the session part.
   */
  async prologue(trx: Transaction, options: { writeLock?: boolean } = {}): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await this.#connection.execute(statement, [], 'all', trx);
    if (options.writeLock === false) return;
    for (const statement of this.#prologue.writeLock) {
      try {
        await this.#connection.execute(statement, [], 'all', trx);
      } catch (error) {
        // A missing table is reported by the statement that needs it, with the remedy,
        // not by the lock statement before it (which writes to the meta table).
        if (classifyDriverError(error) !== 'schema') throw error;
        return;
      }
    }
  }

  /** Driver errors of MikroORM's drivers (pg, mysql2/mariadb, libsql) are what {@link classifyDriverError} knows. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  /**
   * Runs `work` in a transaction of its own (committed when it resolves, rolled back when
   * it throws), after the prologue. `readCommitted` asks for READ COMMITTED where the
   * database's default is stricter (MySQL/MariaDB), so that store transactions take no gap
   * locks producers could queue behind. `writeLock: false` skips the prologue's write lock
   * (schema creation, when the table it writes may not exist yet).
   */
  transaction<T>(work: (trx: Transaction) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const isolation = options.readCommitted ? { isolationLevel: READ_COMMITTED } : {};
    if (!this.#prologue) return this.#connection.transactional(work, isolation);
    return this.#connection.transactional(async (trx) => {
      await this.prologue(trx, options);
      return work(trx);
    }, isolation);
  }
}

/** The part of a knex client {@link SqlRunner.configureEveryConnection} uses. */
interface KnexClient {
  acquireRawConnection(): Promise<unknown>;
  _query(connection: unknown, query: { sql: string; bindings: unknown[]; method: string }): Promise<unknown>;
}

// Session statements per knex client (one client per ORM), shared by every runner on it
// (stores and transport), so its raw connections are wrapped once.
const SESSION_STATEMENTS = new WeakMap<KnexClient, Set<string>>();

function knexClientOf(connection: Connection): KnexClient | undefined {
  const getKnex = (connection as { getKnex?: () => { client?: unknown } }).getKnex;
  if (typeof getKnex !== 'function') return undefined;
  const client = getKnex.call(connection).client as Partial<KnexClient> | undefined;
  if (typeof client?.acquireRawConnection !== 'function' || typeof client._query !== 'function') return undefined;
  return client as KnexClient;
}
