import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxPendingRow, type OutboxWriter, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { Transaction } from 'kysely';
import { KyselyStoreCore, type KyselyStoreConfig } from './kysely-store-core.js';

/** Arguments of {@link KyselyOutboxStore}. */
export interface KyselyOutboxStoreConfig<DB> extends KyselyStoreConfig<DB>, SqlOutboxStoreOptions {}

/**
 * The outbox on Kysely (PostgreSQL, MySQL/MariaDB, SQLite): the engine's `SqlOutboxStore`
 * joined to the application's Kysely `Transaction`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(trx, …)` (what `bus.outbox(trx).publish()` calls) writes the rows at once, on
 *   `trx`, and returns a promise that settles when they are written (`asyncAppend`): await it
 *   inside `db.transaction().execute(async (trx) => …)`. The rows commit with the
 *   transaction or not at all; a rollback, or a rollback to a savepoint taken before the
 *   publish, leaves nothing. A rejected append must not be followed by a commit (let the
 *   error leave the callback, so Kysely rolls back).
 * - A `Kysely` instance that is not a transaction, or anything else, is refused with a
 *   `ConfigError` (code `UNIT_OF_WORK_REQUIRED`) naming the fix, before anything is written:
 *   never a silent autocommit.
 * - Key locks, sequence order, claims, leases, fencing, completion and the operator half are
 *   the engine's (see `SqlOutboxStore`).
 * - Relays in this process are woken when an append has been written; Kysely announces no
 *   commit, so a relay woken before the commit finds nothing yet and sees the row at its
 *   next poll or wake-up. PostgreSQL NOTIFY/LISTEN are not used (Kysely gives no raw
 *   connection to LISTEN on): relays in other processes poll.
 */
export class KyselyOutboxStore<DB> extends SqlOutboxStore<Transaction<DB>, Transaction<DB>, Transaction<DB>, Promise<void>> {
  constructor(config: KyselyOutboxStoreConfig<DB>) {
    const core = new KyselyStoreCore(config, 'KyselyOutboxStore');
    super({
      ...config,
      // NOTIFY after commit would need a commit hook Kysely lacks; without LISTEN nobody hears it.
      wakeups: core.dialect.name === 'postgresql' ? { listen: false, notify: false } : config.wakeups,
      core,
      join: (writer) => kyselyJoin<DB>(writer),
    });
  }
}

function kyselyJoin<DB>(writer: OutboxWriter<Transaction<DB>>) {
  return {
    asyncAppend: true as const,
    resolve(unit: Transaction<DB>): Transaction<DB> {
      if (!isKyselyTransaction(unit)) {
        const isDb = unit !== null && typeof unit === 'object' && typeof (unit as { transaction?: unknown }).transaction === 'function';
        throw new ConfigError(
          isDb
            ? `'publish' got a Kysely instance, not a transaction: publish inside db.transaction().execute(async (trx) => { …; await bus.outbox(trx).publish(…) }), so the message commits with your changes`
            : `'publish' needs a Kysely Transaction (the 'trx' of db.transaction().execute(async (trx) => …)), got ${describe(unit)}`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      const controlled = unit as { isCommitted?: unknown; isRolledBack?: unknown };
      if (controlled.isCommitted === true || controlled.isRolledBack === true) throw endedError();
      return unit;
    },
    async add(trx: Transaction<DB>, rows: OutboxPendingRow[]): Promise<void> {
      try {
        await writer.write(rows, trx);
      } catch (error) {
        // Kysely refuses every query of a transaction that ended ('Transaction is already
        // committed' / 'rolled back'): that is a misuse of the unit of work, not a storage fault.
        if (endedTransaction(error)) throw endedError(error);
        throw error;
      }
      writer.committed();
    },
  };
}

function endedError(cause?: unknown): ConfigError {
  return new ConfigError(`'publish' got a Kysely transaction that has already ended (committed or rolled back): publish inside the transaction callback, before it returns`, {
    code: 'UNIT_OF_WORK_ENDED',
    cause,
  });
}

function endedTransaction(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current instanceof Error && !seen.has(current); current = current.cause) {
    seen.add(current);
    if (/^Transaction is already (committed|rolled back)$/.test(current.message)) return true;
  }
  return false;
}

function isKyselyTransaction(value: unknown): boolean {
  return value !== null && typeof value === 'object' && (value as { isTransaction?: unknown }).isTransaction === true && typeof (value as { executeQuery?: unknown }).executeQuery === 'function';
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
