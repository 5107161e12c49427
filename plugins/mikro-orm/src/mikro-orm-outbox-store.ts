import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxPendingRow, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { EntityManager, Transaction } from '@mikro-orm/core';
import { knexListenSource } from './knex-listen-source.js';
import { OutboxUnitOfWork } from './outbox-unit-of-work.js';
import { StoreCore, type MikroOrmStoreConfig } from './store-core.js';

/** Arguments of {@link MikroOrmOutboxStore}. */
export interface MikroOrmOutboxStoreConfig extends MikroOrmStoreConfig, SqlOutboxStoreOptions {}

/**
 * The outbox on MikroORM 6: one store for PostgreSQL, MySQL/MariaDB and SQLite — the
 * engine's {@link SqlOutboxStore} on a {@link StoreCore} (MikroORM's `SqlRunner`) joined to
 * MikroORM's unit of work ({@link OutboxUnitOfWork}).
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(em, …)` joins `em`'s unit of work: the rows are written by the same
 *   `em.flush()` (or the flush `em.transactional()` ends with), in the same transaction as
 *   the entity changes, or not at all. Rows belong to the transaction they were appended
 *   in: a rollback or `em.clear()` discards them, and no later transaction of the same
 *   EntityManager writes them. The global EntityManager, an EntityManager of another ORM,
 *   one whose transaction ended, and one whose `em.transactional()` fork is active are
 *   refused with a `ConfigError`.
 * - A transaction takes the key locks of all its rows in one sorted pass at its commit,
 *   however many flushes appended them, so producers never deadlock on each other.
 * - Appends of one (topic, key) are serialised by a transaction-scoped lock taken right
 *   before the insert, so sequence order is commit order and no row is claimable before an
 *   earlier-committed row of its key (SQLite's single writer gives the same for free).
 * - `claim` compares only with the database clock, returns due head-of-key rows under a
 *   lease with a strictly increasing fencing token; concurrent claims never share a row
 *   (`FOR UPDATE SKIP LOCKED`; SQLite has one writer). `complete`, `fail` and `release`
 *   change only rows whose current lease token is the caller's. `completeAndClaim` does a
 *   `complete` and a head claim in one transaction (one statement on PostgreSQL). A
 *   completion marks its rows published or, with `publishedRows: 'delete'`, deletes them
 *   (same rows, same count; see `publishedRows` in {@link MikroOrmOutboxStoreConfig}).
 * - With `perKey > 1` the heads are claimed exactly as with `perKey: 1` (with the
 *   completion, if any); only when they leave room in the batch and some are keyed, a
 *   second short transaction adds the rows right behind each head that is still held by
 *   the lease (contiguous, pending, due, not locked elsewhere, at most `perKey - 1` per key)
 *   under the same lease. The batch is one lease, sorted by sequence. If that second step
 *   fails, the batch is returned with its heads only (the failure is logged): the first
 *   step has committed and stays valid. MySQL/MariaDB instead claim heads and followers in
 *   one transaction that takes the token's counter row first (InnoDB deadlocked between
 *   the two steps of different relays under load; see `#claimRunsInnoDb`).
 * - Payload and headers are stored as text, byte for byte.
 * - Database errors become `StorageError` (retriable for lost connections, deadlocks, lock
 *   and statement timeouts, serialization failures); a missing or outdated schema is a
 *   `StorageError` with code `SCHEMA_MISSING` that says how to create it.
 */
export class MikroOrmOutboxStore<EM extends EntityManager = EntityManager> extends SqlOutboxStore<EM, Transaction, EntityManager> {
  constructor(config: MikroOrmOutboxStoreConfig) {
    if (config === null || typeof config !== 'object' || config.orm === null || typeof config.orm !== 'object') {
      throw new ConfigError(`'orm' is required: pass the application's initialised MikroORM instance`);
    }
    const core = new StoreCore(config, 'MikroOrmOutboxStore');
    super({
      ...config,
      core,
      listenSource: core.dialect.name === 'postgresql' ? knexListenSource(config.orm.em.getConnection('write')) : undefined,
      join: (writer) => new OutboxUnitOfWork<OutboxPendingRow>({ orm: config.orm, ...writer }),
    });
  }
}
