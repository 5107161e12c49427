import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { ClosedError, ConfigError, StorageError, inboxStatsFromCounts, type InboxResult, type InboxRunOptions, type InboxStats, type InboxStore } from '@courier/core';
import { RedisInboxKeys } from './redis-keys.js';
import { CLAIM, COMPLETE, COUNT, FORGET, PRUNE, RECORD_START, RELEASE, RENEW, type LuaScript, type RedisInboxClient } from './redis-scripts.js';

/**
 * What a handler's unit of work is told about its run: the pair it runs for, and a signal
 * that aborts when the run's claim is lost (not renewed in time, taken by another claimant)
 * or the caller's signal aborts. Pass `messageId` as the idempotency key of any effect
 * outside Courier's stores (see the README): the record is written after the work.
 */
export interface RedisInboxUnit {
  readonly messageId: string;
  readonly consumer: string;
  readonly signal: AbortSignal;
}

/** Opens the handler's unit of work (a database transaction, say) around `work`; its commit is the effects'. */
export type RedisInboxUnitOfWork<Tx> = <T>(work: (tx: Tx) => Promise<T>, unit: RedisInboxUnit) => Promise<T>;

/** Arguments of {@link RedisInboxStore}. */
export interface RedisInboxStoreConfig<Tx> {
  /** The application's ioredis client (standalone or Sentinel). The store never closes it. */
  readonly redis: RedisInboxClient;
  /** Prefix of every key the store writes. Default `courier:inbox:`. Stores that share a prefix share records. */
  readonly prefix?: string;
  /**
   * Length of a claim, renewed while the work runs (ms). A claimant that dies is replaced
   * after at most this long. Default 30 s; at least 1 s.
   */
  readonly claimMs?: number;
  /** How often a running claim is renewed (ms). Default a third of `claimMs`; less than `claimMs`. */
  readonly renewEveryMs?: number;
  /**
   * How long a completion record is kept (ms): the deduplication window. Default 7 days;
   * at least `claimMs`. Every store sharing a prefix must use the same value.
   */
  readonly retentionMs?: number;
  /** Longest wait between two looks at a claim another run holds (ms). Default 250. */
  readonly pollMs?: number;
  /**
   * Opens the unit of work `work` runs in, e.g. `(work) => orm.em.fork().transactional(work)`,
   * so the handler's database effects and outbox rows commit together (before the record).
   * Without it, `work` gets a {@link RedisInboxUnit}.
   */
  readonly unitOfWork?: RedisInboxUnitOfWork<Tx>;
}

const DAY_MS = 86_400_000;
const DEFAULTS = { prefix: 'courier:inbox:', claimMs: 30_000, retentionMs: 7 * DAY_MS, pollMs: 250 };
/** Longest prefix accepted (UTF-8 bytes): keys stay short whatever the ids (see `keyPart`). */
const PREFIX_BYTES = 100;

/**
 * An {@link InboxStore} on Redis, for consumers whose effects are not in a SQL database
 * (a payment provider, an e-mail, a Redis-only service).
 *
 * Guarantees:
 * - Before `work`, one claim per (consumer, messageId) is taken atomically (Lua: the key is
 *   set only when absent, with a `claimMs` expiry) and renewed every `renewEveryMs` while
 *   `work` runs. A run that finds the pair claimed by another waits until that one ends: a
 *   completion makes it a duplicate, a failure or an expired claim (a dead claimant) lets
 *   it claim. So two runs of one pair never run `work` at once while their claimant lives.
 * - After `work` resolves (and the `unitOfWork` committed), the claim becomes a completion
 *   record kept `retentionMs`; later runs return `{ duplicate: true }` without running.
 *   Completion is fenced by a random token: a run whose claim another claimant took cannot
 *   complete (it throws a `StorageError`, after its work ran, so the message is retried and
 *   then found a duplicate).
 * - If `work` throws, the claim is released and nothing is recorded.
 * - Not transactional with the effects ({@link recordCommitsWithEffects} is false): if the
 *   process dies after the effects and before the record, the message runs again once its
 *   claim expires. Give outside effects `messageId` as their idempotency key.
 * - No halts ({@link InboxHalts}): ordered subscriptions with the `halt` poison policy need
 *   a SQL inbox store.
 * - Keys are `<prefix>` + short parts; ids over 80 UTF-8 bytes are hashed (SHA-256), so a
 *   key is at most the prefix and 180 bytes. Clock comparisons use the Redis clock.
 */
export class RedisInboxStore<Tx = RedisInboxUnit> implements InboxStore<Tx> {
  /** The record is written after the unit of work commits, not in it. */
  readonly recordCommitsWithEffects = false;
  readonly #redis: RedisInboxClient;
  readonly #keys: RedisInboxKeys;
  readonly #claimMs: number;
  readonly #renewEveryMs: number;
  readonly #retentionMs: number;
  readonly #pollMs: number;
  readonly #unitOfWork: RedisInboxUnitOfWork<Tx> | undefined;
  readonly #running = new Set<Promise<unknown>>();
  #closed = false;

  constructor(config: RedisInboxStoreConfig<Tx>) {
    const problems: string[] = [];
    const redis = config?.redis as Partial<RedisInboxClient> | undefined;
    if (!redis || typeof redis.evalsha !== 'function' || typeof redis.eval !== 'function' || typeof redis.smembers !== 'function') {
      problems.push(`'redis' must be an ioredis client (with eval, evalsha and smembers)`);
    }
    const prefix = config?.prefix ?? DEFAULTS.prefix;
    if (typeof prefix !== 'string' || prefix.length === 0 || Buffer.byteLength(prefix) > PREFIX_BYTES) {
      problems.push(`'prefix' must be a non-empty string of at most ${PREFIX_BYTES} UTF-8 bytes, got ${JSON.stringify(prefix)?.slice(0, 120)}`);
    }
    const claimMs = config?.claimMs ?? DEFAULTS.claimMs;
    if (!Number.isInteger(claimMs) || claimMs < 1_000) problems.push(`'claimMs' must be an integer of at least 1000, got ${String(claimMs)}`);
    const renewEveryMs = config?.renewEveryMs ?? Math.floor(claimMs / 3);
    if (!Number.isInteger(renewEveryMs) || renewEveryMs < 1 || renewEveryMs >= claimMs) {
      problems.push(`'renewEveryMs' must be a positive integer less than 'claimMs' (${String(claimMs)}), got ${String(renewEveryMs)}`);
    }
    const retentionMs = config?.retentionMs ?? DEFAULTS.retentionMs;
    if (!Number.isInteger(retentionMs) || retentionMs < claimMs) problems.push(`'retentionMs' must be an integer of at least 'claimMs' (${String(claimMs)}), got ${String(retentionMs)}`);
    const pollMs = config?.pollMs ?? DEFAULTS.pollMs;
    if (!Number.isInteger(pollMs) || pollMs < 1) problems.push(`'pollMs' must be a positive integer, got ${String(pollMs)}`);
    if (config?.unitOfWork !== undefined && typeof config.unitOfWork !== 'function') problems.push(`'unitOfWork' must be a function`);
    if (problems.length > 0) throw new ConfigError(problems.map((problem) => `RedisInboxStore: ${problem}`));
    this.#redis = config.redis;
    this.#keys = new RedisInboxKeys(prefix);
    this.#claimMs = claimMs;
    this.#renewEveryMs = renewEveryMs;
    this.#retentionMs = retentionMs;
    this.#pollMs = pollMs;
    this.#unitOfWork = config.unitOfWork;
  }

  /** Runs `work` once per (messageId, consumer) within the retention (see the class guarantees). */
  async run<T>(messageId: string, consumer: string, work: (tx: Tx) => Promise<T>, options: InboxRunOptions = {}): Promise<InboxResult<T>> {
    this.#ready('run');
    const running = this.#run(messageId, consumer, work, options);
    this.#running.add(running);
    try {
      return await running;
    } finally {
      this.#running.delete(running);
    }
  }

  async #run<T>(messageId: string, consumer: string, work: (tx: Tx) => Promise<T>, options: InboxRunOptions): Promise<InboxResult<T>> {
    const { signal } = options;
    const record = this.#keys.record(consumer, messageId);
    const token = randomUUID();
    let waitMs = 10;
    for (;;) {
      signal?.throwIfAborted();
      const [state, pttl] = (await this.#call('claim', CLAIM, [record], [token, this.#claimMs])) as [string, number];
      if (state === 'done') return { duplicate: true };
      if (state === 'claimed') break;
      // Another run holds the claim: wait for it to end (or expire), backing off.
      const ttl = pttl > 0 ? pttl : waitMs;
      await sleep(Math.min(waitMs, ttl + 1), undefined, signal ? { signal } : undefined);
      waitMs = Math.min(waitMs * 2, this.#pollMs);
    }
    const lost = new AbortController();
    const unit: RedisInboxUnit = { messageId, consumer, signal: signal ? AbortSignal.any([signal, lost.signal]) : lost.signal };
    const stopRenewing = this.#renew(record, token, lost);
    let value: T;
    try {
      value = this.#unitOfWork ? await this.#unitOfWork(work, unit) : await work(unit as Tx);
    } catch (error) {
      stopRenewing();
      // Best effort: if it fails the claim simply expires and the next run waits until then.
      await RELEASE.run(this.#redis, [record], [token]).catch(() => undefined);
      throw error;
    }
    stopRenewing();
    const outcome = await this.#call('complete', COMPLETE, [record, this.#keys.index(consumer), this.#keys.consumers, this.#keys.starts(consumer, messageId)], [
      token,
      this.#retentionMs,
      consumer,
    ]);
    if (outcome === 'taken') {
      throw new StorageError(
        `inbox claim of message '${messageId}' for consumer '${consumer}' was lost while its work ran (not renewed within ${this.#claimMs} ms) and another run holds it now: the work may have run twice; not recorded`,
      );
    }
    return { duplicate: false, value };
  }

  /** Renews the claim until stopped; aborts `lost` once the claim is someone else's or could not be renewed in time. */
  #renew(record: string, token: string, lost: AbortController): () => void {
    let renewedAt = Date.now();
    let inFlight = false;
    const timer = setInterval(() => {
      if (inFlight || lost.signal.aborted) return;
      inFlight = true;
      RENEW.run(this.#redis, [record], [token, this.#claimMs]).then(
        (renewed) => {
          inFlight = false;
          if (renewed === 1) renewedAt = Date.now();
          else lost.abort(new StorageError(`inbox claim '${record}' was lost: another run may hold it`));
        },
        (error: unknown) => {
          inFlight = false;
          if (Date.now() - renewedAt >= this.#claimMs) lost.abort(new StorageError(`inbox claim '${record}' could not be renewed for ${this.#claimMs} ms`, { cause: error, retriable: true }));
        },
      );
    }, this.#renewEveryMs);
    return () => clearInterval(timer);
  }

  /** Counts one more start of (messageId, consumer) and returns the total; the count expires with the retention. */
  async recordStart(messageId: string, consumer: string): Promise<number> {
    this.#ready('recordStart');
    return Number(await this.#call('recordStart', RECORD_START, [this.#keys.starts(consumer, messageId)], [this.#retentionMs]));
  }

  /** Deletes the completion record and start count of (messageId, consumer); true when a record existed. A claim in progress is left alone. */
  async forget(messageId: string, consumer: string): Promise<boolean> {
    this.#ready('forget');
    const keys = [this.#keys.record(consumer, messageId), this.#keys.index(consumer), this.#keys.starts(consumer, messageId)];
    return (await this.#call('forget', FORGET, keys, [])) === 1;
  }

  /**
   * Deletes completion records made at least `olderThanMs` ago (Redis clock), at most
   * `batchSize` (default 500) per script call per consumer name; returns how many. Records
   * also expire by themselves after the retention: this ends the window earlier.
   */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    this.#ready('prune');
    const batchSize = options.batchSize ?? 500;
    if (!Number.isInteger(olderThanMs) || olderThanMs < 0) throw new ConfigError(`prune: 'olderThanMs' must be a non-negative integer, got ${String(olderThanMs)}`);
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new ConfigError(`prune: 'batchSize' must be a positive integer, got ${String(batchSize)}`);
    let deleted = 0;
    for (const name of await this.#names()) {
      for (;;) {
        options.signal?.throwIfAborted();
        const [removed, examined] = (await this.#call('prune', PRUNE, [this.#keys.index(name), this.#keys.consumers], [olderThanMs, batchSize, name])) as [number, number];
        deleted += removed;
        if (examined < batchSize) break;
      }
    }
    return deleted;
  }

  /** Per consumer: live records, the age of the oldest (Redis clock) and dead-letter marks. One short script per consumer name. */
  async stats(options: { signal?: AbortSignal } = {}): Promise<InboxStats> {
    this.#ready('stats');
    const counts = [];
    for (const name of await this.#names()) {
      options.signal?.throwIfAborted();
      const [records, oldestAgeMs] = (await this.#call('stats', COUNT, [this.#keys.index(name)], [this.#retentionMs])) as [number, number];
      if (records > 0) counts.push({ name, records, oldestAgeMs });
    }
    return inboxStatsFromCounts(counts);
  }

  /** Stops accepting calls and waits for runs in progress. Idempotent; the Redis client stays open (it is the caller's). */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.allSettled([...this.#running]);
  }

  /** `await using` support: the same as {@link close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #names(): Promise<string[]> {
    try {
      return (await this.#redis.smembers(this.#keys.consumers)).sort();
    } catch (error) {
      throw storageError('list consumers', error);
    }
  }

  async #call(what: string, script: LuaScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await script.run(this.#redis, keys, args);
    } catch (error) {
      throw storageError(what, error);
    }
  }

  #ready(operation: string): void {
    if (this.#closed) throw new ClosedError(`RedisInboxStore.${operation}`);
  }
}

/** A Redis failure as a `StorageError`: retriable unless Redis answered with an error reply (a script or type error will not mend). */
function storageError(what: string, error: unknown): StorageError {
  const replied = error instanceof Error && error.name === 'ReplyError';
  return new StorageError(`redis inbox ${what} failed: ${error instanceof Error ? error.message : String(error)}`, { cause: error, retriable: !replied });
}
