import type { Envelope, PortLimits } from './envelope.js';
import type { InboxStats } from './inbox-operations.js';

/** Result of {@link InboxStore.run}. */
export type InboxResult<T> =
  | { readonly duplicate: true }
  | { readonly duplicate: false; readonly value: T }
  /** Only with {@link InboxRunOptions.hold}: the key is halted and the message was held, `work` not run. */
  | { readonly duplicate: false; readonly held: true };

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
 * - Optionally, durable halts of ordered keys ({@link InboxHalts}).
 */
export interface InboxStore<Tx> {
  run<T>(messageId: string, consumer: string, work: (tx: Tx) => Promise<T>, options?: InboxRunOptions): Promise<InboxResult<T>>;
  /** Counts one more start of (messageId, consumer) and returns the total so far. */
  recordStart(messageId: string, consumer: string): Promise<number>;
  /** Removes the record so the message can be explicitly reprocessed. Returns whether one existed. */
  forget(messageId: string, consumer: string): Promise<boolean>;
  /** Deletes records older than `olderThanMs` in bounded batches; the deduplication window ends there. */
  prune(olderThanMs: number, options?: { batchSize?: number; signal?: AbortSignal }): Promise<number>;
  /**
   * Optional operator member: per consumer, its records, the age of the oldest (database
   * clock) and its dead letters (see {@link InboxStats}). A read that never blocks `run`;
   * it may count every record (one pass), so gauges call it at most once a minute or so.
   */
  stats?(options?: { signal?: AbortSignal }): Promise<InboxStats>;
  close?(): Promise<void>;
  /**
   * Optional: the longest messageIds and consumer names the store holds (its column
   * sizes). The bus refuses longer consumer names at `subscribe`, counting the suffixes it
   * appends itself, so a name that does not fit never reaches the store.
   */
  readonly limits?: PortLimits;
  /**
   * Optional capability flag: `false` when the store cannot write its record in `work`'s
   * unit of work (a key-value store beside the database, such as Redis), so the record is
   * written after that unit of work commits. Then a crash between the two runs `work` again
   * on redelivery, and effects outside the unit of work need `messageId` as their
   * idempotency key. Absent or `true`: the record commits with the effects, as above.
   */
  readonly recordCommitsWithEffects?: boolean;
}

/** A key stopped by an ordered subscription's `halt` poison policy, as operators see it. */
export interface InboxHaltedKey {
  readonly consumer: string;
  readonly topic: string;
  readonly key: string;
  /** The head that could not be handled; `null` once a resume has dealt with it and its held messages are draining. */
  readonly head: { readonly envelope: Envelope; readonly error: string } | null;
  readonly haltedAt: Date;
  /** Messages of the key held behind the head, in arrival order. */
  readonly held: number;
  /** `null` while halted; the operator's choice once resumed and until the key is drained. */
  readonly resumed: InboxResumeAction | null;
}

/** What an operator does with a halted key's head: run it again, or park it as dead. */
export type InboxResumeAction = 'retry' | 'park';

/** A resumed halted key claimed for draining by one consumer instance ({@link InboxHalts.claimResumed}). */
export interface InboxDrainClaim {
  readonly consumer: string;
  readonly topic: string;
  readonly key: string;
  readonly action: InboxResumeAction;
  /** The head still to deal with; `null` when a previous drain already did. */
  readonly head: { readonly envelope: Envelope; readonly error: string } | null;
}

/** A head parked by `resume(…, 'park')`, kept by the store so operators can see it. */
export interface InboxParkedMessage {
  readonly consumer: string;
  readonly envelope: Envelope;
  readonly error: string;
  readonly parkedAt: Date;
  /**
   * The head's place in the order of parking, increasing with every head parked (a replayed
   * head parked again gets a new one): what `listParked`'s `after` takes. Optional so that a
   * store written before paging still type-checks; such a store cannot be paged with a cursor.
   */
  readonly seq?: bigint;
}

/** Options of {@link InboxHalts.listParked}. */
export interface InboxListParkedOptions {
  /** Only this consumer's parked heads. */
  readonly consumer?: string;
  /** At most this many (a store's default bounds an unbounded read). */
  readonly limit?: number;
  /**
   * Only heads parked after the one with this `seq` (keyset pagination): a walk page by page
   * neither skips nor repeats a head when others are replayed or purged between pages.
   */
  readonly after?: bigint;
}

/** Per-call options of {@link InboxStore.run}. */
export interface InboxRunOptions {
  readonly signal?: AbortSignal;
  /**
   * Only for stores with {@link InboxHalts}, passed by ordered subscriptions under the
   * `halt` poison policy: before `work`, in the same unit of work, the store checks whether
   * (consumer, topic, key) is halted; if so it stores `envelope` as held behind the halt
   * (once per (consumer, messageId): a second hold of the same message is a no-op) and
   * returns `{ held: true }` without running `work`.
   *
   * `consumer` names the consumer whose halt is checked and behind which the message is
   * held, when the run records under another name than the subscription's own (a replay's
   * record, `<consumer>~rerun`); default: the run's `consumer`.
   */
  readonly hold?: { readonly topic: string; readonly key: string; readonly envelope: Envelope; readonly consumer?: string };
}

/**
 * Optional capability of an inbox store: durable halts of ordered keys (the `halt` poison
 * policy of ordered subscriptions). A store has it when it has every member below and its
 * `run` honours {@link InboxRunOptions.hold}; {@link hasInboxHalts} tells.
 *
 * Contract (the conformance suite checks each):
 * - A halt is one per (consumer, topic, key). `halt` creates it with its head, or, when the
 *   key is already halted, holds the message behind it (unique per (consumer, messageId),
 *   so a copy or a retry after a crash is stored once). Held messages keep arrival order.
 * - While a halt exists every `run` with `hold` for its key holds instead of running, so
 *   nothing of the key is applied until the operator resumes and the key is drained.
 * - `resume` only marks the halt (returns 1, or 0 when there is no such halt or it was
 *   resumed already); a consumer instance of the subscription drains it: `claimResumed`
 *   gives one resumed halt at a time to one owner under a lease (`leaseMs`, database
 *   clock), so two instances never drain one key at once, and a dead drainer's key is
 *   claimed again once its lease runs out. Every drain call takes the owner and renews
 *   the lease; one whose lease was lost does nothing and returns false/empty.
 *   `renewDrain` renews it on its own: the drainer calls it while one step runs long (a
 *   held message retrying in place), so a drain that is alive never loses its claim,
 *   and learns from `false` that it has (it then stops before its next step).
 * - `settleHead` removes the head (kept as parked when `parked`); `drop` removes one held
 *   message; `rehalt` makes a held message the new head and the halt halted again (no
 *   longer resumed), for a message that fails while draining or a retried head that
 *   fails again; `lift` deletes the halt only when nothing is held, in one atomic step
 *   with respect to `hold`, so a message held concurrently is never stranded.
 */
export interface InboxHalts {
  /**
   * Halts the key at `envelope`, or holds it behind an existing halt. `error` (here and in
   * `rehalt` and `settleHead`), as the core passes it, is at most `REASON_LIMITS.messageBytes`
   * UTF-8 bytes without U+0000 or lone surrogates (`boundReasonText`), so a store whose
   * column holds that much keeps it whole; a store bounds it again at its own boundary only
   * where other callers may pass text directly.
   */
  halt(consumer: string, topic: string, key: string, envelope: Envelope, error: string): Promise<'halted' | 'held'>;
  listHalted(options?: { readonly consumer?: string; readonly limit?: number }): Promise<readonly InboxHaltedKey[]>;
  resumeHalted(consumer: string, topic: string, key: string, action: InboxResumeAction): Promise<number>;
  claimResumed(consumer: string, owner: string, leaseMs: number): Promise<InboxDrainClaim | undefined>;
  /**
   * Renews `owner`'s drain lease on the halt of (consumer, topic, key) for the length it was
   * claimed with (database clock); true when it did, false when the claim is lost (the lease
   * ran out, another drainer took it, the halt was halted again or lifted). Changes nothing
   * else.
   */
  renewDrain(consumer: string, topic: string, key: string, owner: string): Promise<boolean>;
  settleHead(consumer: string, topic: string, key: string, owner: string, options: { readonly parked: boolean; readonly error?: string }): Promise<boolean>;
  /** Held messages of the key, oldest first, at most `limit`. */
  listHeld(consumer: string, topic: string, key: string, owner: string, limit: number): Promise<readonly Envelope[]>;
  drop(consumer: string, topic: string, key: string, messageId: string, owner: string): Promise<boolean>;
  rehalt(consumer: string, topic: string, key: string, envelope: Envelope, error: string, owner: string): Promise<boolean>;
  lift(consumer: string, topic: string, key: string, owner: string): Promise<boolean>;
  /** Parked heads in the order they were parked (by `seq`), oldest first, at most `limit`, after `after` when given. */
  listParked(options?: InboxListParkedOptions): Promise<readonly InboxParkedMessage[]>;
  /**
   * Optional: how many heads are parked (only `consumer`'s when given), counted without
   * reading them: the M of an operator listing's "N of M shown". Changes nothing.
   */
  countParked?(options?: { readonly consumer?: string }): Promise<number>;
  /**
   * An operator's replay of a parked head (`courier dead replay parked:<consumer>:<id>`), in
   * one transaction: the head leaves the parked heads and becomes the head of a halt of its
   * key already resumed with `retry` (`'resumed'`), which a consumer instance of `consumer`
   * drains as any resumed halt — the head runs through the inbox under its own messageId
   * (its failed run committed nothing), so it commits its effects at most once, then the
   * halt is lifted; if it fails again the key is halted again at it. When the key is halted
   * now, the head is held behind that halt instead (`'held'`), in key order with the rest.
   * `false` when `consumer` has no such parked head (replayed or purged already, maybe by a
   * concurrent call: of two replays of one head exactly one returns non-false).
   */
  replayParked(consumer: string, messageId: string): Promise<'resumed' | 'held' | false>;
  /** Deletes a parked head for good; false when there is none (purged or replayed already). */
  purgeParked(consumer: string, messageId: string): Promise<boolean>;
}

const HALT_MEMBERS = ['halt', 'listHalted', 'resumeHalted', 'claimResumed', 'renewDrain', 'settleHead', 'listHeld', 'drop', 'rehalt', 'lift', 'listParked', 'replayParked', 'purgeParked'] as const;

/** Whether `store` has the {@link InboxHalts} capability (every member is a function). */
export function hasInboxHalts<S extends object>(store: S): store is S & InboxHalts {
  return HALT_MEMBERS.every((member) => typeof (store as Record<string, unknown>)[member] === 'function');
}
