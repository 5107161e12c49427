import { ConfigError } from '@courier/core';
import {
  createDialect,
  resolveTableNames,
  SqlInboxStore,
  SqlOutboxStore,
  SqlStoreCore,
  type CourierTablesConfig,
  type InsertGuard,
  type OutboxJoin,
  type OutboxPendingRow,
  type OutboxWriter,
  type SqlOutboxStoreOptions,
} from '@courier/sql-engine';
import type { Pool, PoolConnection } from 'mysql2/promise';
import { inTransaction, Mysql2Executor } from './mysql2-executor.js';
import { ENDED, PENDING, runInTransaction } from './transactions.js';

/** Arguments shared by {@link Mysql2OutboxStore} and {@link Mysql2InboxStore}. */
export interface Mysql2StoreConfig extends CourierTablesConfig {
  /** The application's mysql2 promise pool (`mysql.createPool(...)` from `mysql2/promise`); not closed by the store. */
  readonly pool: Pool;
}

/** Arguments of {@link Mysql2OutboxStore}. */
export interface Mysql2OutboxStoreConfig extends Mysql2StoreConfig, Omit<SqlOutboxStoreOptions, 'wakeups'> {}

/** Arguments of {@link Mysql2InboxStore}. */
export type Mysql2InboxStoreConfig = Mysql2StoreConfig;

/**
 * The engine's store core on mysql2: the MySQL dialect over the configured names, a
 * {@link Mysql2Executor} on the pool, and this package's remedies in its errors.
 */
class Mysql2StoreCore extends SqlStoreCore<PoolConnection, Mysql2Executor> {
  constructor(config: Mysql2StoreConfig, what: string) {
    if (config === null || typeof config !== 'object' || !isPool(config.pool) || typeof (config.pool as { promise?: unknown }).promise === 'function') {
      throw new ConfigError(`'pool' is required: pass a mysql2 promise pool (\`createPool\` from 'mysql2/promise', or \`pool.promise()\` of a callback pool)`);
    }
    const names = resolveTableNames(config);
    const dialect = createDialect('mysql', names);
    super({
      executor: new Mysql2Executor(config.pool),
      dialect,
      names,
      what,
      packageName: '@courier/mysql2',
      schemaHint: 'create it with `await outboxStore.ensureSchema()` (idempotent, safe from several processes at once)',
    });
  }
}

/**
 * The outbox on mysql2 for MariaDB/MySQL: the engine's {@link SqlOutboxStore} on a
 * {@link Mysql2Executor}, joined to the application's own transaction on a `PoolConnection`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite on MariaDB):
 * - `append(connection, …)` writes the rows on `connection`, in the transaction the
 *   application began there (`await connection.beginTransaction()`): they commit with it
 *   or not at all, and a rollback (or a rolled-back savepoint around them) leaves nothing.
 *   The write starts at once and `append` (so `publish`) returns a promise that settles
 *   when it is written (`asyncAppend`); writes on one connection run in append order.
 * - A `Pool` is refused with a `ConfigError` naming the fix, as is anything that is not a
 *   mysql2 promise connection. A connection in autocommit (no `beginTransaction()`) is
 *   refused too, never silently committed row by row: the INSERT itself carries the check
 *   (`INSERT … SELECT … WHERE (@@in_transaction = 1 OR @@autocommit = 0)`, so a publish is
 *   one statement, keyed or not), writes nothing when the connection is not in a transaction
 *   and autocommit is on, and the write fails with a `ConfigError`. On a server without
 *   `@@in_transaction` (MySQL has none; MariaDB has) the store falls back, after that one
 *   refused statement, to a `DO 0` before each write whose OK packet carries the
 *   server's `SERVER_STATUS_IN_TRANS` flag (one round trip more). Every refusal is the
 *   promise's rejection.
 * - Commit only after the write finished: await `publish`, or commit with
 *   {@link withTransaction} / {@link settleAppends}, which wait for every write started
 *   on the connection (awaited or not) and roll back when one failed.
 * - Everything else (claims, leases, fencing, per-key heads and locks, halts, pruning, the
 *   operator half) is the engine's MySQL dialect, the same SQL and tables as
 *   `@courier/mikro-orm` on MariaDB: either package reads rows the other wrote.
 */
export class Mysql2OutboxStore extends SqlOutboxStore<PoolConnection, PoolConnection, PoolConnection, Promise<void>> {
  constructor(config: Mysql2OutboxStoreConfig) {
    const core = new Mysql2StoreCore(config, 'Mysql2OutboxStore');
    super({ ...config, core, join: (writer) => new ConnectionJoin(writer) });
  }
}

/**
 * The idempotent inbox on mysql2 for MariaDB/MySQL: the engine's {@link SqlInboxStore},
 * running each handler in a transaction on a connection of the pool, with `ctx.tx` that
 * `PoolConnection`.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite on MariaDB): the
 * record, what the handler writes on `ctx.tx`, and what it appends to the outbox on
 * `ctx.tx` commit together or not at all; outbox writes the handler started and did not
 * await are waited for before the COMMIT. The transaction runs at the server's default
 * isolation, like the MikroORM inbox. See {@link SqlInboxStore} for duplicates, racing
 * runs and halts.
 */
export class Mysql2InboxStore extends SqlInboxStore<PoolConnection, PoolConnection> {
  constructor(config: Mysql2InboxStoreConfig) {
    const core = new Mysql2StoreCore(config, 'Mysql2InboxStore');
    super({
      core,
      transactions: {
        run: async (work) => runInTransaction(await config.pool.getConnection(), (tx) => work(tx, tx), false),
      },
    });
  }
}

/**
 * True when the connection is inside a transaction, or its next statement opens one
 * (autocommit off): MariaDB's `@@in_transaction` (checked on 10.11: 1 after BEGIN, also
 * within the first statement of a transaction autocommit = 0 opens; 0 in autocommit).
 */
const IN_TRANSACTION = '@@in_transaction = 1 OR @@autocommit = 0';

/** Joins a `PoolConnection` in a transaction: checks it, then writes the rows on it at once. */
class ConnectionJoin implements OutboxJoin<PoolConnection, PoolConnection, Promise<void>> {
  readonly asyncAppend = true as const;
  readonly #writer: OutboxWriter<PoolConnection>;
  readonly #guard: InsertGuard = { sql: IN_TRANSACTION, refused: notInTransaction };
  /** False once the server said it has no `@@in_transaction` (MySQL): then a `DO 0` checks first. */
  #guardInInsert = true;

  constructor(writer: OutboxWriter<PoolConnection>) {
    this.#writer = writer;
  }

  resolve(unit: PoolConnection): PoolConnection {
    if (ENDED.has(unit)) {
      throw new ConfigError(
        `'publish' got a connection whose transaction has already ended (committed or rolled back, and the connection released): publish inside the transaction's callback, before it returns`,
        { code: 'UNIT_OF_WORK_ENDED' },
      );
    }
    if (isPool(unit)) {
      throw new ConfigError(
        `'publish' got a mysql2 Pool, which would write each row in a transaction of its own: take a connection (\`const conn = await pool.getConnection(); await conn.beginTransaction()\`), publish on it, then commit — or use withTransaction(pool, (conn) => …) from '@courier/mysql2'`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    if (unit === null || typeof unit !== 'object' || typeof unit.query !== 'function' || typeof unit.beginTransaction !== 'function') {
      throw new ConfigError(`'publish' needs a mysql2 promise connection in a transaction (\`await pool.getConnection()\`, then \`beginTransaction()\`), got ${describe(unit)}`, {
        code: 'UNIT_OF_WORK_REQUIRED',
      });
    }
    if (typeof (unit as { promise?: unknown }).promise === 'function') {
      throw new ConfigError(`'publish' got a mysql2 callback-API connection: pass its promise wrapper (\`connection.promise()\`), or use 'mysql2/promise'`, {
        code: 'UNIT_OF_WORK_REQUIRED',
      });
    }
    return unit;
  }

  /**
   * Starts writing `rows` on `connection` at once, after the writes already started there,
   * and returns the write: `publish` resolves when the rows are in the transaction, or
   * rejects with what refused or failed them. The same outcome also reaches
   * {@link settleAppends} (and `withTransaction`, the inbox's run), which wait for every
   * write, so one the caller did not await is still waited for before the COMMIT.
   */
  add(connection: PoolConnection, rows: OutboxPendingRow[]): Promise<void> {
    return this.#start(connection, rows);
  }

  #start(connection: PoolConnection, rows: OutboxPendingRow[]): Promise<void> {
    let pending = PENDING.get(connection);
    if (pending === undefined) {
      pending = { tail: Promise.resolve(), wrote: false, committed: new Set() };
      PENDING.set(connection, pending);
    }
    const state = pending;
    const write = state.tail.then(async () => {
      // A transaction whose earlier write failed is not written to again: it must roll back.
      if (state.error !== undefined) throw state.error.value;
      await this.#write(connection, rows);
      state.wrote = true;
      state.committed.add(this.#writer.committed);
    });
    state.tail = write.then(
      () => undefined,
      (error: unknown) => {
        state.error ??= { value: error };
      },
    );
    // Handled here too: settleAppends reports the error to a caller that did not await
    // the publish.
    write.catch(() => undefined);
    return write;
  }

  /** Writes `rows` with the INSERT holding the transaction check, or after a `DO 0` check where the server cannot. */
  async #write(connection: PoolConnection, rows: OutboxPendingRow[]): Promise<void> {
    if (this.#guardInInsert) {
      try {
        await this.#writer.write(rows, connection, this.#guard);
        return;
      } catch (error) {
        // ER_UNKNOWN_SYSTEM_VARIABLE, raised before the statement ran: nothing was written
        // and the transaction is intact, so the write is made again the other way.
        if (!unknownInTransaction(error)) throw error;
        this.#guardInInsert = false;
      }
    }
    if (!(await inTransaction(connection))) throw notInTransaction();
    await this.#writer.write(rows, connection);
  }
}

function notInTransaction(): ConfigError {
  return new ConfigError(
    `'publish' got a connection that is not in a transaction (autocommit): call \`await connection.beginTransaction()\` first, or use withTransaction(pool, (conn) => …) from '@courier/mysql2'`,
    { code: 'UNIT_OF_WORK_REQUIRED' },
  );
}

/** Whether `error` (a `StorageError` around mysql2's) says the server has no `in_transaction` variable. */
function unknownInTransaction(error: unknown): boolean {
  const cause = (error as { cause?: { errno?: unknown; message?: unknown } } | null)?.cause;
  return cause?.errno === 1193 && typeof cause.message === 'string' && cause.message.includes('in_transaction');
}

function isPool(value: unknown): value is Pool {
  return value !== null && typeof value === 'object' && typeof (value as { getConnection?: unknown }).getConnection === 'function';
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
