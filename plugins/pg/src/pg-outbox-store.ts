import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxJoin, type OutboxPendingRow, type OutboxWriter, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { PoolClient } from 'pg';
import { pgListenSource } from './pg-listen-source.js';
import { PgStoreCore, type PgStoreConfig } from './pg-store-core.js';
import type { TransactionStatusWatch } from './transaction-status.js';
import { trackAppend } from './pending-appends.js';

/** Arguments of {@link PgOutboxStore}. */
export interface PgOutboxStoreConfig extends PgStoreConfig, SqlOutboxStoreOptions {}

/**
 * The outbox on node-postgres: the engine's {@link SqlOutboxStore} on a `pg` `Pool`, joined to
 * the transaction of the `PoolClient` the caller holds between `BEGIN` and `COMMIT`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(client, …)` (and `bus.outbox(client).publish(…)`) writes the rows at once on
 *   `client`, inside its open transaction, and returns a promise that settles when they are
 *   written: await it before `COMMIT`. The rows commit with the transaction or not at all; a
 *   `ROLLBACK` (or `ROLLBACK TO SAVEPOINT` of a savepoint opened before the append) leaves
 *   nothing. A failed append (a duplicate messageId) puts the transaction in PostgreSQL's
 *   failed state, so its `COMMIT` cannot commit the business change without the message.
 * - Something that is not a transaction is refused with a `ConfigError`
 *   (`UNIT_OF_WORK_REQUIRED`), never written in autocommit: a `Pool`, and a client with no
 *   transaction open, known from the transaction status PostgreSQL reports after every
 *   statement (a client seen for the first time costs one `SELECT 1` to learn it). A client
 *   whose transaction failed is refused with `UNIT_OF_WORK_ENDED`.
 * - The relay's statements run on the pool, as prepared statements (see `PgExecutor`).
 * - Relays in this process wake when the transaction that carried rows ends; others by
 *   `LISTEN`/`NOTIFY` on a dedicated connection the store opens from the pool's settings.
 * - Everything else as {@link SqlOutboxStore}: per-key order equals commit order, fenced
 *   leases, database errors as `StorageError` (a missing schema says how to create it).
 */
export class PgOutboxStore extends SqlOutboxStore<PoolClient, PoolClient, PoolClient, Promise<void>> {
  constructor(config: PgOutboxStoreConfig) {
    const core = new PgStoreCore(config, 'PgOutboxStore');
    super({
      ...config,
      core,
      listenSource: pgListenSource(config.pool),
      join: (writer) => new PgTransactionJoin(writer, core.status),
    });
  }
}

/** Joins the transaction of a `PoolClient`: checks it is one, then writes at once in it. */
class PgTransactionJoin implements OutboxJoin<PoolClient, PoolClient, Promise<void>> {
  readonly asyncAppend = true;
  readonly #writer: OutboxWriter<PoolClient>;
  readonly #status: TransactionStatusWatch;

  constructor(writer: OutboxWriter<PoolClient>, status: TransactionStatusWatch) {
    this.#writer = writer;
    this.#status = status;
  }

  resolve(unit: PoolClient): PoolClient {
    if (unit === null || typeof unit !== 'object' || typeof (unit as { query?: unknown }).query !== 'function') {
      throw new ConfigError(`'append' needs the pg PoolClient (or Client) of an open transaction, got ${describe(unit)}`, { code: 'UNIT_OF_WORK_REQUIRED' });
    }
    if (isPool(unit)) {
      throw new ConfigError(
        `'append' got a pg Pool, which runs every statement in a transaction of its own: pass the PoolClient you hold between BEGIN and COMMIT (const client = await pool.connect(); await client.query('BEGIN')), or use withTransaction(pool, async (client) => ...)`,
        { code: 'UNIT_OF_WORK_REQUIRED' },
      );
    }
    refuseStatus(this.#status.status(unit));
    return unit;
  }

  add(client: PoolClient, rows: OutboxPendingRow[]): Promise<void> {
    const written = this.#add(client, rows);
    trackAppend(client, written);
    return written;
  }

  async #add(client: PoolClient, rows: OutboxPendingRow[]): Promise<void> {
    if (this.#status.status(client) === undefined) {
      // First sight of this client: its ReadyForQuery status is learned from a probe.
      await client.query('SELECT 1');
      refuseStatus(this.#status.status(client));
    }
    await this.#writer.write(rows, client);
    // Wake relays once the transaction ends (a rollback wakes them for nothing, harmlessly).
    if (!this.#status.whenIdle(client, () => this.#writer.committed())) this.#writer.committed();
  }
}

function refuseStatus(status: string | undefined): void {
  if (status === 'I') {
    throw new ConfigError(
      `'append' got a pg client with no transaction open: the rows would commit on their own. Run BEGIN on it first (and COMMIT after awaiting publish), or use withTransaction(pool, async (client) => ...)`,
      { code: 'UNIT_OF_WORK_REQUIRED' },
    );
  }
  if (status === 'E') {
    throw new ConfigError(`'append' got a pg client whose transaction has failed (PostgreSQL refuses every statement until ROLLBACK): roll it back and start again`, {
      code: 'UNIT_OF_WORK_ENDED',
    });
  }
}

/** A `pg.Pool` (or pg-pool): hands out clients, has pool counters, and is no client itself. */
function isPool(value: object): boolean {
  const candidate = value as { connect?: unknown; totalCount?: unknown; release?: unknown };
  return typeof candidate.connect === 'function' && typeof candidate.totalCount === 'number' && typeof candidate.release !== 'function';
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return (value as object).constructor?.name ?? 'an object';
}
