import { ClosedError } from '../errors.js';
import type { InboxResult, InboxStore } from '../inbox-store.js';
import { throwIfAborted, type InMemoryDatabase, type InMemoryTransaction } from './in-memory-database.js';

/** Arguments of {@link InMemoryInboxStore}. */
export interface InMemoryInboxStoreConfig {
  /** The database whose units of work handler effects join and whose clock it uses. */
  readonly database: InMemoryDatabase;
}

/**
 * The reference {@link InboxStore}: records (messageId, consumer) pairs in memory, in
 * {@link InMemoryTransaction} units of work shared with the handler's effects.
 *
 * Guarantees: the record and the effects `work` stages commit together or not at all;
 * a pair already committed is reported as a duplicate without running `work`. Racing
 * first runs are resolved optimistically: each may run `work`, but at commit only the
 * first finds the pair free; the others are rolled back and report a duplicate. A run
 * never waits for another unit of work, so a worker frozen mid-run blocks nobody.
 */
export class InMemoryInboxStore implements InboxStore<InMemoryTransaction> {
  readonly #db: InMemoryDatabase;
  /** Pair → commit time (database clock). */
  readonly #records = new Map<string, number>();
  /** Pair → starts counted and the time of the last one. */
  readonly #starts = new Map<string, { count: number; at: number }>();
  #closed = false;

  constructor(config: InMemoryInboxStoreConfig) {
    this.#db = config.database;
  }

  /** Runs `work` once per (messageId, consumer), committing its effects with the record (see the class guarantees). */
  async run<T>(
    messageId: string,
    consumer: string,
    work: (tx: InMemoryTransaction) => Promise<T>,
    options: { signal?: AbortSignal } = {},
  ): Promise<InboxResult<T>> {
    this.#ready('run', options.signal);
    const pair = pairOf(messageId, consumer);
    if (this.#records.has(pair)) return { duplicate: true };
    const tx = this.#db.begin();
    tx.onPrepare(() => {
      if (this.#records.has(pair)) throw new DuplicateRecord();
    });
    tx.onCommit(() => {
      this.#records.set(pair, this.#db.now());
      this.#starts.delete(pair);
    });
    let value: T;
    try {
      value = await work(tx);
    } catch (error) {
      if (tx.state === 'active') await tx.rollback();
      throw error;
    }
    try {
      await tx.commit();
    } catch (error) {
      // Lost the race at the unique pair: another run committed first.
      if (error instanceof DuplicateRecord || this.#records.has(pair)) return { duplicate: true };
      throw error;
    }
    return { duplicate: false, value };
  }

  /** Counts one more start of (messageId, consumer) in its own short write and returns the total. */
  async recordStart(messageId: string, consumer: string): Promise<number> {
    this.#ready('recordStart');
    const pair = pairOf(messageId, consumer);
    const count = (this.#starts.get(pair)?.count ?? 0) + 1;
    this.#starts.set(pair, { count, at: this.#db.now() });
    return count;
  }

  /** Removes the record and start count of (messageId, consumer); true when a record existed. */
  async forget(messageId: string, consumer: string): Promise<boolean> {
    this.#ready('forget');
    const pair = pairOf(messageId, consumer);
    this.#starts.delete(pair);
    return this.#records.delete(pair);
  }

  /**
   * Deletes records committed at least `olderThanMs` ago (database clock) and start
   * counts as old; returns how many records were deleted.
   */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    this.#ready('prune', options.signal);
    const cutoff = this.#db.now() - olderThanMs;
    let deleted = 0;
    for (const [pair, at] of this.#records) {
      if (at <= cutoff) {
        this.#records.delete(pair);
        deleted += 1;
      }
    }
    for (const [pair, start] of this.#starts) if (start.at <= cutoff) this.#starts.delete(pair);
    return deleted;
  }

  /** Later calls reject with `ClosedError`. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
  }

  /** Same as {@link InMemoryInboxStore.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #ready(operation: string, signal?: AbortSignal): void {
    if (this.#closed) throw new ClosedError('InMemoryInboxStore');
    throwIfAborted(signal, operation);
    this.#db.assertAvailable(operation);
  }
}

class DuplicateRecord extends Error {}

function pairOf(messageId: string, consumer: string): string {
  return `${consumer}\u0000${messageId}`;
}
