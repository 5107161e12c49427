import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxPendingRow, type OutboxWriter, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { PrismaRawClient } from './prisma-client.js';
import { isEndedTransaction } from './prisma-errors.js';
import { isPrismaTransactionClient, PrismaStoreCore, type PrismaStoreConfig } from './prisma-store-core.js';

/** Arguments of {@link PrismaOutboxStore}. */
export interface PrismaOutboxStoreConfig<Tx extends PrismaRawClient> extends PrismaStoreConfig<Tx>, SqlOutboxStoreOptions {}

/**
 * The outbox on Prisma 7 with a driver adapter (PostgreSQL, MySQL/MariaDB, SQLite): the
 * engine's `SqlOutboxStore` joined to the application's interactive transaction.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(tx, …)` (what `bus.outbox(tx).publish()` calls) writes the rows at once through
 *   `tx`, the client of `prisma.$transaction(async (tx) => …)`, with `$executeRawUnsafe`,
 *   and returns a promise that settles when they are written (`asyncAppend`): await it inside
 *   the callback. The rows commit with the transaction or not at all; a rollback (the callback
 *   throws), or a nested `tx.$transaction` that rolls back after the publish, leaves nothing.
 *   A rejected append must not be followed by a commit (let the error leave the callback, so
 *   Prisma rolls back).
 * - The Prisma Client itself (`prisma` instead of `tx`), or anything else, is refused with a
 *   `ConfigError` (code `UNIT_OF_WORK_REQUIRED`) naming the fix, before anything is written:
 *   never a silent autocommit. A transaction client whose transaction has ended is refused
 *   with `UNIT_OF_WORK_ENDED`.
 * - Key locks, sequence order, claims, leases, fencing, completion and the operator half are
 *   the engine's (see `SqlOutboxStore`); the relay's statements run on the Prisma Client.
 * - Relays in this process are woken when an append has been written; Prisma announces no
 *   commit, so a relay woken before the commit finds nothing yet and sees the row at its
 *   next poll or wake-up. PostgreSQL NOTIFY/LISTEN are not used (Prisma gives no raw
 *   connection to LISTEN on): relays in other processes poll.
 */
export class PrismaOutboxStore<Tx extends PrismaRawClient = PrismaRawClient> extends SqlOutboxStore<Tx, Tx, Tx, Promise<void>> {
  constructor(config: PrismaOutboxStoreConfig<Tx>) {
    const core = new PrismaStoreCore(config, 'PrismaOutboxStore');
    super({
      ...config,
      // NOTIFY after commit would need a commit hook Prisma lacks; without LISTEN nobody hears it.
      wakeups: core.dialect.name === 'postgresql' ? { listen: false, notify: false } : config.wakeups,
      core,
      join: (writer) => prismaJoin(writer),
    });
  }
}

function prismaJoin<Tx extends PrismaRawClient>(writer: OutboxWriter<Tx>) {
  return {
    asyncAppend: true as const,
    resolve(unit: Tx): Tx {
      if (!isPrismaTransactionClient(unit)) {
        const isClient = unit !== null && typeof unit === 'object' && typeof (unit as { $transaction?: unknown }).$transaction === 'function';
        throw new ConfigError(
          isClient
            ? `'publish' got a Prisma Client, not an interactive transaction: publish inside prisma.$transaction(async (tx) => { …; await bus.outbox(tx).publish(…) }), so the message commits with your changes`
            : `'publish' needs the client of a Prisma interactive transaction (the 'tx' of prisma.$transaction(async (tx) => …)), got ${describe(unit)}`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      return unit;
    },
    async add(tx: Tx, rows: OutboxPendingRow[]): Promise<void> {
      try {
        await writer.write(rows, tx);
      } catch (error) {
        // Prisma refuses every query of a transaction that ended (P2028 "Transaction already
        // closed"): that is a misuse of the unit of work, not a storage fault.
        if (isEndedTransaction(error)) throw endedError(error);
        throw error;
      }
      writer.committed();
    },
  };
}

function endedError(cause?: unknown): ConfigError {
  return new ConfigError(`'publish' got a Prisma transaction client whose transaction has already ended (committed, rolled back or timed out): publish inside the $transaction callback, before it returns`, {
    code: 'UNIT_OF_WORK_ENDED',
    cause,
  });
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
