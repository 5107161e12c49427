import { TransportError, backoffDelay, describeError, retryPolicy, type DeadLetterReason, type Delivery, type DeliveryHandler, type Endpoint, type Envelope, type Logger, type Subscription } from '@courier/core';
import type { Consumer, KafkaMessage } from 'kafkajs';
import { HEADERS, decodeRecord, encodeRecord, headerText, type OutgoingRecord } from './record-codec.js';
import { CONTENT_ERRORS, describe, protocolType, sleep, within } from './kafka-support.js';

/**
 * Prefix of the in-hand mark, the metadata of every offset Courier commits:
 * `courier-in-hand:<N>` says no member of the group handed a record at or past offset N of
 * the partition to its handler. A member commits a mark past a record before it hands the
 * record over, so the next member of the group flags exactly the records below the mark it
 * finds as `redelivered` (they may have been in the hands of a member that died), and the
 * records past it as first deliveries.
 */
export const IN_HAND = 'courier-in-hand:';

/** The offset of an in-hand mark; undefined for metadata that is not one (none, or an earlier release's commit). */
function parseMark(metadata: string | null): number | undefined {
  if (metadata === null || !metadata.startsWith(IN_HAND)) return undefined;
  const mark = Number(metadata.slice(IN_HAND.length));
  return Number.isSafeInteger(mark) && mark >= 0 ? mark : undefined;
}

/**
 * Delays between the subscription's own restarts of a crashed kafkajs consumer: 0.5 s doubling
 * to 30 s, within 20 % below each step (so members crashed by one broker event do not rejoin
 * in lockstep). It never gives up while the subscription is open, hence no real attempt limit.
 */
const RESTART_BACKOFF = retryPolicy({ maxAttempts: Number.MAX_SAFE_INTEGER, initialDelayMs: 500, multiplier: 2, maxDelayMs: 30_000, jitter: 0.2 }, 'consumer restart');

/** Delays before a record whose run left it unsettled runs again: 1 s doubling to 30 s (see `KafkaSubscription#giveBack`). */
const GIVE_BACK_BACKOFF = retryPolicy({ maxAttempts: Number.MAX_SAFE_INTEGER, initialDelayMs: 1_000, multiplier: 2, maxDelayMs: 30_000, jitter: 0.2 }, 'give back');

/** Longest reason text, in UTF-8 bytes, of a dead letter written again after the broker refused it for its size. */
const DEAD_REASON_CUT_BYTES = 4_096;

/** `text` cut to at most `maxBytes` of UTF-8 without splitting a character, the cut marked with `…`. */
function cutUtf8(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text, 'utf8') <= maxBytes) return text;
  const bytes = Buffer.from(text, 'utf8').subarray(0, Math.max(0, maxBytes - 3));
  return `${bytes.toString('utf8').replace(/\uFFFD$/u, '')}…`;
}


/** What a {@link KafkaSubscription} gets from its transport: its kafkajs consumer, its topics and the transport's writers and lookups. */
export interface SubscriptionParts {
  readonly consumer: Consumer;
  readonly topics: readonly string[];
  readonly retryTopic: string;
  readonly deadLetterTopic: string;
  readonly maxBuffered: number;
  readonly maxRetryWaiting: number;
  readonly connectTimeoutMs: number;
  readonly logger: Logger;
  publishCopy(topic: string, record: OutgoingRecord): Promise<void>;
  /** Each partition's high watermark now (`partition → offset`). */
  highWatermarks(topic: string): Promise<Map<number, number>>;
  /** Each partition's log start offset now (`partition → offset`): where a group without a committed offset begins (`fromBeginning`). */
  logStarts(topic: string): Promise<Map<number, number>>;
  /** The group's committed offset (-1: none) and its metadata for every partition of `topics` (`topic\0partition →`). */
  committedOffsets(topics: readonly string[]): Promise<Map<string, { offset: number; metadata: string | null }>>;
  forget(subscription: KafkaSubscription): void;
}

/** Where one partition's records stand in this member. */
interface PartitionState {
  readonly topic: string;
  readonly partition: number;
  /** Offsets handed over (queued, waiting or running) and not settled yet. */
  readonly unfinished: Set<number>;
  /** Next offset after the highest record taken. */
  next: number;
  /** Offset last committed by this member. */
  committed: number;
  /**
   * The in-hand mark every commit of this partition carries (see {@link IN_HAND}): no member
   * of the group has handed over a record at or past it. It only grows, and it starts at
   * `suspectBelow`, so a member never lowers a mark it inherited.
   */
  mark: number;
  /** The highest mark the broker has acknowledged from this member (0: none yet). */
  markCommitted: number;
  revoked: boolean;
  commits: Promise<void>;
  /**
   * Records below it may have been in a previous member's hands when it died (a log keeps
   * no per-record delivery state), so they are delivered flagged `redelivered`: the in-hand
   * mark committed by the group's members when this member joined with the partition (0
   * when nothing was ever committed), or, when the group's offsets carry no mark (an
   * earlier release committed them) or could not be read, the partition's log end then.
   */
  readonly suspectBelow: number;
}

/** One consumed record on its way through the subscription. */
interface Item {
  readonly state: PartitionState;
  readonly offset: number;
  readonly message: KafkaMessage;
  readonly headers: Record<string, string>;
  attempt: number;
  /** `topic\0key` on ordered endpoints (keyed records only). */
  readonly orderKey: string | undefined;
  timer?: NodeJS.Timeout;
  dropped?: boolean;
  /**
   * Times the record was handed back after a run that left it unsettled (its retry or dead
   * letter failed, or its handler settled nothing): it is delivered again flagged
   * `redelivered`, after a delay that grows with this count.
   */
  givenBack?: number;
  /** Waiting to be handed back (in `#waiting`, but not a retry copy counted in `#retryWaiting`). */
  handingBack?: boolean;
}

/**
 * One consumer group member on Kafka: takes records from kafkajs, hands them to the handler
 * (per key in order on ordered endpoints) and commits each partition only up to its lowest
 * unsettled record, with the in-hand mark (see {@link IN_HAND}). The transport's class comment
 * states the guarantees.
 */
export class KafkaSubscription implements Subscription {
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #parts: SubscriptionParts;
  readonly #states = new Map<string, PartitionState>();
  /** Ordered endpoints: per (topic, key), the records behind the one in front. */
  readonly #keys = new Map<string, Item[]>();
  readonly #ready: Item[] = [];
  readonly #running = new Set<Promise<void>>();
  readonly #waiting = new Set<Item>();
  readonly #roomWaiters: (() => void)[] = [];
  #buffered = 0;
  #active = 0;
  #retryWaiting = 0;
  #retryPaused = false;
  #stopped = false;
  #closing: Promise<void> | undefined;
  #joined: (() => void) | undefined;
  /** Restarts of the kafkajs consumer since it last joined its group (the backoff grows with them). */
  #restarts = 0;
  #restartTimer: NodeJS.Timeout | undefined;
  #restarting: Promise<void> | undefined;

  constructor(endpoint: Endpoint, handler: DeliveryHandler, parts: SubscriptionParts) {
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#parts = parts;
  }

  async start(): Promise<void> {
    const { consumer } = this.#parts;
    const joined = new Promise<void>((resolve) => {
      this.#joined = resolve;
    });
    consumer.on(consumer.events.GROUP_JOIN, (event) => {
      this.#restarts = 0;
      this.#suspects = this.#suspectBounds(event.payload.memberAssignment);
      this.#onAssignment(event.payload.memberAssignment);
      this.#joined?.();
    });
    consumer.on(consumer.events.CRASH, (event) => this.#onCrash(event.payload.error, event.payload.restart));
    await within(
      (async () => {
        await consumer.connect();
        await consumer.subscribe({ topics: [...this.#parts.topics], fromBeginning: true });
        await this.#runConsumer();
        await joined;
        // The start offsets of the partitions first assigned (`#commitStarts`; it never
        // rejects): a subscription closed at once still leaves the group's topics on record.
        await this.#suspects;
      })(),
      Math.max(this.#parts.connectTimeoutMs, 30_000),
      'joining the consumer group',
    ).catch((error: unknown) => {
      throw new TransportError(`cannot subscribe '${this.#endpoint.consumer}' (Kafka unreachable or the group did not form): ${describe(error)}`, { cause: error, retriable: true });
    });
  }

  /** Starts the kafkajs consumer's fetch loop; it resolves once joined, or once a failed join was reported as a `CRASH`. */
  #runConsumer(): Promise<void> {
    return this.#parts.consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: 4,
      eachBatch: (payload) => this.#onBatch(payload),
    });
  }

  /**
   * The kafkajs consumer crashed: it has left its group (its member is gone), so everything
   * it held is treated as revoked: nothing more of it starts, and nothing is committed for
   * it by this member; in-hand records come again to whoever joins with their partitions
   * (the inbox drops the copies). This also covers `commitOffsets` doing nothing while the
   * consumer is down: no commit is owed across a crash.
   *
   * kafkajs restarts the consumer itself only after errors it deems retriable; after any
   * other (a failed coordinator lookup during a broker restart, a fenced generation) it
   * stays down for good and the subscription would silently stop. Then it is started again
   * here, with a growing delay (0.5 s doubling to 30 s) and for as long as the subscription
   * is open, each attempt logged.
   */
  #onCrash(error: Error, restarting: boolean): void {
    this.#onAssignment({});
    if (this.#stopped) return;
    if (restarting) {
      this.#parts.logger.warn('kafka consumer crashed; kafkajs restarts it', { consumer: this.#endpoint.consumer, error: describeError(error) });
      return;
    }
    this.#parts.logger.error('kafka consumer crashed with an error kafkajs does not restart after; starting it again', {
      consumer: this.#endpoint.consumer,
      error: describeError(error),
      restarts: this.#restarts,
    });
    this.#scheduleRestart();
  }

  #scheduleRestart(): void {
    if (this.#stopped || this.#restartTimer !== undefined) return;
    this.#restarts += 1;
    const delay = backoffDelay(RESTART_BACKOFF, this.#restarts);
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      this.#restarting = this.#restart().finally(() => {
        this.#restarting = undefined;
      });
    }, delay);
  }

  async #restart(): Promise<void> {
    if (this.#stopped) return;
    const { consumer } = this.#parts;
    try {
      // The crash disconnected it; its subscription to the topics survives a disconnect.
      await consumer.connect();
      if (this.#stopped) return;
      await this.#runConsumer();
      this.#parts.logger.info('kafka consumer started again after a crash', { consumer: this.#endpoint.consumer, restarts: this.#restarts });
    } catch (error) {
      // Not even connected (a failed join is reported through CRASH, which schedules the next try).
      this.#parts.logger.error('kafka consumer could not be started again; retrying', { consumer: this.#endpoint.consumer, error: describeError(error), restarts: this.#restarts });
      await consumer.disconnect().catch(() => undefined);
      this.#scheduleRestart();
    }
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stopped = true;
      clearTimeout(this.#restartTimer);
      this.#restartTimer = undefined;
      await this.#restarting;
      for (const wake of this.#roomWaiters.splice(0)) wake();
      // Not started yet: dropped (uncommitted, so the group gets them again).
      this.#ready.length = 0;
      this.#keys.clear();
      for (const item of this.#waiting) clearTimeout(item.timer);
      this.#waiting.clear();
      while (this.#running.size > 0) await Promise.allSettled([...this.#running]);
      await Promise.all([...this.#states.values()].map((state) => state.commits));
      await this.#parts.consumer.disconnect().catch(() => undefined);
      this.#parts.forget(this);
    })();
    return this.#closing;
  }

  /**
   * Below which offset each assigned partition's records may have been in another member's
   * hands when this member joined: the in-hand mark of the group's committed offset (see
   * {@link IN_HAND}); 0 when the partition has no committed offset and no partition of the
   * group's topics has one without a mark (no member ever handed a record over). A committed
   * offset without a mark was written by an earlier release (or a tool): then, for every
   * partition without a mark, the log end at the join stands in, as it did in those releases.
   * A partition whose lookups failed gets no entry: its first fetched batch's high watermark
   * stands in (see `#onBatch`), which lies at or above the end at the join, so it still flags
   * every record that may have been in another member's hands (the safe side of
   * `Delivery.redelivered`), but not the records produced after that fetch: flagging those
   * too would make the core run them one at a time.
   */
  async #suspectBounds(assignment: Record<string, number[]>): Promise<Map<string, number>> {
    const bounds = new Map<string, number>();
    const topics = Object.keys(assignment);
    const failed = (what: string, error: unknown): void => {
      this.#parts.logger.warn(`kafka ${what} lookup failed; the first fetch bounds the redelivered records instead`, {
        consumer: this.#endpoint.consumer,
        topics,
        error: describeError(error),
      });
    };
    let committed: Map<string, { offset: number; metadata: string | null }>;
    try {
      committed = await this.#parts.committedOffsets(topics);
    } catch (error) {
      failed('committed-offset', error);
      return bounds;
    }
    const unmarked = [...committed.values()].some((entry) => entry.offset >= 0 && parseMark(entry.metadata) === undefined);
    const needEnds = new Set<string>();
    for (const topic of topics) {
      for (const partition of assignment[topic] ?? []) {
        const id = `${topic}\0${partition}`;
        const entry = committed.get(id);
        const mark = parseMark(entry?.metadata ?? null);
        if (mark !== undefined) bounds.set(id, mark);
        else if (unmarked) needEnds.add(topic);
        else bounds.set(id, 0);
      }
    }
    await Promise.all(
      [...needEnds].map(async (topic) => {
        const ends = await this.#parts.highWatermarks(topic).catch((error: unknown) => {
          failed('high-watermark', error);
          return new Map<number, number>();
        });
        for (const partition of assignment[topic] ?? []) {
          const id = `${topic}\0${partition}`;
          const end = ends.get(partition);
          if (!bounds.has(id) && end !== undefined) bounds.set(id, end);
        }
      }),
    );
    await this.#commitStarts(assignment, committed, bounds);
    return bounds;
  }

  /**
   * Commits where the group starts on each assigned partition it has no committed offset for:
   * the log start (a new group reads from the beginning, `fromBeginning`), with the in-hand
   * mark this member took for the partition, so the commit changes neither where the group
   * reads nor which records a later member flags. Why: the group's offsets are the only place
   * the broker keeps which topics it consumes; without them a group that was assigned a
   * partition and left before its first record there is invisible on that partition to
   * `consumerLag` (and to `kafka-consumer-groups --describe`), though records wait for it.
   * Runs before the first record of such a partition is handed over (`#onBatch` awaits the
   * bounds), and fenced like every commit (a member that lost the partition meanwhile is
   * refused). A failure is logged and changes nothing else: the partition is then
   * committed with its first record, as before.
   */
  async #commitStarts(assignment: Record<string, number[]>, committed: Map<string, { offset: number }>, bounds: Map<string, number>): Promise<void> {
    const missing = Object.entries(assignment)
      .map(([topic, partitions]) => ({ topic, partitions: partitions.filter((partition) => (committed.get(`${topic}\0${partition}`)?.offset ?? -1) < 0 && bounds.has(`${topic}\0${partition}`)) }))
      .filter(({ partitions }) => partitions.length > 0);
    if (missing.length === 0) return;
    try {
      const offsets = (
        await Promise.all(
          missing.map(async ({ topic, partitions }) => {
            const starts = await this.#parts.logStarts(topic);
            return partitions.flatMap((partition) => {
              const start = starts.get(partition);
              return start === undefined ? [] : [{ topic, partition, offset: String(start), metadata: `${IN_HAND}${bounds.get(`${topic}\0${partition}`)!}` }];
            });
          }),
        )
      ).flat();
      if (offsets.length > 0 && !this.#stopped) await this.#parts.consumer.commitOffsets(offsets);
    } catch (error) {
      this.#parts.logger.warn('kafka start offsets could not be committed; consumerLag may not count those partitions until their first record', {
        consumer: this.#endpoint.consumer,
        error: describeError(error),
      });
    }
  }

  #suspects: Promise<Map<string, number>> | undefined;

  #onAssignment(assignment: Record<string, number[]>): void {
    const kept = new Set(Object.entries(assignment).flatMap(([topic, partitions]) => partitions.map((partition) => `${topic}\0${partition}`)));
    for (const [id, state] of this.#states) {
      if (kept.has(id)) continue;
      // Revoked: nothing more of it starts, and nothing is committed for it by this member.
      state.revoked = true;
      this.#states.delete(id);
    }
    this.#dropRevoked();
  }

  /** Records of revoked partitions that have not started are dropped (uncommitted: the new owner gets them). */
  #dropRevoked(): void {
    for (let index = this.#ready.length - 1; index >= 0; index -= 1) {
      if (this.#drop(this.#ready[index]!)) this.#ready.splice(index, 1);
    }
    for (const [key, queue] of this.#keys) {
      const kept = queue.filter((item, index) => (index === 0 && this.#isRunning(item)) || !this.#drop(item));
      if (kept.length === 0) this.#keys.delete(key);
      else {
        this.#keys.set(key, kept);
        // The front was dropped and the one now in front (of a partition kept or assigned
        // again) never started: start it, or the key waits forever.
        if (kept[0] !== queue[0]) this.#enqueue(kept[0]!);
      }
    }
    for (const item of [...this.#waiting]) {
      if (this.#drop(item)) {
        clearTimeout(item.timer);
        this.#waiting.delete(item);
        if (item.orderKey === undefined && !item.handingBack) {
          this.#retryWaiting -= 1;
          this.#resumeRetries();
        }
      }
    }
  }

  /** Drops a revoked, not running record once; true when it is (or was) dropped. */
  #drop(item: Item): boolean {
    if (!item.state.revoked || this.#isRunning(item)) return false;
    if (!item.dropped) {
      item.dropped = true;
      this.#release();
    }
    return true;
  }

  readonly #runningItems = new Set<Item>();
  #isRunning(item: Item): boolean {
    return this.#runningItems.has(item);
  }

  async #onBatch(payload: import('kafkajs').EachBatchPayload): Promise<void> {
    const { batch } = payload;
    const id = `${batch.topic}\0${batch.partition}`;
    for (const message of batch.messages) {
      if (this.#stopped || !payload.isRunning() || payload.isStale()) return;
      let state = this.#states.get(id);
      if (!state) {
        const suspectBelow = (await this.#suspects)?.get(id) ?? Number(batch.highWatermark);
        if (this.#stopped || !payload.isRunning() || payload.isStale()) return;
        const first = Number(message.offset);
        state = { topic: batch.topic, partition: batch.partition, unfinished: new Set(), next: first, committed: first, mark: suspectBelow, markCommitted: 0, revoked: false, commits: Promise.resolve(), suspectBelow };
        this.#states.set(id, state);
      }
      const offset = Number(message.offset);
      if (state.unfinished.has(offset)) {
        // Fetched again after a rebalance while still in hand here: not twice.
        payload.resolveOffset(message.offset);
        continue;
      }
      if (!(await this.#room(payload))) return;
      if (state.revoked || this.#stopped) return;
      if (offset >= state.markCommitted && !(await this.#markInHand(state, payload, offset))) return;
      state.unfinished.add(offset);
      state.next = Math.max(state.next, offset + 1);
      this.#buffered += 1;
      this.#take(state, offset, message);
      payload.resolveOffset(message.offset);
    }
    await payload.heartbeat().catch(() => undefined);
  }

  /**
   * Commits the partition's in-hand mark past `offset` before the record is handed over, so
   * that a member joining after this one dies flags it `redelivered`. One commit covers the
   * rest of the fetched batch, at most `maxBuffered` records (a crash flags at most that many
   * records this member never took). False when the batch must end: the commit failed, or
   * the partition or the consumer went away meanwhile (kafkajs resolves a commit of a
   * consumer that stopped running without sending it); its records are fetched again.
   */
  async #markInHand(state: PartitionState, payload: import('kafkajs').EachBatchPayload, offset: number): Promise<boolean> {
    const { messages } = payload.batch;
    const batchEnd = Number(messages[messages.length - 1]?.offset ?? offset) + 1;
    state.mark = Math.max(state.mark, offset + 1, Math.min(batchEnd, offset + this.#parts.maxBuffered));
    try {
      await this.#commit(state);
    } catch (error) {
      this.#parts.logger.warn('kafka in-hand mark could not be committed; the records are fetched again', { consumer: this.#endpoint.consumer, error: describeError(error) });
      return false;
    }
    return !(this.#stopped || state.revoked || !payload.isRunning() || payload.isStale()) && offset < state.markCommitted;
  }

  /** Waits until fewer than `maxBuffered` records are in hand; heartbeats meanwhile. False when the batch must end. */
  async #room(payload: import('kafkajs').EachBatchPayload): Promise<boolean> {
    while (this.#buffered >= this.#parts.maxBuffered) {
      await Promise.race([new Promise<void>((resolve) => this.#roomWaiters.push(resolve)), sleep(1_000)]);
      if (this.#stopped || !payload.isRunning() || payload.isStale()) return false;
      await payload.heartbeat().catch(() => undefined);
    }
    return true;
  }

  #release(): void {
    this.#buffered -= 1;
    this.#roomWaiters.shift()?.();
  }

  #take(state: PartitionState, offset: number, message: KafkaMessage): void {
    const headers = headerText(message.headers);
    const attempt = Number(headers[HEADERS.attempt] ?? '1');
    const key = message.key === null ? null : message.key.toString('utf8');
    const ordered = this.#endpoint.ordered && key !== null && state.topic !== this.#parts.retryTopic;
    const item: Item = { state, offset, message, headers, attempt: Number.isInteger(attempt) && attempt > 0 ? attempt : 1, orderKey: ordered ? `${state.topic}\0${key}` : undefined };
    const due = Number(headers[HEADERS.retryAt] ?? '0');
    if (state.topic === this.#parts.retryTopic && due > Date.now()) {
      // A retry copy waits in memory for its time, holding no handler slot and blocking nothing.
      this.#retryWaiting += 1;
      this.#waiting.add(item);
      item.timer = setTimeout(() => {
        this.#waiting.delete(item);
        this.#retryWaiting -= 1;
        this.#resumeRetries();
        this.#enqueue(item);
      }, due - Date.now());
      if (this.#retryWaiting >= this.#parts.maxRetryWaiting && !this.#retryPaused) {
        this.#retryPaused = true;
        this.#parts.consumer.pause([{ topic: this.#parts.retryTopic }]);
      }
      return;
    }
    if (item.orderKey !== undefined) {
      const queue = this.#keys.get(item.orderKey);
      if (queue) {
        queue.push(item);
        return;
      }
      this.#keys.set(item.orderKey, [item]);
    }
    this.#enqueue(item);
  }

  #resumeRetries(): void {
    if (this.#retryPaused && this.#retryWaiting < this.#parts.maxRetryWaiting / 2) {
      this.#retryPaused = false;
      this.#parts.consumer.resume([{ topic: this.#parts.retryTopic }]);
    }
  }

  #enqueue(item: Item): void {
    if (this.#stopped) return;
    this.#ready.push(item);
    this.#pump();
  }

  #pump(): void {
    while (this.#active < this.#endpoint.concurrency && this.#ready.length > 0 && !this.#stopped) {
      const item = this.#ready.shift()!;
      if (item.dropped || this.#drop(item)) continue;
      this.#active += 1;
      this.#runningItems.add(item);
      const run = this.#run(item).finally(() => {
        this.#active -= 1;
        this.#runningItems.delete(item);
        this.#running.delete(run);
        this.#pump();
      });
      this.#running.add(run);
    }
  }

  async #run(item: Item): Promise<void> {
    let envelope: Envelope;
    try {
      envelope = decodeRecord(item.message.key, item.message.value, item.headers);
    } catch (error) {
      try {
        await this.#deadLetter(item, { code: 'ENVELOPE_INVALID', message: describe(error) });
      } catch (failed) {
        this.#giveBack(item, failed);
      }
      return;
    }
    let settled = false;
    // A retry or dead letter whose copy the broker did not take has settled nothing: the
    // record is still in hand, and a later settle of it is taken (the Delivery contract).
    // An ack has finished the record here even when its commit failed (the next commit
    // carries it), so it stays settled.
    const once = async (action: () => Promise<void>, undoOnFailure: boolean): Promise<void> => {
      if (settled) return;
      settled = true;
      try {
        await action();
      } catch (error) {
        if (undoOnFailure) settled = false;
        throw error;
      }
    };
    const delivery: Delivery = {
      envelope,
      attempt: item.attempt,
      redelivered: item.offset < item.state.suspectBelow || (item.givenBack ?? 0) > 0,
      ...(item.headers[HEADERS.replayed] === '1' ? { replayed: true } : {}),
      ack: () => once(() => this.#finish(item), false),
      retry: (delayMs, reason) => once(() => this.#retry(item, delayMs, reason), true),
      deadLetter: (reason) => once(() => this.#deadLetter(item, reason), true),
    };
    let failure: unknown;
    await this.#handler(delivery).catch((error: unknown) => {
      failure = error;
    });
    // Nothing settled it: a record left in hand would stop its key and the partition's
    // commit point until a rebalance, so it is handed back to run again.
    if (!settled) this.#giveBack(item, failure ?? new Error('the handler returned without settling the delivery'));
  }

  /**
   * Hands a record whose run left it unsettled back to run again, after 1 s doubling to 30 s
   * per time it was handed back, flagged `redelivered`; it keeps its place in its key (ordered)
   * and holds the partition's commit point meanwhile. Logged as an error each time.
   */
  #giveBack(item: Item, cause: unknown): void {
    if (this.#stopped) return;
    item.givenBack = (item.givenBack ?? 0) + 1;
    const delayMs = backoffDelay(GIVE_BACK_BACKOFF, item.givenBack);
    this.#parts.logger.error('kafka record left unsettled by its run (its retry or dead letter failed, or nothing settled it); handed back to run again', {
      consumer: this.#endpoint.consumer,
      record: `${item.state.topic}[${item.state.partition}]@${item.offset}`,
      delayMs,
      times: item.givenBack,
      error: describeError(cause),
    });
    item.handingBack = true;
    this.#waiting.add(item);
    item.timer = setTimeout(() => {
      this.#waiting.delete(item);
      item.handingBack = false;
      if (this.#stopped) return;
      if (item.state.revoked) {
        // Its partition went to another member, which has it: leave the front of its key.
        if (!item.dropped) {
          item.dropped = true;
          this.#release();
        }
        this.#nextOfKey(item);
        return;
      }
      this.#enqueue(item);
    }, delayMs);
  }

  /** The record is done: the next of its key may run, and the partition's commit point may move. */
  async #finish(item: Item): Promise<void> {
    const { state } = item;
    state.unfinished.delete(item.offset);
    this.#release();
    this.#nextOfKey(item);
    await this.#commit(state);
  }

  /** Takes `item` from the front of its key's queue (ordered endpoints) and starts the record behind it. */
  #nextOfKey(item: Item): void {
    if (item.orderKey === undefined) return;
    const queue = this.#keys.get(item.orderKey);
    if (!queue || queue[0] !== item) return;
    queue.shift();
    if (queue.length > 0) this.#enqueue(queue[0]!);
    else this.#keys.delete(item.orderKey);
  }

  /**
   * Commits the partition up to its lowest unfinished record (never past work in hand), with
   * its in-hand mark as the commit's metadata (every commit replaces the metadata, so every
   * one carries the mark); nothing when neither moved.
   */
  #commit(state: PartitionState): Promise<void> {
    state.commits = state.commits.then(async () => {
      if (state.revoked) return;
      const point = Math.max(state.committed, state.unfinished.size === 0 ? state.next : Math.min(...state.unfinished));
      const mark = state.mark;
      if (point === state.committed && mark <= state.markCommitted) return;
      try {
        await this.#parts.consumer.commitOffsets([{ topic: state.topic, partition: state.partition, offset: String(point), metadata: `${IN_HAND}${mark}` }]);
        state.committed = point;
        state.markCommitted = Math.max(state.markCommitted, mark);
      } catch (error) {
        // Lost the partition or the broker: uncommitted work comes again and the inbox drops the copies.
        throw new TransportError(`could not commit ${state.topic}[${state.partition}]@${point}: ${describe(error)}`, { cause: error, retriable: true });
      }
    });
    const done = state.commits;
    state.commits = state.commits.catch(() => undefined);
    return done;
  }

  async #retry(item: Item, delayMs: number, reason: DeadLetterReason): Promise<void> {
    void reason;
    if (item.orderKey !== undefined) {
      // In place: the key waits (its queue keeps this record in front); the slot is free.
      this.#waiting.add(item);
      item.timer = setTimeout(() => {
        this.#waiting.delete(item);
        if (this.#stopped) return;
        if (item.state.revoked) {
          // Its partition was taken away while it was running (so it stayed in front of its
          // key then): the new owner has it. It leaves the front now, or the records of its
          // key that come again, should the partition come back here, would wait behind it forever.
          if (!item.dropped) {
            item.dropped = true;
            this.#release();
          }
          this.#nextOfKey(item);
          return;
        }
        item.attempt += 1;
        this.#enqueue(item);
      }, Math.max(0, delayMs));
      return;
    }
    const envelope = decodeRecord(item.message.key, item.message.value, item.headers);
    await this.#parts.publishCopy(
      this.#parts.retryTopic,
      encodeRecord(envelope, {
        [HEADERS.attempt]: String(item.attempt + 1),
        [HEADERS.retryAt]: String(Date.now() + Math.max(0, delayMs)),
        ...(item.headers[HEADERS.replayed] === '1' ? { [HEADERS.replayed]: '1' } : {}),
      }),
    );
    await this.#finishCopied(item);
  }

  /**
   * Finishes a record whose copy (retry, dead letter) the broker has acknowledged. A commit
   * that fails now fails nothing: the record is done here and the next commit carries it
   * (a crash first redelivers it, and the inbox drops the copy). Rejecting would have the
   * core ask for a second copy.
   */
  async #finishCopied(item: Item): Promise<void> {
    await this.#finish(item).catch((error: unknown) => {
      this.#parts.logger.warn('kafka commit after a settled copy failed; the next commit carries it', { consumer: this.#endpoint.consumer, error: describeError(error) });
    });
  }

  async #deadLetter(item: Item, reason: DeadLetterReason): Promise<void> {
    const id = `${item.state.topic}:${item.state.partition}:${item.offset}`;
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(item.headers)) {
      if (name !== HEADERS.retryAt && name !== HEADERS.replayed) headers[name] = value;
    }
    headers[HEADERS.attempt] = String(item.attempt);
    headers[HEADERS.deadCode] = reason.code;
    headers[HEADERS.deadMessage] = reason.message;
    headers[HEADERS.deadAt] = String(Date.now());
    headers[HEADERS.origin] = id;
    // The dead-letter record's key is its id (compaction keeps the latest per id); the original key travels in a header.
    if (item.message.key === null) headers['courier-dead-key-null'] = '1';
    else headers['courier-dead-key'] = item.message.key.toString('base64');
    const value = item.message.value === null ? '' : item.message.value.toString('utf8');
    try {
      await this.#parts.publishCopy(this.#parts.deadLetterTopic, { key: id, value, headers });
    } catch (error) {
      const type = protocolType(error);
      if (type === undefined || !CONTENT_ERRORS.has(type) || Buffer.byteLength(reason.message, 'utf8') <= DEAD_REASON_CUT_BYTES) throw error;
      // Refused for its size: the reason text is what a dead letter adds to a record the
      // broker took, so a copy with the reason cut still carries the whole message. Should
      // that be refused too (a dead-letter topic configured smaller), the settle fails and
      // the core asks the record back, to be dead-lettered again later (logged, counted).
      headers[HEADERS.deadMessage] = cutUtf8(reason.message, DEAD_REASON_CUT_BYTES);
      headers[HEADERS.deadMessageBytes] = String(Buffer.byteLength(reason.message, 'utf8'));
      this.#parts.logger.warn('kafka refused a dead letter for its size; writing it with the reason cut', {
        consumer: this.#endpoint.consumer,
        record: id,
        error: describeError(error),
      });
      await this.#parts.publishCopy(this.#parts.deadLetterTopic, { key: id, value, headers });
    }
    await this.#finishCopied(item);
  }
}
