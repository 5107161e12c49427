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
import type BetterSqlite3 from 'better-sqlite3';
import { beginWithRetry, describe, gateOf, settleWrites, sqliteValue, trackWrite } from './write-gate.js';

/** A better-sqlite3 connection (`new Database(file)`). */
export type Database = BetterSqlite3.Database;

/**
 * The transaction a statement of the engine runs in: the connection, and which transaction
 * of this package was open on it when the unit of work was handed over (`undefined`: one the
 * application began itself). A statement checks both before it runs, so a write that comes
 * after its transaction ended never lands in autocommit or in someone else's transaction.
 */
export interface BetterSqlite3Tx {
  readonly database: Database;
  readonly transactionId: number | undefined;
  /** The transaction object of this package's own transaction (its pending writes are kept under it), if it is one. */
  readonly owner?: BetterSqlite3Tx;
}

/** The transaction of this package open on a connection, by connection. */
const OPEN = new WeakMap<Database, BetterSqlite3Tx>();
let lastTransactionId = 0;

/** Statements prepared per connection (better-sqlite3 compiles on `prepare`; the engine's texts repeat). */
const STATEMENTS = new WeakMap<Database, Map<string, BetterSqlite3.Statement>>();
const MAX_CACHED_STATEMENTS = 500;

/**
 * The better-sqlite3 implementation of the engine's {@link SqlExecutor}. Statements run
 * synchronously on the connection the store was given, prepared once and cached; an array
 * parameter is expanded into one `?` per element.
 *
 * Transactions (`transaction`, {@link withTransaction}, the inbox's handler runs) take
 * turns on the connection in this process through one queue (see `WriteGate`), then begin
 * with `BEGIN IMMEDIATE` at busy timeout 0, retried with timers while another process holds
 * the write lock, so the event loop is never blocked waiting for SQLite's lock. A statement
 * given no transaction runs in a transaction of its own.
 */
export class BetterSqlite3Executor implements SqlExecutor<BetterSqlite3Tx> {
  readonly #database: Database;

  constructor(database: Database) {
    this.#database = database;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: BetterSqlite3Tx): Promise<SqlRow[]> {
    if (tx === undefined) return this.transaction((own) => this.all(sql, params, own));
    const { statement, parameters } = this.#prepare(sql, params, tx);
    if (!statement.reader) {
      statement.run(...parameters);
      return [];
    }
    return statement.all(...parameters) as SqlRow[];
  }

  /** Affected row count and insert id of a statement (a `… RETURNING` counts its rows). */
  async run(sql: string, params: readonly unknown[] = [], tx?: BetterSqlite3Tx): Promise<RunResult> {
    if (tx === undefined) return this.transaction((own) => this.run(sql, params, own));
    const { statement, parameters } = this.#prepare(sql, params, tx);
    if (statement.reader) {
      const rows = statement.all(...parameters);
      return { affectedRows: rows.length, insertId: undefined };
    }
    const result = statement.run(...parameters);
    return { affectedRows: result.changes, insertId: result.lastInsertRowid };
  }

  /** Runs `work` in a transaction of its own on the connection (see the class comment). */
  transaction<T>(work: (tx: BetterSqlite3Tx) => Promise<T>): Promise<T> {
    return runTransaction(this.#database, work);
  }

  /** Runs a statement directly on the connection (the journal mode pragma, which refuses to run in a transaction). */
  async untransacted(sql: string): Promise<SqlRow[]> {
    const statement = this.#database.prepare(sql);
    if (!statement.reader) {
      statement.run();
      return [];
    }
    return statement.all() as SqlRow[];
  }

  /**
   * Nothing to do: every transaction this package runs holds the write lock from its
   * `BEGIN IMMEDIATE`, and the application's own transactions keep the busy timeout the
   * application gave its connection.
   */
  async prologue(): Promise<void> {}

  /** better-sqlite3's `SqliteError` codes (`SQLITE_BUSY`, `SQLITE_CONSTRAINT_UNIQUE`, …) as the engine knows them. */
  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  #prepare(sql: string, params: readonly unknown[], tx: BetterSqlite3Tx) {
    assertStillOpen(tx);
    const driver = toDriverStatement(sql, params, 'question');
    const parameters = driver.parameters.map(sqliteValue);
    if (tx.database !== this.#database) return { statement: tx.database.prepare(driver.sql), parameters };
    let cache = STATEMENTS.get(this.#database);
    if (cache === undefined) {
      cache = new Map();
      STATEMENTS.set(this.#database, cache);
    }
    let statement = cache.get(driver.sql);
    if (statement === undefined) {
      statement = this.#database.prepare(driver.sql);
      if (cache.size >= MAX_CACHED_STATEMENTS) cache.clear();
      cache.set(driver.sql, statement);
    }
    return { statement, parameters };
  }
}

/**
 * Throws a `ConfigError` (code `UNIT_OF_WORK_ENDED`) when the transaction `tx` stands for is
 * no longer the one open on its connection: it committed or rolled back (better-sqlite3's
 * `db.transaction(fn)` commits when `fn` returns, before a write `fn` did not wait for
 * could run), or another transaction of this package began since.
 */
function assertStillOpen(tx: BetterSqlite3Tx): void {
  const { database } = tx;
  if (database.open && database.inTransaction && OPEN.get(database)?.transactionId === tx.transactionId) return;
  throw new ConfigError(
    `'publish' wrote after its better-sqlite3 transaction had ended: better-sqlite3's db.transaction(fn) is synchronous and commits before an awaited write can run, ` +
      `so publish inside withTransaction(db, async (db) => { …; await bus.outbox(db).publish(…) }) from '@courier/sqlite', or between db.exec('BEGIN IMMEDIATE') and db.exec('COMMIT'), awaiting the publish`,
    { code: 'UNIT_OF_WORK_ENDED' },
  );
}

async function runTransaction<T>(database: Database, work: (tx: BetterSqlite3Tx) => Promise<T>): Promise<T> {
  return gateOf(database).run(async () => {
    await beginWithRetry(() => beginImmediate(database));
    lastTransactionId += 1;
    const tx: BetterSqlite3Tx = { database, transactionId: lastTransactionId };
    OPEN.set(database, tx);
    try {
      const result = await work(tx);
      // A publish not awaited is part of this transaction: wait for it, roll back if it failed.
      await settleWrites(tx);
      database.exec('COMMIT');
      return result;
    } catch (error) {
      await settleWrites(tx).catch(() => undefined);
      if (database.inTransaction) {
        try {
          database.exec('ROLLBACK');
        } catch {
          // The connection reports the failure of its next statement; the work's error matters here.
        }
      }
      throw error;
    } finally {
      OPEN.delete(database);
    }
  });
}

function beginImmediate(database: Database): void {
  if (!database.open) throw new ConfigError(`the better-sqlite3 Database ${JSON.stringify(database.name)} is closed`);
  if (database.inTransaction) {
    // The application began a transaction of its own on this connection and holds it across
    // an await: wait (as for another process's lock) rather than run inside it.
    throw Object.assign(
      new Error(
        `the better-sqlite3 Database ${JSON.stringify(database.name)} stayed in a transaction not run by @courier/sqlite; hold no transaction across an await outside withTransaction(db, …) (SQLITE_BUSY)`,
      ),
      { code: 'SQLITE_BUSY' },
    );
  }
  const previous = database.pragma('busy_timeout', { simple: true }) as number;
  database.pragma('busy_timeout = 0');
  try {
    database.exec('BEGIN IMMEDIATE');
  } finally {
    database.pragma(`busy_timeout = ${Number(previous)}`);
  }
}

/**
 * Runs `work` in a transaction on `database` and owns its BEGIN and COMMIT: waits for the
 * transactions of `@courier/sqlite` already running on that connection in this process (a
 * relay's, a consumer's), begins with `BEGIN IMMEDIATE` (waiting with timers while another
 * process holds the write lock, up to 30 s), commits when `work` resolves and rolls back
 * when it throws, rethrowing its error.
 *
 * Await every `publish` inside `work`. Use it instead of better-sqlite3's own
 * `db.transaction(fn)`, which runs `fn` synchronously and so cannot wait for a publish.
 */
export function withTransaction<T>(database: Database, work: (database: Database) => Promise<T>): Promise<T> {
  if (!isDatabase(database)) throw new ConfigError(`withTransaction needs a better-sqlite3 Database (\`new Database(file)\`), got ${describe(database)}`);
  return runTransaction(database, () => work(database));
}

/** Arguments shared by {@link BetterSqlite3OutboxStore} and {@link BetterSqlite3InboxStore}. */
export interface BetterSqlite3StoreConfig extends CourierTablesConfig {
  /**
   * The application's better-sqlite3 connection (`new Database(file)`); not closed by the
   * store. Relays, consumers and the operator commands run their transactions on it.
   */
  readonly database: Database;
}

/** Arguments of {@link BetterSqlite3OutboxStore}. */
export interface BetterSqlite3OutboxStoreConfig extends BetterSqlite3StoreConfig, Omit<SqlOutboxStoreOptions, 'wakeups'> {}

/** Arguments of {@link BetterSqlite3InboxStore}. */
export type BetterSqlite3InboxStoreConfig = BetterSqlite3StoreConfig;

class BetterSqlite3StoreCore extends SqlStoreCore<BetterSqlite3Tx, BetterSqlite3Executor> {
  readonly database: Database;

  constructor(config: BetterSqlite3StoreConfig, what: string) {
    if (config === null || typeof config !== 'object' || !isDatabase(config.database)) {
      throw new ConfigError(`'database' is required: pass the application's better-sqlite3 Database (\`new Database(file)\`), got ${describe(config?.database)}`);
    }
    const names = resolveTableNames(config);
    super({
      executor: new BetterSqlite3Executor(config.database),
      dialect: createDialect('sqlite', names),
      names,
      what,
      packageName: '@courier/sqlite',
      schemaHint: 'create it with `await outboxStore.ensureSchema()` (idempotent, safe from several processes at once)',
    });
    this.database = config.database;
  }
}

/**
 * The outbox on better-sqlite3: the engine's `SqlOutboxStore` with the SQLite dialect,
 * joined to a transaction on the application's own connection.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(db, …)` (what `bus.outbox(db).publish()` calls) writes the rows at once on `db`,
 *   in the transaction open there ({@link withTransaction}, or `BEGIN IMMEDIATE` … `COMMIT`
 *   of your own), and returns a promise to await before the commit. The rows commit with
 *   that transaction or not at all; a rollback (or a rolled-back savepoint) leaves nothing.
 * - Refused with a `ConfigError` naming the fix, before anything is written: a connection
 *   not in a transaction (never a silent autocommit), a closed one, one on another file, or
 *   anything that is not a better-sqlite3 `Database`. A write that would run after its
 *   transaction ended (better-sqlite3's synchronous `db.transaction(fn)`) fails with a
 *   `ConfigError` of code `UNIT_OF_WORK_ENDED` instead of writing.
 * - Claims, leases, fencing, per-key order, halts, pruning and the operator half are the
 *   engine's SQLite dialect: the same tables as `@courier/mikro-orm` and `@courier/kysely`
 *   on SQLite. Several processes may share the file (WAL mode, set by `ensureSchema`).
 */
export class BetterSqlite3OutboxStore extends SqlOutboxStore<Database, BetterSqlite3Tx, BetterSqlite3Tx, Promise<void>> {
  constructor(config: BetterSqlite3OutboxStoreConfig) {
    const core = new BetterSqlite3StoreCore(config, 'BetterSqlite3OutboxStore');
    super({ ...config, core, join: (writer) => databaseJoin(core.database, writer) });
  }
}

/**
 * The idempotent inbox on better-sqlite3: the engine's `SqlInboxStore`, running each handler
 * in a transaction of {@link withTransaction} on the store's connection, with `ctx.tx` that
 * better-sqlite3 `Database` (write with `ctx.tx.prepare(…).run(…)`, publish with
 * `bus.outbox(ctx.tx)`). The record, the handler's writes and its outbox rows commit
 * together or not at all. better-sqlite3 has one connection per `Database`: while a handler
 * runs, statements other code sends on that `Database` outside `withTransaction` run inside
 * the handler's transaction; give them `withTransaction`, which waits its turn.
 */
export class BetterSqlite3InboxStore extends SqlInboxStore<Database, BetterSqlite3Tx> {
  constructor(config: BetterSqlite3InboxStoreConfig) {
    const core = new BetterSqlite3StoreCore(config, 'BetterSqlite3InboxStore');
    super({ core, transactions: { run: (work) => runTransaction(core.database, (tx) => work(tx.database, tx)) } });
  }
}

function databaseJoin(storeDatabase: Database, writer: OutboxWriter<BetterSqlite3Tx>) {
  return {
    asyncAppend: true as const,
    resolve(unit: Database): BetterSqlite3Tx {
      if (!isDatabase(unit)) {
        throw new ConfigError(`'publish' needs the better-sqlite3 Database in a transaction (withTransaction(db, async (db) => …) from '@courier/sqlite'), got ${describe(unit)}`, {
          code: 'UNIT_OF_WORK_REQUIRED',
        });
      }
      if (!unit.open) throw new ConfigError(`'publish' got a closed better-sqlite3 Database (${JSON.stringify(unit.name)})`, { code: 'UNIT_OF_WORK_ENDED' });
      if (unit !== storeDatabase && unit.name !== storeDatabase.name) {
        throw new ConfigError(`'publish' got a better-sqlite3 Database on ${JSON.stringify(unit.name)}, but the outbox is in ${JSON.stringify(storeDatabase.name)}: publish on a connection to the outbox's file`, {
          code: 'UNIT_OF_WORK_REQUIRED',
        });
      }
      if (!unit.inTransaction) {
        throw new ConfigError(
          `'publish' got a better-sqlite3 Database that is not in a transaction, which would commit each row on its own: publish inside withTransaction(db, async (db) => …) from '@courier/sqlite', or after db.exec('BEGIN IMMEDIATE')`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      const own = OPEN.get(unit);
      return own === undefined ? { database: unit, transactionId: undefined } : { database: unit, transactionId: own.transactionId, owner: own };
    },
    add(tx: BetterSqlite3Tx, rows: OutboxPendingRow[]): Promise<void> {
      const write = writer.write(rows, tx).then(() => writer.committed());
      if (tx.owner !== undefined) trackWrite(tx.owner, write);
      return write;
    },
  };
}

/** A better-sqlite3 `Database` (what `new Database(file)` returns), by its shape. */
export function isDatabase(value: unknown): value is Database {
  if (value === null || typeof value !== 'object') return false;
  const candidate = value as Partial<Record<keyof Database, unknown>>;
  return typeof candidate.prepare === 'function' && typeof candidate.exec === 'function' && typeof candidate.pragma === 'function' && typeof candidate.inTransaction === 'boolean';
}
