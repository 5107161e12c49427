import { SqlInboxStore } from '@courier/sql-engine';
import type { Transaction } from 'kysely';
import { KyselyStoreCore, type KyselyStoreConfig } from './kysely-store-core.js';

/** Arguments of {@link KyselyInboxStore}. */
export type KyselyInboxStoreConfig<DB> = KyselyStoreConfig<DB>;

/**
 * The idempotent inbox on Kysely (PostgreSQL, MySQL/MariaDB, SQLite): the engine's
 * `SqlInboxStore`, running each handler in `db.transaction().execute(…)` so `ctx.tx` is a
 * Kysely `Transaction<DB>` — the application's own query builder, typed by its `DB`.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` opens a Kysely transaction, inserts the (messageId, consumer) record first, then runs
 *   `work` with that `Transaction`; what `work` wrote through it (and appended to the outbox
 *   with it) commits together with the record, or nothing does.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without running
 *   `work`; racing first runs meet at the primary key, so exactly one runs `work` to commit.
 * - If `work` throws, its error propagates unchanged and the transaction rolls back.
 *   Database errors of the store's own statements and of the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts; halts (`InboxHalts`) as in the engine.
 */
export class KyselyInboxStore<DB> extends SqlInboxStore<Transaction<DB>, Transaction<DB>> {
  constructor(config: KyselyInboxStoreConfig<DB>) {
    const core = new KyselyStoreCore(config, 'KyselyInboxStore');
    super({
      core,
      transactions: { run: (work) => core.db.transaction().execute((trx) => work(trx, trx)) },
    });
  }

}
