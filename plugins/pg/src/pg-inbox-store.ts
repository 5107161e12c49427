import { SqlInboxStore } from '@courier/sql-engine';
import type { PoolClient } from 'pg';
import { PgStoreCore, type PgStoreConfig } from './pg-store-core.js';

/** Arguments of {@link PgInboxStore}. */
export type PgInboxStoreConfig = PgStoreConfig;

/**
 * The idempotent inbox on node-postgres: the engine's {@link SqlInboxStore} running each
 * handler in a transaction on a client of the pool. The handler's `ctx.tx` is that
 * `PoolClient`, inside the transaction: what it writes with `ctx.tx.query(…)` and what it
 * publishes with `ctx.publish` commit together with the inbox record, or not at all.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite): a
 * (messageId, consumer) pair recorded by a committed run is reported as a duplicate without
 * running the handler; racing first runs meet at the primary key; database errors become
 * `StorageError`s. The client goes back to the pool after COMMIT or ROLLBACK (destroyed
 * when the connection broke), so a handler must not keep it.
 */
export class PgInboxStore extends SqlInboxStore<PoolClient, PoolClient> {
  constructor(config: PgInboxStoreConfig) {
    const core = new PgStoreCore(config, 'PgInboxStore');
    super({
      core,
      transactions: {
        run: (work) => core.runner.transaction((client) => work(client, client)),
      },
    });
  }
}
