import { ClosedError, StorageError } from '../errors.js';
import { inboxStatsFromCounts, type InboxStats } from '../inbox-operations.js';
import type { Envelope } from '../envelope.js';
import type {
  InboxDrainClaim,
  InboxHaltedKey,
  InboxHalts,
  InboxListParkedOptions,
  InboxParkedMessage,
  InboxResult,
  InboxResumeAction,
  InboxRunOptions,
  InboxStore,
} from '../inbox-store.js';
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
 *
 * It has the {@link InboxHalts} capability: halts, held messages and parked heads live in
 * memory with the records (lost with the process, as everything here is).
 */
export class InMemoryInboxStore implements InboxStore<InMemoryTransaction>, InboxHalts {
  readonly #db: InMemoryDatabase;
  /** Pair → commit time (database clock). */
  readonly #records = new Map<string, number>();
  /** Pair → starts counted and the time of the last one. */
  readonly #starts = new Map<string, { count: number; at: number }>();
  /** (consumer, topic, key) → its halt. */
  readonly #halts = new Map<string, Halt>();
  readonly #parked: InboxParkedMessage[] = [];
  /** Arrival order of held messages across every halt. */
  #heldSequence = 0;
  /** Order of parking, for `listParked`'s cursor. */
  #parkedSequence = 0n;
  #closed = false;

  constructor(config: InMemoryInboxStoreConfig) {
    this.#db = config.database;
  }

  /** Runs `work` once per (messageId, consumer), committing its effects with the record (see the class guarantees). */
  async run<T>(
    messageId: string,
    consumer: string,
    work: (tx: InMemoryTransaction) => Promise<T>,
    options: InboxRunOptions = {},
  ): Promise<InboxResult<T>> {
    this.#ready('run', options.signal);
    const pair = pairOf(messageId, consumer);
    if (this.#records.has(pair)) return { duplicate: true };
    if (options.hold) {
      // Checked and held in one synchronous step: nothing can lift the halt in between.
      const halt = this.#halts.get(haltOf(options.hold.consumer ?? consumer, options.hold.topic, options.hold.key));
      if (halt) {
        this.#hold(halt, options.hold.envelope);
        return { duplicate: false, held: true };
      }
    }
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

  /** Per consumer: records, the age of the oldest (database clock) and dead letters; one pass over the records. */
  async stats(options: { signal?: AbortSignal } = {}): Promise<InboxStats> {
    this.#ready('stats', options.signal);
    const now = this.#db.now();
    const counts = new Map<string, { records: number; oldest: number }>();
    for (const [pair, at] of this.#records) {
      const name = pair.slice(0, pair.indexOf('\u0000'));
      const found = counts.get(name);
      if (found) {
        found.records += 1;
        found.oldest = Math.min(found.oldest, at);
      } else counts.set(name, { records: 1, oldest: at });
    }
    return inboxStatsFromCounts([...counts].map(([name, { records, oldest }]) => ({ name, records, oldestAgeMs: now - oldest })));
  }

  /** Creates the halt of (consumer, topic, key) with `envelope` as its head, or holds `envelope` behind an existing one. */
  async halt(consumer: string, topic: string, key: string, envelope: Envelope, error: string): Promise<'halted' | 'held'> {
    this.#ready('halt');
    const id = haltOf(consumer, topic, key);
    const existing = this.#halts.get(id);
    if (existing) {
      if (existing.head?.envelope.messageId !== envelope.messageId) this.#hold(existing, envelope);
      return 'held';
    }
    this.#halts.set(id, { consumer, topic, key, head: { envelope, error }, haltedAt: this.#db.now(), held: new Map(), resumed: null, owner: null, until: 0 });
    return 'halted';
  }

  /** Every halt (of `consumer`, when given), oldest first. */
  async listHalted(options: { readonly consumer?: string; readonly limit?: number } = {}): Promise<readonly InboxHaltedKey[]> {
    this.#ready('listHalted');
    const halts = [...this.#halts.values()].filter((halt) => options.consumer === undefined || halt.consumer === options.consumer);
    return halts.slice(0, options.limit ?? halts.length).map((halt) => ({
      consumer: halt.consumer,
      topic: halt.topic,
      key: halt.key,
      head: halt.head,
      haltedAt: new Date(halt.haltedAt),
      held: halt.held.size,
      resumed: halt.resumed,
    }));
  }

  /** Marks a halted (not yet resumed) key for draining with `action`; 1 when it did. */
  async resumeHalted(consumer: string, topic: string, key: string, action: InboxResumeAction): Promise<number> {
    this.#ready('resumeHalted');
    const halt = this.#halts.get(haltOf(consumer, topic, key));
    if (!halt || halt.resumed !== null) return 0;
    halt.resumed = action;
    return 1;
  }

  /** Gives `owner` one resumed halt of `consumer` whose drain lease is free or expired. */
  async claimResumed(consumer: string, owner: string, leaseMs: number): Promise<InboxDrainClaim | undefined> {
    this.#ready('claimResumed');
    const now = this.#db.now();
    for (const halt of this.#halts.values()) {
      if (halt.consumer !== consumer || halt.resumed === null) continue;
      if (halt.owner !== null && halt.owner !== owner && halt.until > now) continue;
      halt.owner = owner;
      halt.until = now + leaseMs;
      halt.leaseMs = leaseMs;
      return { consumer, topic: halt.topic, key: halt.key, action: halt.resumed, head: halt.head };
    }
    return undefined;
  }

  /** Renews `owner`'s drain lease on a halt it still holds; false when the claim is lost. */
  async renewDrain(consumer: string, topic: string, key: string, owner: string): Promise<boolean> {
    this.#ready('renewDrain');
    return this.#owned(consumer, topic, key, owner) !== undefined;
  }

  /** Removes the head of a halt `owner` drains, keeping it as parked when asked. */
  async settleHead(consumer: string, topic: string, key: string, owner: string, options: { readonly parked: boolean; readonly error?: string }): Promise<boolean> {
    this.#ready('settleHead');
    const halt = this.#owned(consumer, topic, key, owner);
    if (!halt) return false;
    if (halt.head && options.parked) {
      this.#parkedSequence += 1n;
      this.#parked.push({ consumer, envelope: halt.head.envelope, error: options.error ?? halt.head.error, parkedAt: new Date(this.#db.now()), seq: this.#parkedSequence });
    }
    halt.head = null;
    return true;
  }

  /** The oldest `limit` messages held behind a halt `owner` drains. */
  async listHeld(consumer: string, topic: string, key: string, owner: string, limit: number): Promise<readonly Envelope[]> {
    this.#ready('listHeld');
    const halt = this.#owned(consumer, topic, key, owner);
    if (!halt) return [];
    return [...halt.held.values()].sort((a, b) => a.sequence - b.sequence).slice(0, limit).map((entry) => entry.envelope);
  }

  /** Removes one held message of a halt `owner` drains. */
  async drop(consumer: string, topic: string, key: string, messageId: string, owner: string): Promise<boolean> {
    this.#ready('drop');
    const halt = this.#owned(consumer, topic, key, owner);
    return halt ? halt.held.delete(messageId) : false;
  }

  /** Halts a key `owner` drains again, at `envelope` (taken out of the held messages), and gives up the claim. */
  async rehalt(consumer: string, topic: string, key: string, envelope: Envelope, error: string, owner: string): Promise<boolean> {
    this.#ready('rehalt');
    const halt = this.#owned(consumer, topic, key, owner);
    if (!halt) return false;
    halt.held.delete(envelope.messageId);
    halt.head = { envelope, error };
    halt.haltedAt = this.#db.now();
    halt.resumed = null;
    halt.owner = null;
    return true;
  }

  /** Deletes a halt `owner` drains when nothing is held behind it (and its head is settled). */
  async lift(consumer: string, topic: string, key: string, owner: string): Promise<boolean> {
    this.#ready('lift');
    const halt = this.#owned(consumer, topic, key, owner);
    if (!halt || halt.head !== null || halt.held.size > 0) return false;
    this.#halts.delete(haltOf(consumer, topic, key));
    return true;
  }

  /** Heads parked by a resume, oldest first. */
  async listParked(options: InboxListParkedOptions = {}): Promise<readonly InboxParkedMessage[]> {
    this.#ready('listParked');
    const after = options.after;
    const parked = this.#parked.filter((entry) => (options.consumer === undefined || entry.consumer === options.consumer) && (after === undefined || entry.seq! > after));
    return parked.slice(0, options.limit ?? parked.length);
  }

  /** How many heads are parked ({@link InboxHalts.countParked}). */
  async countParked(options: { readonly consumer?: string } = {}): Promise<number> {
    this.#ready('countParked');
    return this.#parked.filter((entry) => options.consumer === undefined || entry.consumer === options.consumer).length;
  }

  /** Makes a parked head the head of a halt of its key resumed with `retry`, or holds it behind the key's halt ({@link InboxHalts.replayParked}). */
  async replayParked(consumer: string, messageId: string): Promise<'resumed' | 'held' | false> {
    this.#ready('replayParked');
    const index = this.#parked.findIndex((entry) => entry.consumer === consumer && entry.envelope.messageId === messageId);
    if (index < 0) return false;
    const [parked] = this.#parked.splice(index, 1);
    const { envelope, error } = parked!;
    const key = parkedKey(envelope);
    const existing = this.#halts.get(haltOf(consumer, envelope.topic, key));
    if (existing) {
      this.#hold(existing, envelope);
      return 'held';
    }
    this.#halts.set(haltOf(consumer, envelope.topic, key), {
      consumer,
      topic: envelope.topic,
      key,
      head: { envelope, error },
      haltedAt: this.#db.now(),
      held: new Map(),
      resumed: 'retry',
      owner: null,
      until: 0,
    });
    return 'resumed';
  }

  /** Deletes a parked head ({@link InboxHalts.purgeParked}). */
  async purgeParked(consumer: string, messageId: string): Promise<boolean> {
    this.#ready('purgeParked');
    const index = this.#parked.findIndex((entry) => entry.consumer === consumer && entry.envelope.messageId === messageId);
    if (index < 0) return false;
    this.#parked.splice(index, 1);
    return true;
  }

  /** The halt when `owner` still holds its drain lease, which this renews. */
  #owned(consumer: string, topic: string, key: string, owner: string): Halt | undefined {
    const halt = this.#halts.get(haltOf(consumer, topic, key));
    const now = this.#db.now();
    if (!halt || halt.owner !== owner || halt.until <= now) return undefined;
    halt.until = now + (halt.leaseMs ?? 0);
    return halt;
  }

  #hold(halt: Halt, envelope: Envelope): void {
    if (halt.held.has(envelope.messageId)) return;
    this.#heldSequence += 1;
    halt.held.set(envelope.messageId, { envelope, sequence: this.#heldSequence });
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

interface Halt {
  readonly consumer: string;
  readonly topic: string;
  readonly key: string;
  head: { readonly envelope: Envelope; readonly error: string } | null;
  haltedAt: number;
  readonly held: Map<string, { readonly envelope: Envelope; readonly sequence: number }>;
  resumed: InboxResumeAction | null;
  /** The drainer holding the lease, and until when (database clock). */
  owner: string | null;
  until: number;
  leaseMs?: number;
}

/** The key of a parked head: only keyed messages halt, so only they are ever parked. */
function parkedKey(envelope: Envelope): string {
  if (envelope.key === null) throw new StorageError(`parked head '${envelope.messageId}' has no key; only a keyed message halts and is parked`);
  return envelope.key;
}

function haltOf(consumer: string, topic: string, key: string): string {
  return `${consumer}\u0000${topic}\u0000${key}`;
}

function pairOf(messageId: string, consumer: string): string {
  return `${consumer}\u0000${messageId}`;
}
