import { SqlInboxStore } from '@courier/sql-engine';
import type { Knex } from 'knex';
import { KnexStoreCore, type KnexStoreConfig } from './knex-store-core.js';

/** Arguments of {@link KnexInboxStore}. */
export type KnexInboxStoreConfig = KnexStoreConfig;

/**
 * The idempotent inbox on Knex 3 (PostgreSQL, MySQL/MariaDB, SQLite): the engine's
 * `SqlInboxStore`, running each handler in `knex.transaction(async (trx) => …)` so `ctx.tx`
 * is a `Knex.Transaction` — the application's own query builder.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` opens a Knex transaction, inserts the (messageId, consumer) record first, then runs
 *   `work` with that transaction; what `work` wrote through it (and appended to the outbox
 *   with it) commits together with the record, or nothing does.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without running
 *   `work`; racing first runs meet at the primary key, so exactly one runs `work` to commit.
 * - If `work` throws, its error propagates unchanged and the transaction rolls back.
 *   Database errors of the store's own statements and of the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts; halts (`InboxHalts`) as in the engine.
 */
export class KnexInboxStore extends SqlInboxStore<Knex.Transaction, Knex.Transaction> {
  constructor(config: KnexInboxStoreConfig) {
    const core = new KnexStoreCore(config, 'KnexInboxStore');
    super({
      core,
      transactions: { run: (work) => core.knex.transaction((trx) => work(trx, trx)) },
    });
  }
}
