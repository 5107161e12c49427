import type { Envelope, PortLimits } from './envelope.js';
import type { FaultHook } from './fault-points.js';

/**
 * What {@link OutboxEngine.append} returns: nothing for a store that queues the rows in the
 * unit of work, a promise for a store that writes them at once. A store's type carries which
 * (its `A` parameter), and `bus.outbox(tx).publish()` returns a `string` or a
 * `Promise<string>` to match (see {@link PublishedId}).
 */
export type AppendResult = void | Promise<void>;

/**
 * The result of `publish()` for a store whose `append` returns `A`: the messageId for a
 * synchronous store, a promise of it for an asynchronous one, either when the store's kind
 * is not known statically (`await` works on all three).
 */
export type PublishedId<A extends AppendResult> = A extends Promise<unknown> ? Promise<string> : string;

/**
 * The type of {@link OutboxEngine.asyncAppend} for a store whose `append` returns `A`:
 * `true` for `Promise<void>`, `false` (or absent) for `void`, either when unknown.
 */
export type AsyncAppendFlag<A extends AppendResult> = [A] extends [Promise<unknown>] ? true : [A] extends [void] ? false : boolean;

/** Lifecycle state of an outbox row. */
export type OutboxState = 'pending' | 'published' | 'dead' | 'halted';

/** A message to append, with its scheduling. */
export interface OutboxAppend {
  readonly envelope: Envelope;
  /** Not published before this many milliseconds after the append commits (database clock). */
  readonly delayMs?: number;
  /** Not published before this instant (compared with the database clock). */
  readonly notBefore?: Date;
}

/** A claimed outbox row. */
export interface OutboxRecord {
  /** Store-assigned position; within one key it equals commit order. */
  readonly sequence: bigint;
  readonly envelope: Envelope;
  /** Failed publish attempts recorded so far (not counting pauses). */
  readonly attempts: number;
  /**
   * Optional: how long the row had been due when this claim took it, in milliseconds on
   * the database clock, computed by the claim itself (so no clock of the relay's process
   * is compared with the database's). "Due" is the later of the row's insert and the time
   * it was last scheduled for: its `delayMs`/`notBefore`, or the end of a retry's backoff,
   * a release, a replay or an expired lease — the same instant `OutboxStats.oldestPendingAgeMs`
   * counts from, so a delay is never part of it. Never negative. A store that cannot tell
   * leaves it undefined; the relay then records no commit → confirm latency for the row.
   */
  readonly ageMs?: number;
}

/** Proof of a claim: only the holder of the current lease may complete or fail its rows. */
export interface OutboxLease {
  readonly owner: string;
  /** Fencing token, strictly increasing across all claims of a store. */
  readonly token: bigint;
}

/** A claimed batch. `records` is empty when nothing was due. */
export interface ClaimedBatch {
  readonly lease: OutboxLease;
  readonly records: readonly OutboxRecord[];
}

/** Per-call arguments of {@link OutboxStore.claim}. */
export interface ClaimOptions {
  /** Identifies the claiming relay. */
  readonly owner: string;
  /** Most rows to claim. */
  readonly limit: number;
  /** How long the lease lasts before another relay may re-claim (database clock). */
  readonly leaseMs: number;
  /**
   * How many rows of one key may be in one batch, earliest first. `1` (head only) keeps
   * at most one unconfirmed message per key; more is allowed only when the transport
   * declares ordered pipelining.
   */
  readonly perKey: number;
  readonly signal?: AbortSignal;
}

/**
 * The outcome of one failed row, decided by the engine's retry policy. `error` is at most
 * `REASON_LIMITS.messageBytes` UTF-8 bytes and holds no U+0000 or lone surrogate (the
 * relay bounds it with `boundReasonText`), so a store may write it as it is.
 */
export type OutboxFailure = (
  | { readonly sequence: bigint; readonly error: string; readonly outcome: 'retry'; readonly delayMs: number }
  | { readonly sequence: bigint; readonly error: string; readonly outcome: 'dead' | 'halt' }
) &
  FailureDetail;

/**
 * What a failure is, apart from its text, so operators can select dead rows by it
 * (`courier dead replay --code PUBLISH_UNROUTABLE`) without parsing messages. Absent (or
 * null) when the caller does not know, which a store records as unknown (null). The relay
 * bounds both with {@link FAILURE_DETAIL_LIMITS}, so a store may write them as they are.
 */
export interface FailureDetail {
  /** The `CourierError` code of the failure (`PUBLISH_UNROUTABLE`, …), at most 64 characters. */
  readonly code?: string | null;
  /** The error's class name (`TransportError`, …), at most 200 characters. */
  readonly errorName?: string | null;
}

/** Most characters of {@link FailureDetail}: what every store's columns hold. */
export const FAILURE_DETAIL_LIMITS = { code: 64, errorName: 200 } as const;

/** Counts operators watch. */
export interface OutboxStats {
  readonly pending: number;
  /**
   * Age of the oldest unpublished row in milliseconds (database clock), 0 when none: counted
   * from when the row *first* became due (its insert, or its delay/notBefore; a replay starts
   * it again), over rows due and waiting, released, or failing (in a retry's backoff or being
   * tried again). A row failing for hours therefore reads hours, not 0 while it waits out a
   * backoff, so a backlog alert fires for it. Delayed rows not yet due count nothing.
   * (The SQL stores keep the first due time in `first_due_at`, schema version 6.)
   */
  readonly oldestPendingAgeMs: number;
  readonly inFlight: number;
  readonly dead: number;
  readonly haltedKeys: number;
}

/** A dead or halted row as operators see it. */
export interface DeadOutboxRecord {
  readonly sequence: bigint;
  readonly envelope: Envelope;
  readonly state: 'dead' | 'halted';
  readonly attempts: number;
  readonly lastError: string | null;
  /** When the last failure was recorded (database clock). */
  readonly failedAt: Date | null;
  /**
   * The last failure's `CourierError` code, as the relay recorded it ({@link FailureDetail});
   * null when unknown: a row that failed before the store kept codes (a SQL schema older
   * than version 5), or a failure recorded without one.
   */
  readonly code: string | null;
  /** The last failure's error class name (`TransportError`); null when unknown, as {@link code}. */
  readonly errorName: string | null;
  /**
   * When the row first failed since it was appended or last replayed (database clock); null
   * when unknown (rows that failed before the store kept it: a SQL schema older than 5).
   */
  readonly firstFailedAt: Date | null;
}

/** Per-call arguments of listings. */
export interface ListOptions {
  readonly limit?: number;
  /** Return rows after this sequence (keyset pagination). */
  readonly after?: bigint;
  readonly topic?: string;
}

/** A halted key as operators see it. */
export interface HaltedKey {
  readonly topic: string;
  readonly key: string;
  /** The halted head. */
  readonly head: DeadOutboxRecord;
  /** Rows held behind it. */
  readonly held: number;
}

/** The rows {@link OutboxStore.completeAndClaim} marks published before it claims. */
export interface PendingCompletion {
  readonly lease: OutboxLease;
  readonly sequences: readonly bigint[];
}

/** The outcome of {@link OutboxStore.completeAndClaim}: the claimed batch and how many rows the completion changed. */
export interface CompletedAndClaimed extends ClaimedBatch {
  /** Rows the completion marked published (as `complete` would return). */
  readonly completed: number;
}

/**
 * Per-call options of {@link OutboxStore.completeAndClaim}: a claim's, plus the fault hook
 * its completion calls as `complete` does.
 */
export interface CompleteAndClaimOptions extends ClaimOptions {
  /**
   * Called with `complete-before-commit` after the completion and the claim ran and before
   * either commits (only the test harness sets it). If it throws, neither takes effect; a
   * process killed inside it commits neither. Its `messageIds` are the rows the completion
   * changed.
   */
  readonly beforeCommit?: FaultHook;
}

/** Per-call options of {@link OutboxStore.complete}. */
export interface CompleteOptions {
  /** Called after the update ran and before it commits (fault point `complete-before-commit`). */
  readonly beforeCommit?: FaultHook;
  readonly signal?: AbortSignal;
}

/**
 * The engine half of the outbox storage port: what the bus and the relay need to move
 * messages from the caller's unit of work to the broker. A store author implements this
 * first (and passes the engine cases of the conformance suite), then {@link OutboxOperations}.
 *
 * Contract every implementation keeps (the conformance suite checks each):
 * - `append` joins the caller's unit of work `tx`: the rows become visible when, and
 *   only if, that unit of work commits. Appends of one (topic, key) are serialised so
 *   that sequence order equals commit order, and a row is never claimable before an
 *   earlier row of its key. It throws when `tx` is not a live unit of work.
 * - `claim` returns due rows (database clock) whose key has no earlier row in state
 *   pending or halted, under a lease; concurrent claims never return the same row; a row
 *   whose lease expired may be claimed again, with a greater fencing token.
 * - `complete`, `fail` and `release` act only on rows still held by `lease` (a stale
 *   relay is fenced out) and return how many rows they changed.
 * - `renew`, where implemented, moves the lease expiry of rows still held by `lease` to
 *   `leaseMs` from now (database clock) and touches no other row.
 * - Dead and halted rows are never claimed.
 */
export interface OutboxEngine<Tx, A extends AppendResult = AppendResult> {
  /**
   * Appends messages inside the caller's unit of work.
   *
   * Two kinds of store keep this contract. A store that queues rows in the unit of work
   * (MikroORM writes them at its flush, the in-memory store at its commit) returns nothing:
   * synchronous, so the append cannot race a flush, and a failure surfaces at the commit.
   * A store that writes at once (node-postgres, mysql2, Kysely, Knex…) returns a promise
   * that settles when the rows are written in `tx`, and declares {@link asyncAppend}. The
   * caller must await that promise before committing `tx`: a failed INSERT left behind
   * turns a PostgreSQL COMMIT into a silent ROLLBACK and, on MySQL or SQLite, commits the
   * business change without the message. A rejection means the unit of work must not commit.
   */
  append(tx: Tx, messages: readonly OutboxAppend[]): A;
  /**
   * Capability flag: true when `append` writes at once and returns a promise. The bus reads
   * it at runtime so that `publish()` on such a store returns a promise in every case (a
   * validation problem rejects instead of throwing), and the consumer awaits every append
   * a handler made before it commits the inbox transaction. A store whose `append` returns
   * a promise must set it: its type then keeps the store out of places that expect a
   * synchronous one (a function returning `Promise<void>` is otherwise assignable to one
   * returning `void`, which would type `publish()` as `string`).
   */
  readonly asyncAppend?: AsyncAppendFlag<A>;
  /** Claims up to `limit` due rows under a new lease. */
  claim(options: ClaimOptions): Promise<ClaimedBatch>;
  /** Marks rows published. */
  complete(lease: OutboxLease, sequences: readonly bigint[], options?: CompleteOptions): Promise<number>;
  /**
   * Optional: `complete(done.lease, done.sequences)` and `claim(options)` in one round trip
   * and one commit — both take effect, or neither. The completion is fenced exactly as
   * `complete` (only rows still held by `done.lease`) and the claim keeps every `claim`
   * guarantee. Rows the completion makes claimable (a key's next row) may or may not be
   * in this claim: a store whose claim reads a snapshot from before the completion leaves
   * them to the next one, which never breaks per-key order. The relay uses it to complete
   * a confirmed batch with its next claim, halving its statements and commits — also when
   * a fault hook is set, which it passes as `options.beforeCommit`, so the conformance kill
   * scenarios exercise this path, not a stand-in.
   */
  completeAndClaim?(done: PendingCompletion, options: CompleteAndClaimOptions): Promise<CompletedAndClaimed>;
  /** Records failures: counts an attempt and reschedules, or marks the row dead or halted. */
  fail(lease: OutboxLease, failures: readonly OutboxFailure[], options?: { signal?: AbortSignal }): Promise<number>;
  /** Gives rows back without counting an attempt (transport down, shutdown), due after `delayMs`. */
  release(lease: OutboxLease, sequences: readonly bigint[], delayMs?: number): Promise<number>;
  /**
   * Optional heartbeat: extends the lease of rows still held by `lease` (pending, with its
   * token) to `leaseMs` from now on the database clock, and returns how many it extended.
   * Rows re-claimed by another relay, completed, failed or released are not touched (a
   * stale relay is fenced out), so a count below `sequences.length` tells the relay it lost
   * them. A store that has it lets the relay claim with a short lease and keep it only
   * while a batch is in hand; without it the relay keeps one long lease per batch.
   */
  renew?(lease: OutboxLease, sequences: readonly bigint[], leaseMs: number, options?: { signal?: AbortSignal }): Promise<number>;
  /**
   * Optional wake-up signal: calls `listener` soon after appends commit so the relay
   * need not sleep-poll. Resolves with a function that stops listening.
   */
  watch?(listener: () => void): Promise<() => Promise<void>>;
  close?(): Promise<void>;
  /**
   * Optional: the longest envelope fields the store holds (its column sizes). The bus
   * refuses a message with a longer field at `publish()`, before it reaches `append`.
   */
  readonly limits?: PortLimits;
}

/**
 * The operator half of the outbox storage port: what an operator (the `courier` CLI, a
 * metrics gauge, an admin page) needs to see and repair the outbox. It takes no unit of
 * work and no lease, so it can be used from a process that never runs a relay.
 *
 * Contract every implementation keeps (the conformance suite checks each):
 * - `stats` counts on the database clock and never blocks appends or claims.
 * - `prune` deletes only published rows, in bounded batches, so it is safe while
 *   producers append and relays claim.
 * - `replay` makes dead or halted rows pending again with the same messageId and zero
 *   attempts; `purge` deletes only dead rows; `resume` acts only on a halted key's head.
 *   Each returns how many rows it changed, so a repeated call is harmless and visible.
 */
export interface OutboxOperations {
  stats(): Promise<OutboxStats>;
  /** Deletes published rows older than `olderThanMs`, in bounded batches. Returns the count. */
  prune(olderThanMs: number, options?: { batchSize?: number; signal?: AbortSignal }): Promise<number>;
  listDead(options?: ListOptions): Promise<readonly DeadOutboxRecord[]>;
  /** Makes dead or halted rows pending again with the same messageId and zero attempts. */
  replay(sequences: readonly bigint[]): Promise<number>;
  /** Deletes dead rows (halted rows must be resumed first). */
  purge(sequences: readonly bigint[]): Promise<number>;
  listHalted(options?: ListOptions): Promise<readonly HaltedKey[]>;
  /** Resumes a halted key: `retry` makes its head pending again, `park` marks it dead so the key moves on. */
  resume(topic: string, key: string, action: 'retry' | 'park'): Promise<number>;
}

/**
 * Storage port of the transactional outbox: the engine ({@link OutboxEngine}) and the
 * operator's operations ({@link OutboxOperations}) on one object, which is what
 * `createBus` takes. Code that only inspects or repairs the outbox (the CLI, gauges)
 * depends on `OutboxOperations` alone.
 */
export interface OutboxStore<Tx, A extends AppendResult = AppendResult> extends OutboxEngine<Tx, A>, OutboxOperations {}
