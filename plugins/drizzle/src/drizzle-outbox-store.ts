import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxPendingRow, type OutboxWriter, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import { DrizzleStoreCore, isDrizzleTransaction, type DrizzleStoreConfig, type DrizzleTransactionOf } from './drizzle-store-core.js';

/** Arguments of {@link DrizzleOutboxStore}. */
export interface DrizzleOutboxStoreConfig<Db> extends DrizzleStoreConfig<Db>, SqlOutboxStoreOptions {}

/**
 * The outbox on Drizzle (node-postgres, mysql2): the engine's `SqlOutboxStore` joined
 * to the application's Drizzle transaction.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(tx, …)` (what `bus.outbox(tx).publish()` calls) writes the rows at once, on `tx`,
 *   and returns a promise that settles when they are written (`asyncAppend`): await it inside
 *   `db.transaction(async (tx) => …)`. The rows commit with the transaction or not at all; a
 *   rollback (`tx.rollback()` or a throw), or the rollback of a nested `tx.transaction(…)`
 *   (a savepoint) taken before the publish, leaves nothing. A rejected append must not be
 *   followed by a commit (let the error leave the callback, so Drizzle rolls back).
 * - The Drizzle database itself (`db` instead of `tx`), or anything else, is refused with a
 *   `ConfigError` (code `UNIT_OF_WORK_REQUIRED`) naming the fix, before anything is written:
 *   never a silent autocommit. A transaction whose callback has returned is refused with
 *   `UNIT_OF_WORK_ENDED` where the driver tells (node-postgres: the connection is no longer
 *   in a transaction; mysql2: the pooled connection was released; libsql: the transaction is
 *   closed) — once the connection serves another transaction it cannot be told apart, so
 *   publish inside the callback.
 * - Key locks, sequence order, claims, leases, fencing, completion and the operator half are
 *   the engine's (see `SqlOutboxStore`).
 * - Relays in this process are woken when an append has been written; Drizzle announces no
 *   commit, so a relay woken before the commit finds nothing yet and sees the row at its next
 *   poll or wake-up. PostgreSQL NOTIFY/LISTEN are not used: relays in other processes poll.
 */
export class DrizzleOutboxStore<Db, Tx = DrizzleTransactionOf<Db>> extends SqlOutboxStore<Tx, Tx, Tx, Promise<void>> {
  constructor(config: DrizzleOutboxStoreConfig<Db>) {
    const core = new DrizzleStoreCore<Db, Tx>(config, 'DrizzleOutboxStore');
    super({
      ...config,
      // NOTIFY after commit would need a commit hook Drizzle lacks; without LISTEN nobody hears it.
      wakeups: core.dialect.name === 'postgresql' ? { listen: false, notify: false } : config.wakeups,
      core,
      join: (writer) => drizzleJoin<Tx>(writer),
    });
  }
}

function drizzleJoin<Tx>(writer: OutboxWriter<Tx>) {
  return {
    asyncAppend: true as const,
    resolve(unit: Tx): Tx {
      if (!isDrizzleTransaction(unit)) {
        const isDb = unit !== null && typeof unit === 'object' && typeof (unit as { transaction?: unknown }).transaction === 'function';
        throw new ConfigError(
          isDb
            ? `'publish' got a Drizzle database, not a transaction: publish inside db.transaction(async (tx) => { …; await bus.outbox(tx).publish(…) }), so the message commits with your changes`
            : `'publish' needs a Drizzle transaction (the 'tx' of db.transaction(async (tx) => …)), got ${describe(unit)}`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      if (transactionEnded(unit)) {
        throw new ConfigError(`'publish' got a Drizzle transaction that has already ended (committed or rolled back): publish inside the transaction callback, before it returns`, {
          code: 'UNIT_OF_WORK_ENDED',
        });
      }
      return unit;
    },
    async add(tx: Tx, rows: OutboxPendingRow[]): Promise<void> {
      await writer.write(rows, tx);
      writer.committed();
    },
  };
}

/**
 * Whether the connection under a Drizzle transaction says the transaction is over. Drizzle
 * keeps no such flag, so this reads the driver's: node-postgres' `getTransactionStatus()`
 * ('I' = idle, no transaction open), mysql2's pooled connection `_released`, libsql's
 * `Transaction.closed`. `false` where the driver tells nothing.
 */
function transactionEnded(tx: unknown): boolean {
  const session = (tx as { session?: { client?: unknown; tx?: unknown } }).session;
  const client = session?.client as { getTransactionStatus?: () => string | null; connection?: { _released?: unknown } } | undefined;
  if (typeof client?.getTransactionStatus === 'function') return client.getTransactionStatus() === 'I';
  if (client?.connection?._released === true) return true;
  const libsqlTx = session?.tx as { closed?: unknown } | undefined;
  return libsqlTx?.closed === true;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
