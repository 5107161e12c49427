import { SqlInboxStore } from '@courier/sql-engine';
import { DrizzleStoreCore, type DrizzleStoreConfig, type DrizzleTransactionOf } from './drizzle-store-core.js';

/** Arguments of {@link DrizzleInboxStore}. */
export type DrizzleInboxStoreConfig<Db> = DrizzleStoreConfig<Db>;

/**
 * The idempotent inbox on Drizzle (node-postgres, mysql2): the engine's
 * `SqlInboxStore`, running each handler in `db.transaction(async (tx) => …)` so `ctx.tx` is
 * the Drizzle transaction of the application's own database, typed by its schema.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` opens a Drizzle transaction, inserts the (messageId, consumer) record first, then
 *   runs `work` with that transaction; what `work` wrote through it (and appended to the
 *   outbox with it) commits together with the record, or nothing does.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without running
 *   `work`; racing first runs meet at the primary key, so exactly one runs `work` to commit.
 * - If `work` throws, its error propagates unchanged and the transaction rolls back.
 *   Database errors of the store's own statements and of the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts; halts (`InboxHalts`) as in the engine.
 */
export class DrizzleInboxStore<Db, Tx = DrizzleTransactionOf<Db>> extends SqlInboxStore<Tx, Tx> {
  constructor(config: DrizzleInboxStoreConfig<Db>) {
    const core = new DrizzleStoreCore<Db, Tx>(config, 'DrizzleInboxStore');
    super({
      core,
      transactions: { run: (work) => core.runner.transaction((tx) => work(tx, tx)) },
    });
  }
}
