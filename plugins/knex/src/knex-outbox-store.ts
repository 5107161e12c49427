import { ConfigError } from '@courier/core';
import { SqlOutboxStore, pgClientListenSource, type OutboxPendingRow, type OutboxWriter, type PgListenClient, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { Knex } from 'knex';
import { isKnexTransaction, KnexStoreCore, type KnexStoreConfig } from './knex-store-core.js';

/** Arguments of {@link KnexOutboxStore}. */
export interface KnexOutboxStoreConfig extends KnexStoreConfig, SqlOutboxStoreOptions {}

/**
 * The outbox on Knex 3 (PostgreSQL, MySQL/MariaDB, SQLite): the engine's `SqlOutboxStore`
 * joined to the application's `Knex.Transaction`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(trx, …)` (what `bus.outbox(trx).publish()` calls) writes the rows at once, on
 *   `trx`, and returns a promise that settles when they are written (`asyncAppend`): await it
 *   inside `knex.transaction(async (trx) => …)`. The rows commit with the transaction or not
 *   at all; a rollback, or the rollback of a savepoint (`trx.transaction(…)`) the publish ran
 *   in, leaves nothing. A rejected append must not be followed by a commit (let the error
 *   leave the callback, so knex rolls back).
 * - A `Knex` instance (not a transaction), a transaction that has completed, or anything
 *   else is refused with a `ConfigError` (`UNIT_OF_WORK_REQUIRED` / `UNIT_OF_WORK_ENDED`)
 *   naming the fix, before anything is written: never a silent autocommit.
 * - Key locks, sequence order, claims, leases, fencing, completion and the operator half are
 *   the engine's (see `SqlOutboxStore`).
 * - Relays are woken once the transaction that carried rows has committed (knex's
 *   `executionPromise` of the outermost transaction); on PostgreSQL a coalesced NOTIFY
 *   follows on a pool connection, never inside the application's transaction (as with
 *   `@courier/pg`: a publish there is the INSERT alone), and `watch()` LISTENs on a connection
 *   of its own from the knex client (turn off with `wakeups: { listen: false }` behind
 *   PgBouncer's transaction pooling).
 */
export class KnexOutboxStore extends SqlOutboxStore<Knex.Transaction, Knex.Transaction, Knex.Transaction, Promise<void>> {
  constructor(config: KnexOutboxStoreConfig) {
    const core = new KnexStoreCore(config, 'KnexOutboxStore');
    super({
      ...config,
      core,
      // LISTEN on raw connections of knex's pg client, outside its pool (held while watched).
      listenSource:
        core.dialect.name === 'postgresql'
          ? pgClientListenSource({
              open: async () => (await core.knex.client.acquireRawConnection()) as PgListenClient,
              close: (raw) => core.knex.client.destroyRawConnection(raw),
            })
          : undefined,
      join: (writer) => knexJoin(writer),
    });
  }
}

function knexJoin(writer: OutboxWriter<Knex.Transaction>) {
  // Root transactions whose commit already wakes the relays.
  const watched = new WeakSet<object>();
  return {
    asyncAppend: true as const,
    resolve(unit: Knex.Transaction): Knex.Transaction {
      if (!isKnexTransaction(unit)) {
        const isKnex = typeof unit === 'function' && typeof (unit as { transaction?: unknown }).transaction === 'function';
        throw new ConfigError(
          isKnex
            ? `'publish' got a Knex instance, not a transaction: publish inside knex.transaction(async (trx) => { …; await bus.outbox(trx).publish(…) }), so the message commits with your changes`
            : `'publish' needs a Knex transaction (the 'trx' of knex.transaction(async (trx) => …)), got ${describe(unit)}`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      if (unit.isCompleted()) {
        throw new ConfigError(`'publish' got a Knex transaction that has already ended (committed or rolled back): publish inside the transaction callback, before it returns`, {
          code: 'UNIT_OF_WORK_ENDED',
        });
      }
      return unit;
    },
    async add(trx: Knex.Transaction, rows: OutboxPendingRow[]): Promise<void> {
      await writer.write(rows, trx);
      const root = rootOf(trx);
      if (watched.has(root)) return;
      watched.add(root);
      // Resolves once the outermost transaction committed; a rollback rejects it (nothing to wake).
      root.executionPromise.then(
        () => writer.committed(),
        () => undefined,
      );
    },
  };
}

/** The outermost transaction of a (possibly nested, savepoint) knex transaction. */
function rootOf(trx: Knex.Transaction): Knex.Transaction {
  let current = trx;
  for (let parent = parentOf(current); parent !== undefined; parent = parentOf(current)) current = parent;
  return current;
}

function parentOf(trx: Knex.Transaction): Knex.Transaction | undefined {
  const parent = (trx as { parentTransaction?: unknown }).parentTransaction;
  return isKnexTransaction(parent) ? parent : undefined;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'function') return 'a function';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
