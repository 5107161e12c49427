import { acceptEnvelope, type Envelope } from '../envelope.js';
import { ClosedError, ConfigError, StorageError } from '../errors.js';
import type {
  ClaimOptions,
  ClaimedBatch,
  CompleteOptions,
  CompletedAndClaimed,
  DeadOutboxRecord,
  HaltedKey,
  ListOptions,
  OutboxAppend,
  OutboxFailure,
  OutboxLease,
  OutboxRecord,
  OutboxState,
  OutboxStats,
  OutboxStore,
  PendingCompletion,
  CompleteAndClaimOptions,
} from '../outbox-store.js';
import { requireTransaction, throwIfAborted, type InMemoryDatabase, type InMemoryTransaction } from './in-memory-database.js';

/** Arguments of {@link InMemoryOutboxStore}. */
export interface InMemoryOutboxStoreConfig {
  /** The database whose units of work the outbox joins and whose clock it uses. */
  readonly database: InMemoryDatabase;
}

interface Row {
  readonly sequence: bigint;
  readonly envelope: Envelope;
  readonly committedAt: number;
  state: OutboxState;
  attempts: number;
  lastError: string | null;
  failedAt: number | null;
  /** The last failure's code and error name (null when not given), as the SQL columns keep them. */
  errorCode: string | null;
  errorName: string | null;
  /** When the row first failed since its append or last replay. */
  firstFailedAt: number | null;
  dueAt: number;
  /**
   * When the row first became due (its insert, or its delay/notBefore), kept across retries
   * and releases and reset only by a replay: `stats().oldestPendingAgeMs` counts from it, so
   * a message failing for hours reads hours old, not 0 while it waits out a backoff.
   */
  firstDueAt: number;
  publishedAt: number | null;
  leaseToken: bigint | null;
  leaseOwner: string | null;
  leaseExpiresAt: number;
}

interface Staged {
  readonly messages: { readonly envelope: Envelope; readonly delayMs: number; readonly notBefore: number | null }[];
  readonly ids: Set<string>;
}

const DEFAULT_LIST_LIMIT = 100;

/**
 * The reference {@link OutboxStore}: rows live in memory and join
 * {@link InMemoryTransaction} units of work.
 *
 * Guarantees (the outbox contract): rows become visible only when their unit of work
 * commits, with sequences assigned at commit, so per-key sequence order is commit order;
 * a duplicate messageId is refused at append (already visible or staged in the same
 * unit of work) or at commit (code `DUPLICATE_MESSAGE_ID`, nothing written); `claim`
 * returns due rows (database clock) at the head of their (topic, key) under a lease
 * with a strictly increasing fencing token, and concurrent claims never share a row;
 * `complete`, `fail`, `release` and `renew` change only rows still held by the given lease.
 */
export class InMemoryOutboxStore implements OutboxStore<InMemoryTransaction, void> {
  readonly #db: InMemoryDatabase;
  /** In sequence order: sequences are assigned increasing at commit and rows are never re-inserted. */
  readonly #rows = new Map<bigint, Row>();
  readonly #byMessageId = new Map<string, bigint>();
  readonly #staged = new WeakMap<InMemoryTransaction, Staged>();
  readonly #listeners = new Set<() => void>();
  #nextSequence = 1n;
  #lastToken = 0n;
  #closed = false;

  constructor(config: InMemoryOutboxStoreConfig) {
    this.#db = config.database;
  }

  /**
   * Stages `messages` into `tx`; they are written when it commits.
   * Throws, appending nothing, on a foreign or ended `tx`, an invalid envelope or
   * schedule, or a messageId already visible or staged.
   */
  append(tx: InMemoryTransaction, messages: readonly OutboxAppend[]): void {
    this.#assertOpen();
    const unit = requireTransaction(tx, this.#db, 'append');
    const staged = this.#staged.get(unit);
    const batchIds = new Set<string>();
    const prepared: Staged['messages'] = [];
    for (const [index, message] of messages.entries()) {
      const envelope = acceptEnvelope(message.envelope);
      const id = envelope.messageId;
      if (this.#byMessageId.has(id) || staged?.ids.has(id) || batchIds.has(id)) {
        throw duplicate(id);
      }
      const delayMs = message.delayMs ?? 0;
      if (!Number.isFinite(delayMs) || delayMs < 0) {
        throw new ConfigError(`'messages[${index}].delayMs' must be a finite number of 0 or more, got ${String(delayMs)}`);
      }
      let notBefore: number | null = null;
      if (message.notBefore !== undefined) {
        notBefore = message.notBefore instanceof Date ? message.notBefore.getTime() : Number.NaN;
        if (Number.isNaN(notBefore)) throw new ConfigError(`'messages[${index}].notBefore' must be a valid Date`);
      }
      batchIds.add(id);
      prepared.push({ envelope, delayMs, notBefore });
    }
    if (prepared.length === 0) return;
    if (staged) {
      staged.messages.push(...prepared);
      for (const id of batchIds) staged.ids.add(id);
      return;
    }
    const fresh: Staged = { messages: prepared, ids: batchIds };
    this.#staged.set(unit, fresh);
    unit.onPrepare(() => {
      for (const id of fresh.ids) if (this.#byMessageId.has(id)) throw duplicate(id);
    });
    unit.onCommit(() => {
      const now = this.#db.now();
      for (const { envelope, delayMs, notBefore } of fresh.messages) {
        const sequence = this.#nextSequence;
        this.#nextSequence += 1n;
        this.#rows.set(sequence, {
          sequence,
          envelope,
          committedAt: now,
          state: 'pending',
          attempts: 0,
          lastError: null,
          failedAt: null,
          errorCode: null,
          errorName: null,
          firstFailedAt: null,
          dueAt: Math.max(now + delayMs, notBefore ?? now),
          firstDueAt: Math.max(now + delayMs, notBefore ?? now),
          publishedAt: null,
          leaseToken: null,
          leaseOwner: null,
          leaseExpiresAt: 0,
        });
        this.#byMessageId.set(envelope.messageId, sequence);
      }
    });
    unit.afterCommit(() => this.#notify());
  }

  /** Claims up to `limit` due head-of-key rows under a new lease (see the class guarantees). */
  async claim(options: ClaimOptions): Promise<ClaimedBatch> {
    this.#ready('claim', options.signal);
    this.#checkClaim(options);
    return this.#claimNow(options);
  }

  /**
   * `complete` then `claim` in one step (nothing runs in between, and a claim refused for
   * its options completes nothing). The claim sees the completion: a key's next row may be
   * in the same batch. `beforeCommit` runs before either is applied: if it throws, or
   * never resolves, nothing changes.
   */
  async completeAndClaim(done: PendingCompletion, options: CompleteAndClaimOptions): Promise<CompletedAndClaimed> {
    this.#ready('claim', options.signal);
    this.#checkClaim(options);
    if (options.beforeCommit) {
      const held = this.#held(done.lease, done.sequences);
      await options.beforeCommit('complete-before-commit', { messageIds: held.map((row) => row.envelope.messageId) });
      this.#ready('claim', options.signal);
    }
    // Looked up again after the hook: a row may have been re-claimed meanwhile.
    const completed = this.#completeNow(done.lease, this.#held(done.lease, done.sequences));
    return { ...this.#claimNow(options), completed };
  }

  #checkClaim(options: ClaimOptions): void {
    const problems: string[] = [];
    if (!Number.isSafeInteger(options.limit) || options.limit < 1) problems.push(`'limit' must be an integer of 1 or more`);
    if (!(options.leaseMs > 0)) problems.push(`'leaseMs' must be more than 0`);
    if (!Number.isSafeInteger(options.perKey) || options.perKey < 1) problems.push(`'perKey' must be an integer of 1 or more`);
    if (problems.length > 0) throw new ConfigError(problems);
  }

  #claimNow(options: ClaimOptions): ClaimedBatch {
    const now = this.#db.now();
    this.#lastToken += 1n;
    const lease: OutboxLease = { owner: options.owner, token: this.#lastToken };
    const records: OutboxRecord[] = [];
    // Keys with an earlier row that stays pending (in flight, not due, over perKey) or halted.
    const blocked = new Set<string>();
    const takenPerKey = new Map<string, number>();
    for (const row of this.#rows.values()) {
      if (records.length >= options.limit) break;
      if (row.state === 'published' || row.state === 'dead') continue;
      const key = keyOf(row.envelope);
      if (row.state === 'halted') {
        if (key !== null) blocked.add(key);
        continue;
      }
      const claimable = row.dueAt <= now && !isLeased(row, now);
      if (key === null) {
        if (claimable) records.push(this.#lease(row, lease, now, options.leaseMs));
        continue;
      }
      if (blocked.has(key)) continue;
      const taken = takenPerKey.get(key) ?? 0;
      if (claimable && taken < options.perKey) {
        takenPerKey.set(key, taken + 1);
        records.push(this.#lease(row, lease, now, options.leaseMs));
      } else {
        blocked.add(key);
      }
    }
    return { lease, records };
  }

  /**
   * Marks rows held by `lease` published. `beforeCommit` runs after the change is
   * computed and before it is applied: if it throws, or never resolves, nothing changes.
   */
  async complete(lease: OutboxLease, sequences: readonly bigint[], options: CompleteOptions = {}): Promise<number> {
    this.#ready('complete', options.signal);
    const held = this.#held(lease, sequences);
    if (options.beforeCommit) {
      await options.beforeCommit('complete-before-commit', { messageIds: held.map((row) => row.envelope.messageId) });
      this.#ready('complete', options.signal);
    }
    return this.#completeNow(lease, held);
  }

  #completeNow(lease: OutboxLease, held: readonly Row[]): number {
    const now = this.#db.now();
    let changed = 0;
    // Re-checked after complete's hook: no row lock is held across it (a frozen worker
    // would hold it forever), so another relay may have re-claimed a row meanwhile.
    for (const row of held) {
      if (row.state !== 'pending' || row.leaseToken !== lease.token) continue;
      row.state = 'published';
      row.publishedAt = now;
      clearLease(row);
      changed += 1;
    }
    return changed;
  }

  /** Records failures of rows held by `lease`: counts an attempt, then reschedules, kills or halts each. */
  async fail(lease: OutboxLease, failures: readonly OutboxFailure[], options: { signal?: AbortSignal } = {}): Promise<number> {
    this.#ready('fail', options.signal);
    const now = this.#db.now();
    let changed = 0;
    for (const failure of failures) {
      const row = this.#rows.get(failure.sequence);
      if (!row || row.state !== 'pending' || row.leaseToken !== lease.token) continue;
      row.attempts += 1;
      row.lastError = failure.error;
      row.failedAt = now;
      row.errorCode = failure.code ?? null;
      row.errorName = failure.errorName ?? null;
      row.firstFailedAt ??= now;
      clearLease(row);
      if (failure.outcome === 'retry') row.dueAt = now + Math.max(0, failure.delayMs);
      else row.state = failure.outcome === 'dead' ? 'dead' : 'halted';
      changed += 1;
    }
    return changed;
  }

  /** Gives rows held by `lease` back without counting an attempt, due after `delayMs`. */
  async release(lease: OutboxLease, sequences: readonly bigint[], delayMs = 0): Promise<number> {
    this.#ready('release');
    const now = this.#db.now();
    const held = this.#held(lease, sequences);
    for (const row of held) {
      clearLease(row);
      row.dueAt = now + Math.max(0, delayMs);
    }
    if (held.length > 0) this.#notify();
    return held.length;
  }

  /**
   * Extends the lease of rows still held by `lease` to `leaseMs` from now (database clock).
   * Returns how many it extended; rows another relay re-claimed are not touched.
   */
  async renew(lease: OutboxLease, sequences: readonly bigint[], leaseMs: number, options: { signal?: AbortSignal } = {}): Promise<number> {
    this.#ready('renew', options.signal);
    if (!(leaseMs > 0) || !Number.isFinite(leaseMs)) throw new ConfigError([`'leaseMs' must be more than 0`]);
    const expiresAt = this.#db.now() + leaseMs;
    const held = this.#held(lease, sequences);
    for (const row of held) row.leaseExpiresAt = expiresAt;
    return held.length;
  }

  /**
   * Calls `listener` (asynchronously, soon after) every time a commit appended rows and
   * after `release`, `replay` and `resume` made rows claimable. Resolves with a function
   * that stops listening.
   */
  async watch(listener: () => void): Promise<() => Promise<void>> {
    this.#ready('watch');
    // A wrapper per call, so the same listener may watch twice and unsubscribe once.
    const entry = (): void => listener();
    this.#listeners.add(entry);
    return async () => {
      this.#listeners.delete(entry);
    };
  }

  /** Counts: `pending` includes rows in flight; `inFlight` are pending rows under a live lease. */
  async stats(): Promise<OutboxStats> {
    this.#ready('stats');
    const now = this.#db.now();
    let pending = 0;
    let inFlight = 0;
    let dead = 0;
    let oldestDue = Number.POSITIVE_INFINITY;
    const haltedKeys = new Set<string>();
    for (const row of this.#rows.values()) {
      if (row.state === 'pending') {
        pending += 1;
        const leased = isLeased(row, now);
        if (leased) inFlight += 1;
        // Due and waiting (also after a release), or failing (in a retry's backoff or being
        // tried again): its real age, from when it first became due. A delayed row not yet
        // due counts nothing; a first attempt in flight is `inFlight`, not backlog.
        if (row.attempts > 0 || (!leased && row.firstDueAt <= now)) oldestDue = Math.min(oldestDue, row.firstDueAt);
      } else if (row.state === 'dead') dead += 1;
      else if (row.state === 'halted') haltedKeys.add(keyOf(row.envelope) ?? `#${row.sequence}`);
    }
    return {
      pending,
      oldestPendingAgeMs: Number.isFinite(oldestDue) ? Math.max(0, now - oldestDue) : 0,
      inFlight,
      dead,
      haltedKeys: haltedKeys.size,
    };
  }

  /** Deletes published rows published at least `olderThanMs` ago (database clock), `batchSize` at a time. */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    this.#ready('prune', options.signal);
    const batchSize = options.batchSize ?? 1_000;
    const cutoff = this.#db.now() - olderThanMs;
    let deleted = 0;
    for (;;) {
      const batch: Row[] = [];
      for (const row of this.#rows.values()) {
        if (row.state === 'published' && row.publishedAt !== null && row.publishedAt <= cutoff) batch.push(row);
        if (batch.length >= batchSize) break;
      }
      for (const row of batch) this.#delete(row);
      deleted += batch.length;
      if (batch.length < batchSize) return deleted;
      // Yield between batches, as a database store would between statements.
      await Promise.resolve();
      this.#ready('prune', options.signal);
    }
  }

  /** Lists dead rows in sequence order (keyset pagination by `after`). */
  async listDead(options: ListOptions = {}): Promise<readonly DeadOutboxRecord[]> {
    this.#ready('listDead');
    const limit = options.limit ?? DEFAULT_LIST_LIMIT;
    const result: DeadOutboxRecord[] = [];
    for (const row of this.#rows.values()) {
      if (result.length >= limit) break;
      if (row.state !== 'dead') continue;
      if (options.after !== undefined && row.sequence <= options.after) continue;
      if (options.topic !== undefined && row.envelope.topic !== options.topic) continue;
      result.push(deadRecord(row));
    }
    return result;
  }

  /** Makes dead or halted rows pending again, due now, with the same messageId and zero attempts. */
  async replay(sequences: readonly bigint[]): Promise<number> {
    this.#ready('replay');
    const now = this.#db.now();
    let changed = 0;
    for (const sequence of new Set(sequences)) {
      const row = this.#rows.get(sequence);
      if (!row || (row.state !== 'dead' && row.state !== 'halted')) continue;
      reset(row, now);
      changed += 1;
    }
    if (changed > 0) this.#notify();
    return changed;
  }

  /** Deletes dead rows; rows in any other state are left alone. */
  async purge(sequences: readonly bigint[]): Promise<number> {
    this.#ready('purge');
    let deleted = 0;
    for (const sequence of new Set(sequences)) {
      const row = this.#rows.get(sequence);
      if (!row || row.state !== 'dead') continue;
      this.#delete(row);
      deleted += 1;
    }
    return deleted;
  }

  /** Lists halted keys ordered by their head's sequence, with the count of pending rows held behind each head. */
  async listHalted(options: ListOptions = {}): Promise<readonly HaltedKey[]> {
    this.#ready('listHalted');
    const limit = options.limit ?? DEFAULT_LIST_LIMIT;
    const heads = new Map<string, { head: Row; held: number }>();
    for (const row of this.#rows.values()) {
      const key = keyOf(row.envelope);
      if (key === null) continue;
      const entry = heads.get(key);
      if (row.state === 'halted' && !entry) heads.set(key, { head: row, held: 0 });
      else if (entry && row.state === 'pending') entry.held += 1;
    }
    const result: HaltedKey[] = [];
    for (const { head, held } of heads.values()) {
      if (result.length >= limit) break;
      if (options.after !== undefined && head.sequence <= options.after) continue;
      if (options.topic !== undefined && head.envelope.topic !== options.topic) continue;
      result.push({ topic: head.envelope.topic, key: head.envelope.key ?? '', head: deadRecord(head), held });
    }
    return result;
  }

  /** Resumes a halted key: `retry` makes its halted head pending with zero attempts, `park` marks it dead. */
  async resume(topic: string, key: string, action: 'retry' | 'park'): Promise<number> {
    this.#ready('resume');
    if (action !== 'retry' && action !== 'park') throw new ConfigError(`'action' must be 'retry' or 'park', got ${JSON.stringify(action)}`);
    const now = this.#db.now();
    let changed = 0;
    for (const row of this.#rows.values()) {
      if (row.state !== 'halted' || row.envelope.topic !== topic || row.envelope.key !== key) continue;
      if (action === 'retry') reset(row, now);
      else row.state = 'dead';
      changed += 1;
    }
    if (changed > 0) this.#notify();
    return changed;
  }

  /** Stops every watcher; later calls reject with `ClosedError`. Idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#listeners.clear();
  }

  /** Same as {@link InMemoryOutboxStore.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #lease(row: Row, lease: OutboxLease, now: number, leaseMs: number): OutboxRecord {
    // Read before the lease moves it: an expired lease's row is due since its expiry.
    const dueSince = Math.max(row.committedAt, isLeaseExpired(row, now) ? row.leaseExpiresAt : row.dueAt);
    row.leaseToken = lease.token;
    row.leaseOwner = lease.owner;
    row.leaseExpiresAt = now + leaseMs;
    return { sequence: row.sequence, envelope: row.envelope, attempts: row.attempts, ageMs: Math.max(0, now - dueSince) };
  }

  #held(lease: OutboxLease, sequences: readonly bigint[]): Row[] {
    const held: Row[] = [];
    for (const sequence of new Set(sequences)) {
      const row = this.#rows.get(sequence);
      if (row && row.state === 'pending' && row.leaseToken === lease.token) held.push(row);
    }
    return held;
  }

  #delete(row: Row): void {
    this.#rows.delete(row.sequence);
    if (this.#byMessageId.get(row.envelope.messageId) === row.sequence) this.#byMessageId.delete(row.envelope.messageId);
  }

  #notify(): void {
    for (const listener of this.#listeners) {
      queueMicrotask(() => {
        try {
          listener();
        } catch {
          // A failing listener must not break the store or other listeners.
        }
      });
    }
  }

  #assertOpen(): void {
    if (this.#closed) throw new ClosedError('InMemoryOutboxStore');
  }

  #ready(operation: string, signal?: AbortSignal): void {
    this.#assertOpen();
    throwIfAborted(signal, operation);
    this.#db.assertAvailable(operation);
  }
}

function keyOf(envelope: Envelope): string | null {
  return envelope.key === null ? null : `${envelope.topic}\u0000${envelope.key}`;
}

function isLeased(row: Row, now: number): boolean {
  return row.leaseToken !== null && row.leaseExpiresAt > now;
}

function isLeaseExpired(row: Row, now: number): boolean {
  return row.leaseToken !== null && row.leaseExpiresAt <= now;
}

function clearLease(row: Row): void {
  row.leaseToken = null;
  row.leaseOwner = null;
  row.leaseExpiresAt = 0;
}

function reset(row: Row, now: number): void {
  row.state = 'pending';
  row.attempts = 0;
  row.lastError = null;
  row.failedAt = null;
  row.errorCode = null;
  row.errorName = null;
  row.firstFailedAt = null;
  row.dueAt = now;
  row.firstDueAt = now;
  clearLease(row);
}

function deadRecord(row: Row): DeadOutboxRecord {
  return {
    sequence: row.sequence,
    envelope: row.envelope,
    state: row.state === 'halted' ? 'halted' : 'dead',
    attempts: row.attempts,
    lastError: row.lastError,
    failedAt: row.failedAt === null ? null : new Date(row.failedAt),
    code: row.errorCode,
    errorName: row.errorName,
    firstFailedAt: row.firstFailedAt === null ? null : new Date(row.firstFailedAt),
  };
}

function duplicate(messageId: string): StorageError {
  return new StorageError(`messageId '${messageId}' is already in the outbox; every message needs a unique id`, {
    code: 'DUPLICATE_MESSAGE_ID',
    retriable: false,
  });
}
