import { ConfigError } from '@courier/core';
import { SqlInboxStore } from '@courier/sql-engine';
import type { EntityManager, Transaction } from '@mikro-orm/core';
import { StoreCore, type MikroOrmStoreConfig } from './store-core.js';

/** Arguments of {@link MikroOrmInboxStore}. */
export type MikroOrmInboxStoreConfig = MikroOrmStoreConfig;

/**
 * The idempotent inbox on MikroORM 6 (PostgreSQL, MySQL/MariaDB, SQLite): the engine's
 * {@link SqlInboxStore} on a {@link StoreCore}, running handlers in `em.transactional()`.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` forks an EntityManager from the ORM, opens a transaction with
 *   `em.transactional()`, inserts the (messageId, consumer) row first, then runs `work`
 *   with the transactional EntityManager; MikroORM flushes what `work` persisted (and what
 *   it appended to the outbox) and commits it together with the record.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without
 *   running `work`. Racing first runs meet at the primary key: the insert of the second
 *   waits for the first's transaction and sees the duplicate once it commits, so exactly
 *   one runs `work` to commit. If the first run rolls back, one waiter records the pair and
 *   runs `work`, the others see its record; a waiter that loses a deadlock there (InnoDB)
 *   starts its transaction over by itself (work has not run), up to 10 times.
 * - If `work` throws, its error propagates unchanged and nothing (record, effects, outbox
 *   rows) is committed. Database errors of the store's own statements, the final flush and
 *   the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts, so a message that kills its process is still counted after a restart.
 * - Halts (`InboxHalts`, for ordered subscriptions with `poison: 'halt'`; schema version 3):
 *   a `run` with `hold` reads the key's halt row with a share lock in the run's own
 *   transaction and, when halted, inserts the message as held (once per (consumer,
 *   messageId)) instead of running `work`; every drain step locks the halt row for update
 *   and checks the drainer's lease on the database clock; `lift` counts held rows only
 *   after that lock, so it never strands a message held concurrently.
 */
export class MikroOrmInboxStore<EM extends EntityManager = EntityManager> extends SqlInboxStore<EM, Transaction> {
  constructor(config: MikroOrmInboxStoreConfig) {
    if (config === null || typeof config !== 'object' || config.orm === null || typeof config.orm !== 'object') {
      throw new ConfigError(`'orm' is required: pass the application's initialised MikroORM instance`);
    }
    const orm = config.orm;
    super({
      core: new StoreCore(config, 'MikroOrmInboxStore'),
      transactions: {
        // A fork of the ORM's EntityManager, cleared, so the handler starts from an empty
        // identity map; MikroORM flushes what it persisted before the commit.
        run: (work) =>
          orm.em.fork({ clear: true }).transactional(async (em) => {
            const trx = em.getTransactionContext<Transaction>();
            if (trx === undefined) throw new Error('em.transactional() gave no transaction (disableTransactions is set?)');
            return work(em as EM, trx);
          }),
      },
    });
  }
}
