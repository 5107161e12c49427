import { SqlInboxStore } from '@courier/sql-engine';
import type { PrismaRawClient } from './prisma-client.js';
import { toDriverError } from './prisma-errors.js';
import { PrismaStoreCore, type PrismaStoreConfig } from './prisma-store-core.js';

/** Arguments of {@link PrismaInboxStore}. */
export type PrismaInboxStoreConfig<Tx extends PrismaRawClient> = PrismaStoreConfig<Tx>;

/**
 * The idempotent inbox on Prisma 7 with a driver adapter (PostgreSQL, MySQL/MariaDB, SQLite):
 * the engine's `SqlInboxStore`, running each handler in `prisma.$transaction(async (tx) => …)`
 * so `ctx.tx` is the Prisma transaction client — your own models and raw queries, typed as in
 * your own interactive transactions.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` opens an interactive transaction (with `transactionOptions`: its `timeout` bounds
 *   the handler), inserts the (messageId, consumer) record first, then runs `work` with the
 *   transaction client; what `work` wrote through it (and appended to the outbox with it)
 *   commits together with the record, or nothing does.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without running
 *   `work`; racing first runs meet at the primary key, so exactly one runs `work` to commit.
 * - If `work` throws, its error propagates unchanged and the transaction rolls back.
 *   Database errors of the store's own statements and of the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts; halts (`InboxHalts`) as in the engine.
 */
export class PrismaInboxStore<Tx extends PrismaRawClient = PrismaRawClient> extends SqlInboxStore<Tx, Tx> {
  constructor(config: PrismaInboxStoreConfig<Tx>) {
    const core = new PrismaStoreCore(config, 'PrismaInboxStore');
    super({
      core,
      transactions: {
        async run(work) {
          let workError: { error: unknown } | undefined;
          try {
            return await core.prisma.$transaction(async (tx) => {
              try {
                return await work(tx, tx);
              } catch (error) {
                workError = { error };
                throw error;
              }
            }, core.transactionOptions);
          } catch (error) {
            // The handler's error leaves unchanged; Prisma's own (begin, commit, an expired
            // transaction) are restated so the engine classifies them.
            if (workError !== undefined && workError.error === error) throw error;
            throw toDriverError(error, core.dialect.name);
          }
        },
      },
    });
  }
}
