import type { PortLimits } from './envelope.js';

/** Result of {@link InboxStore.run}. */
export type InboxResult<T> = { readonly duplicate: true } | { readonly duplicate: false; readonly value: T };

/**
 * Storage port of the idempotent inbox.
 *
 * Contract every implementation keeps (the conformance suite checks each):
 * - `run` opens a unit of work, records (messageId, consumer) in it, runs `work` with it
 *   and commits both together. If the pair was already recorded by a committed unit of
 *   work it returns `{ duplicate: true }` without running `work`. Two racing first runs
 *   meet at the unique key: exactly one commits its effects.
 * - If `work` throws, nothing of it and no inbox record is committed.
 * - `work` is called only once the store's own statements before it have succeeded. The
 *   consumer relies on this: a retriable `StorageError` before `work` was called means the
 *   store is unreachable (a pause, no attempt counted); once `work` has been called, any
 *   failure, the final flush and the commit included, counts an attempt of the message.
 * - `recordStart` counts handler starts in a short transaction of its own, so that a
 *   message that kills its process is recognised after a restart. The consumer calls it
 *   only for a redelivered message's runs alone (`Delivery.redelivered`), never on the
 *   happy path, and `forget`s the count when such a run ends or outlives its crash window.
 */
export interface InboxStore<Tx> {
  run<T>(messageId: string, consumer: string, work: (tx: Tx) => Promise<T>, options?: { signal?: AbortSignal }): Promise<InboxResult<T>>;
  /** Counts one more start of (messageId, consumer) and returns the total so far. */
  recordStart(messageId: string, consumer: string): Promise<number>;
  /** Removes the record so the message can be explicitly reprocessed. Returns whether one existed. */
  forget(messageId: string, consumer: string): Promise<boolean>;
  /** Deletes records older than `olderThanMs` in bounded batches; the deduplication window ends there. */
  prune(olderThanMs: number, options?: { batchSize?: number; signal?: AbortSignal }): Promise<number>;
  close?(): Promise<void>;
  /**
   * Optional: the longest messageIds and consumer names the store holds (its column
   * sizes). The bus refuses longer consumer names at `subscribe`, counting the suffixes it
   * appends itself, so a name that does not fit never reaches the store.
   */
  readonly limits?: PortLimits;
}
