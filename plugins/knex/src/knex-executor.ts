import { classifyDriverError, toDriverStatement, type DialectName, type DriverErrorKind, type RunResult, type SqlExecutor, type SqlRow, type TransactionOptions, type TransactionPrologue } from '@courier/sql-engine';
import { createHash } from 'node:crypto';
import type { Knex } from 'knex';

/** Most statement texts a {@link KnexExecutor} names for preparing; later ones run unnamed (each connection keeps every statement it prepared). */
const MAX_NAMED_STATEMENTS = 256;

/**
 * The engine's {@link SqlExecutor} on Knex: every statement is a `knex.raw(sql, bindings)` on
 * the `Knex` instance or on the given `Knex.Transaction`, so it uses the application's pool,
 * its transactions and its query log. The engine's `?` placeholders are knex's raw binding
 * syntax; list parameters are expanded to one `?` per element; values are always bound.
 *
 * Guarantees: the engine's port contract (see `SqlExecutor`). Own transactions use
 * `knex.transaction()` (READ COMMITTED on MySQL/MariaDB when asked). With a prologue (SQLite)
 * every own transaction starts with it, and a statement given no transaction runs in a
 * transaction of its own, so the prologue precedes it on the same connection.
 *
 * On PostgreSQL, with `preparedStatements` (the default), a statement whose text does not
 * depend on a list's length runs as a named prepared statement (knex passes the raw query's
 * `options({ name })` to node-postgres): each connection parses and plans it once instead of
 * on every call — the append in the application's transaction among them. At most
 * {@link MAX_NAMED_STATEMENTS} texts are named. Turn it off behind a pooler that cannot keep
 * prepared statements (PgBouncer in transaction mode before 1.21).
 */
export class KnexExecutor implements SqlExecutor<Knex.Transaction> {
  readonly #knex: Knex;
  readonly #dialect: DialectName;
  readonly #prologue: TransactionPrologue | undefined;
  readonly #prepared: boolean;
  // Statement text → its prepared-statement name, or null once the names ran out.
  readonly #names = new Map<string, string | null>();

  constructor(knex: Knex, dialect: DialectName, prologue?: TransactionPrologue, options: { preparedStatements?: boolean } = {}) {
    this.#knex = knex;
    this.#dialect = dialect;
    this.#prologue = prologue;
    this.#prepared = dialect === 'postgresql' && options.preparedStatements !== false;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: Knex.Transaction): Promise<SqlRow[]> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.all(sql, params, own));
    return this.#read(await this.#raw(sql, params, tx)).rows;
  }

  /** Affected row count (and insert id) of a statement. */
  async run(sql: string, params: readonly unknown[] = [], tx?: Knex.Transaction): Promise<RunResult> {
    if (tx === undefined && this.#prologue) return this.transaction((own) => this.run(sql, params, own));
    const { affectedRows, insertId } = this.#read(await this.#raw(sql, params, tx));
    return { affectedRows, insertId };
  }

  /** Runs `work` in a Knex transaction of its own: committed when it resolves, rolled back when it throws. */
  transaction<T>(work: (tx: Knex.Transaction) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    const config: Knex.TransactionConfig = options.readCommitted && this.#dialect === 'mysql' ? { isolationLevel: 'read committed' } : {};
    return this.#knex.transaction(async (tx) => {
      await this.prologue(tx, options);
      return work(tx);
    }, config);
  }

  /** Runs a statement on the pool, outside any transaction and without the prologue. */
  async untransacted(sql: string): Promise<SqlRow[]> {
    return this.#read(await this.#knex.raw(sql)).rows;
  }

  /** Runs the prologue inside `tx` (a transaction the application opened); `writeLock: false` runs only the session part. */
  async prologue(tx: Knex.Transaction, options: { writeLock?: boolean } = {}): Promise<void> {
    if (!this.#prologue) return;
    for (const statement of this.#prologue.session) await tx.raw(statement);
    if (options.writeLock === false) return;
    for (const statement of this.#prologue.writeLock) {
      try {
        await tx.raw(statement);
      } catch (error) {
        // A missing table is reported by the statement that needs it, with the remedy,
        // not by the lock statement before it (which writes to the meta table).
        if (classifyDriverError(error) !== 'schema') throw error;
        return;
      }
    }
  }

  /**
   * Makes every connection the knex pool opens from now on run the prologue's session
   * settings (SQLite's busy timeout) before anything else uses it, and runs them on one now.
   * Idempotent. Why: the settings are per connection, and the application's own
   * transactions never pass through this executor; knex's pool may replace a connection.
   */
  async configureEveryConnection(): Promise<void> {
    if (!this.#prologue || this.#prologue.session.length === 0) return;
    const client = this.#knex.client as KnexClient;
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
    for (const statement of this.#prologue.session) await this.untransacted(statement);
  }

  /** Errors of knex's drivers (pg, mysql2, better-sqlite3/sqlite3) are what {@link classifyDriverError} knows. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  #raw(sql: string, params: readonly unknown[], tx: Knex.Transaction | undefined): Promise<unknown> {
    // knex.raw expands an array only on some clients (pg binds it as one array value): the
    // engine's list parameters are expanded here, the same on every dialect.
    const statement = toDriverStatement(sql, params, 'question');
    const bindings = statement.parameters as readonly Knex.RawBinding[];
    const raw = (tx ?? this.#knex).raw(statement.sql, [...bindings]);
    const name = this.#prepared ? this.#nameOf(sql, params) : undefined;
    return name === undefined ? raw : raw.options({ name });
  }

  /** The prepared-statement name of `sql`, unless a list parameter makes its text vary, or the names ran out. */
  #nameOf(sql: string, params: readonly unknown[]): string | undefined {
    for (const param of params) if (Array.isArray(param)) return undefined;
    let name = this.#names.get(sql);
    if (name === undefined) {
      // The name is derived from the text alone, so every executor on the same connections
      // agrees on it (node-postgres refuses one name for two texts).
      name = this.#names.size < MAX_NAMED_STATEMENTS ? `courier_${createHash('sha1').update(sql).digest('hex').slice(0, 20)}` : null;
      this.#names.set(sql, name);
    }
    return name ?? undefined;
  }

  /** What `knex.raw` resolves with differs by driver: pg's result, mysql2's `[rows, fields]`, SQLite's rows or run info. */
  #read(result: unknown): { rows: SqlRow[]; affectedRows: number; insertId: unknown } {
    switch (this.#dialect) {
      case 'postgresql': {
        const r = result as { rows?: SqlRow[]; rowCount?: number | null };
        const rows = r.rows ?? [];
        return { rows, affectedRows: r.rowCount ?? rows.length, insertId: undefined };
      }
      case 'mysql': {
        const first = (result as unknown[])[0];
        if (Array.isArray(first)) return { rows: first as SqlRow[], affectedRows: first.length, insertId: undefined };
        const header = first as { affectedRows?: number; insertId?: unknown } | undefined;
        return { rows: [], affectedRows: Number(header?.affectedRows ?? 0), insertId: header?.insertId };
      }
      case 'sqlite': {
        if (Array.isArray(result)) return { rows: result as SqlRow[], affectedRows: result.length, insertId: undefined };
        const info = result as { changes?: number; lastInsertRowid?: unknown; lastID?: unknown } | undefined;
        return { rows: [], affectedRows: Number(info?.changes ?? 0), insertId: info?.lastInsertRowid ?? info?.lastID };
      }
    }
  }
}

/** The part of a knex client {@link KnexExecutor.configureEveryConnection} uses. */
interface KnexClient {
  acquireRawConnection(): Promise<unknown>;
  _query(connection: unknown, query: { sql: string; bindings: unknown[]; method: string }): Promise<unknown>;
}

// Session statements per knex client, shared by every executor on it, so its raw
// connections are wrapped once.
const SESSION_STATEMENTS = new WeakMap<KnexClient, Set<string>>();
