import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, type InboxResult, type InboxStore, type PortLimits } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import type { DialectName } from './dialects/sql-dialect.js';
import { isLockConflict, toStorageError } from './storage-errors.js';
import { pruneInBatches, StoreCore, throwIfAborted, type MikroOrmStoreConfig } from './store-core.js';

/** Arguments of {@link MikroOrmInboxStore}. */
export type MikroOrmInboxStoreConfig = MikroOrmStoreConfig;

const DEFAULT_PRUNE_BATCH = 1_000;
// Whole-transaction attempts of a run whose record insert lost a lock conflict (before work ran).
const LOCK_CONFLICT_ATTEMPTS = 10;

/**
 * The idempotent inbox on MikroORM 6 (PostgreSQL, MySQL/MariaDB, SQLite).
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
 */
export class MikroOrmInboxStore<EM extends EntityManager = EntityManager> implements InboxStore<EM> {
  /** The SQL family in use. */
  readonly dialect: DialectName;
  /** The column sizes (`varchar(200)` counts characters), the same on every dialect: the bus refuses longer consumer names at `subscribe`. */
  readonly limits: PortLimits = Object.freeze({ id: { chars: 200 }, consumer: { chars: 200 } });
  readonly #core: StoreCore;

  constructor(config: MikroOrmInboxStoreConfig) {
    if (config === null || typeof config !== 'object' || config.orm === null || typeof config.orm !== 'object') {
      throw new ConfigError(`'orm' is required: pass the application's initialised MikroORM instance`);
    }
    this.#core = new StoreCore(config, 'MikroOrmInboxStore');
    this.dialect = this.#core.dialect.name;
  }

  /** Runs `work` once per (messageId, consumer), in one transaction with the inbox record (see the class guarantees). */
  async run<T>(messageId: string, consumer: string, work: (tx: EM) => Promise<T>, options: { signal?: AbortSignal } = {}): Promise<InboxResult<T>> {
    checkPair(messageId, consumer);
    this.#core.assertOpen();
    throwIfAborted(options.signal, 'run');
    const core = this.#core;
    return core.track(
      (async (): Promise<InboxResult<T>> => {
        try {
          await core.checkSchema();
        } catch (error) {
          throw toStorageError(error, 'run', core.schemaHint);
        }
        for (let attempt = 1; ; attempt += 1) {
          // Errors of work() propagate unchanged; everything else is the store's.
          let workStarted = false;
          let workFailed = false;
          try {
            return await core.orm.em.fork({ clear: true }).transactional(async (em) => {
              const trx = em.getTransactionContext();
              if (trx === undefined) throw new Error('em.transactional() gave no transaction (disableTransactions is set?)');
              await core.runner.prologue(trx);
              const recorded = await core.dialect.insertInboxRecord(core.runner, trx, messageId, consumer);
              if (!recorded) return { duplicate: true } as const;
              workStarted = true;
              try {
                const value = await work(em as EM);
                return { duplicate: false, value } as const;
              } catch (error) {
                workFailed = true;
                throw error;
              }
            });
          } catch (error) {
            if (workFailed) throw error;
            // InnoDB: runs queued behind an uncommitted record all hold a shared lock on it
            // once its transaction rolls back, and all but one die in a deadlock when they
            // insert. Nothing ran yet, so the run starts over: it inserts, or meets the
            // winner's record and reports the duplicate, as documented.
            if (!workStarted && attempt < LOCK_CONFLICT_ATTEMPTS && isLockConflict(error)) {
              await sleep(Math.random() * 10 * attempt, undefined, { signal: options.signal }).catch(() => undefined);
              throwIfAborted(options.signal, 'run');
              continue;
            }
            throw toStorageError(error, 'run', core.schemaHint);
          }
        }
      })(),
    );
  }

  /** Counts one more start of (messageId, consumer) in its own short transaction and returns the total so far. */
  async recordStart(messageId: string, consumer: string): Promise<number> {
    checkPair(messageId, consumer);
    return this.#core.operation('recordStart', undefined, () => this.#core.dialect.recordStart(this.#core.runner, messageId, consumer));
  }

  /** Removes the record (and its start count) so the message can be explicitly reprocessed. Returns whether a record existed. */
  async forget(messageId: string, consumer: string): Promise<boolean> {
    checkPair(messageId, consumer);
    return this.#core.operation('forget', undefined, async () => {
      const { dialect, runner } = this.#core;
      return runner.transaction(async (trx) => {
        const removed = await runner.run(`DELETE FROM ${dialect.table('inbox')} WHERE message_id = ? AND consumer = ?`, [messageId, consumer], trx);
        await runner.run(`DELETE FROM ${dialect.table('inboxStarts')} WHERE message_id = ? AND consumer = ?`, [messageId, consumer], trx);
        return removed.affectedRows > 0;
      });
    });
  }

  /**
   * Deletes records (and start counts) older than `olderThanMs` (database clock) in
   * statements of at most `batchSize` rows, each committed on its own. The deduplication
   * window ends there: a message redelivered after its record is pruned runs again.
   */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    const batchSize = options.batchSize ?? DEFAULT_PRUNE_BATCH;
    if (!Number.isSafeInteger(batchSize) || batchSize < 1) throw new ConfigError(`'batchSize' must be an integer of 1 or more`);
    if (!Number.isFinite(olderThanMs) || olderThanMs < 0) throw new ConfigError(`'olderThanMs' must be a finite number of 0 or more`);
    return this.#core.operation('prune', options.signal, async () => {
      const records = await pruneInBatches(this.#core, 'inbox', 'processed_at', false, olderThanMs, batchSize, options.signal);
      await pruneInBatches(this.#core, 'inboxStarts', 'updated_at', false, olderThanMs, batchSize, options.signal);
      return records;
    });
  }

  /** Creates the Courier tables, indexes and seed rows that are missing (idempotent). Prefer the migrations in production. */
  async ensureSchema(): Promise<void> {
    await this.#core.ensureSchema();
  }

  /** Throws a `StorageError` with code `SCHEMA_MISSING` (and the remedy) unless the schema is present at this release's version. */
  async checkSchema(): Promise<void> {
    this.#core.assertOpen();
    await this.#core.checkSchema();
  }

  /** Refuses new calls and waits for in-flight runs. Does not close the ORM. Idempotent. */
  async close(): Promise<void> {
    await this.#core.close();
  }

  /** Same as {@link MikroOrmInboxStore.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function checkPair(messageId: string, consumer: string): void {
  const problems: string[] = [];
  if (typeof messageId !== 'string' || messageId.length === 0 || messageId.length > 200) problems.push(`'messageId' must be a non-empty string of at most 200 characters`);
  if (typeof consumer !== 'string' || consumer.length === 0 || consumer.length > 200) problems.push(`'consumer' must be a non-empty string of at most 200 characters`);
  if (problems.length > 0) throw new ConfigError(problems);
}
