import { SpanKind, type Tracer } from '@opentelemetry/api';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import type { PoisonPolicy, RelayConfig } from './bus-types.js';
import type { Envelope } from './envelope.js';
import { CourierError, describeError, isRetriable } from './errors.js';
import type { FaultContext, FaultHook, FaultPoint } from './fault-points.js';
import { aborted, sleep, Waker, withTimeout } from './internal/async.js';
import { linkSignals } from './signals.js';
import type { Logger } from './logger.js';
import { FAILURE_DETAIL_LIMITS, type ClaimedBatch, type ClaimOptions, type FailureDetail, type OutboxFailure, type OutboxLease, type OutboxRecord, type OutboxStore, type PendingCompletion } from './outbox-store.js';
import { backoffDelay, retryPolicy, type RetryPolicy } from './retry.js';
import type { Instruments } from './telemetry.js';
import { inSpan, traceLinks } from './telemetry.js';
import { ROOT_CONTEXT } from '@opentelemetry/api';
import { TopicAttributes, type DurationHistograms } from './timed-transport.js';
import type { PublishResult, Transport } from './transport.js';
import { boundReasonText } from './reason-text.js';

/** The relay logs failed attempts of one topic at most this often (the rest are counted into the next line). */
const FAILED_ATTEMPT_LOG_INTERVAL_MS = 10_000;
/** `courier.relay.pauses` attributes: what made the relay pause (two values). */
const PAUSED_BY_STORE = Object.freeze({ 'courier.pause.cause': 'store' });
const PAUSED_BY_TRANSPORT = Object.freeze({ 'courier.pause.cause': 'transport' });

/**
 * Result codes a transport uses for trouble that is not the message's fault (the
 * connection dropped, the broker did not answer in time, a destination refused it for
 * lack of room — `PUBLISH_BACKPRESSURE`): such messages are released without counting an
 * attempt, and the relay pauses with backoff. So nothing is dead-lettered because the
 * broker was down or a consumer's queue was full; the messages go out once it drains.
 */
export const CONNECTIVITY_CODES: ReadonlySet<string> = new Set(['TRANSPORT', 'PUBLISH_TIMEOUT', 'PUBLISH_BACKPRESSURE', 'CLOSED']);

/**
 * Result code of a message the transport never sent because the relay's signal aborted
 * first (the relay is stopping, or its sending deadline passed): released without an attempt.
 */
const NOT_SENT_CODE = 'ABORTED';

/**
 * Share of the lease that may pass between a claim and the last answer of its batch; the
 * rest covers the complete and clock drift between the database and this process.
 */
const LEASE_BUDGET = 0.8;

/**
 * Largest share of the lease a transport's declared publish timeout may take
 * (`TransportCapabilities.publishTimeoutMs`) when the store cannot renew leases: the bus
 * refuses a configuration that breaks it.
 */
export const PUBLISH_TIMEOUT_LEASE_SHARE = 0.5;

/**
 * Default lease when the store renews leases (`OutboxStore.renew`): the relay renews it
 * every third of its length while a batch is in hand, so it only has to outlast two missed
 * renewals, and a relay that dies hands its keys over within about this long.
 */
export const DEFAULT_RENEWED_LEASE_MS = 5_000;

/** Default lease when the store cannot renew: it must cover a whole batch, slow confirms included. */
export const DEFAULT_FIXED_LEASE_MS = 30_000;

/** Renewals per lease length while a batch is in hand. */
const RENEWALS_PER_LEASE = 3;

/**
 * Default `relay.batchSize`: rows per claim. Each of the {@link RELAY_LOOPS} loops holds its
 * batch until the slowest of its confirms, so what the relay hands the transport at once is
 * about loops × batch, less whatever the loops are claiming meanwhile. A broker client keeps
 * a confirm window (RabbitMQ's transport: 256 unconfirmed messages); with batches of 100 the
 * window ran part-empty whenever two or three loops were between batches (bench/README.md,
 * "Relay batch size and loops": 100 reached a median 0.69 of a plain publish loop, 250 0.83).
 *
 * 500 since issue 40: a claim and a completion cost about one round trip and one planning
 * whatever their rows. Against 250, in interleaved 50,000-row runs beside the textbook relay
 * (which also runs at 500): under load (5–13) the relay's CPU per message fell 10–11 % and
 * its PostgreSQL backends' 9–14 % (medians; lower in 6 of 8 rounds); on a quiet machine the
 * relay's was equal and its backends' 7 % lower; the drain's median ratio to the textbook
 * relay rose in all three runs (0.71 → 0.89, 0.99 → 1.18, quiet 0.71 → 0.80). Idle commit → confirm did not get
 * worse (8 alternated runs each: p50 median 4.8 against 5.2 ms, p99 22 against 27 ms), nor
 * the relay-only process's peak RSS (117–121 against 117–118 MB through tsx): bench/README.md,
 * "Issue 40: the textbook relay". What a larger batch costs: more rows held under one lease
 * (without renewals a batch queued behind the window must still be answered within it: 4 ×
 * 500 at 1,000 msg/s is 2 s of the 30 s default), a later confirm for a batch's last rows, and
 * up to loops × batch envelopes in memory — not order, which does not depend on it (one head
 * per key per claim unless the transport declares ordered pipelining).
 */
export const DEFAULT_RELAY_BATCH_SIZE = 500;

/**
 * Claim → publish → complete cycles one relay runs at once. While one batch waits for its
 * confirms, others are claimed and sent, so the broker's confirm latency and the
 * database's round trips overlap instead of adding up. Safe because the claims of one
 * relay are as disjoint as those of several relays (SKIP LOCKED, leases), and a key's
 * next row is not claimable while its head is in flight. One loop answers wake-ups; the
 * others join only while there is more than it can take (a full batch, or a wake-up
 * while it is busy), so an idle relay does not multiply empty claims.
 */
export const RELAY_LOOPS = 4;

/** Everything the relay needs from its bus. */
export interface RelayDependencies<Tx> {
  readonly store: OutboxStore<Tx>;
  readonly transport: Transport;
  readonly logger: Logger;
  readonly instruments: Instruments;
  readonly tracer: Tracer;
  readonly fault: (point: FaultPoint, context: FaultContext) => Promise<void>;
  readonly onKeyHalted?: (topic: string, key: string, error: string) => void;
  /** Where the commit → confirm latency of each confirmed row is recorded (when the store gives `ageMs`). */
  readonly durations?: DurationHistograms;
}

/** The relay's resolved settings. */
export interface RelaySettings {
  readonly batchSize: number;
  readonly leaseMs: number;
  readonly pollIntervalMs: number;
  readonly retry: RetryPolicy;
  readonly pauseInitialMs: number;
  readonly pauseMaxMs: number;
  readonly poison: PoisonPolicy;
  readonly owner: string;
}

/**
 * Resolves relay settings, listing every problem. `publishTimeoutMs` is the transport's
 * declared publish timeout; `renews` says whether the store renews leases. Without
 * renewals the lease must be at least twice the publish timeout, or a confirm that comes
 * late would find its rows re-claimed and sent again; with them the relay keeps its lease
 * for as long as it waits, so the lease need only outlast missed renewals.
 */
export function relaySettings(config: RelayConfig = {}, publishTimeoutMs?: number, renews = false): { settings?: RelaySettings; problems: string[] } {
  const problems: string[] = [];
  const positive = (name: string, value: number | undefined, fallback: number): number => {
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) problems.push(`'relay.${name}' must be a positive number`);
    return value;
  };
  const batchSize = positive('batchSize', config.batchSize, DEFAULT_RELAY_BATCH_SIZE);
  if (!Number.isSafeInteger(batchSize)) problems.push(`'relay.batchSize' must be an integer`);
  const leaseMs = positive('leaseMs', config.leaseMs, renews ? DEFAULT_RENEWED_LEASE_MS : DEFAULT_FIXED_LEASE_MS);
  const pollIntervalMs = positive('pollIntervalMs', config.pollIntervalMs, 1_000);
  const pauseInitialMs = positive('pause.initialDelayMs', config.pause?.initialDelayMs, 100);
  const pauseMaxMs = positive('pause.maxDelayMs', config.pause?.maxDelayMs, 5_000);
  if (!renews && publishTimeoutMs !== undefined && Number.isFinite(leaseMs) && leaseMs > 0 && !(publishTimeoutMs <= leaseMs * PUBLISH_TIMEOUT_LEASE_SHARE)) {
    problems.push(
      `'relay.leaseMs' (${leaseMs} ms) must be at least twice the transport's publish timeout (${publishTimeoutMs} ms), ` +
        `or a late confirm is re-claimed and sent again: raise 'relay.leaseMs', lower the transport's publish timeout, or use a store that renews leases`,
    );
  }
  const poison = config.poison ?? 'park';
  if (poison !== 'park' && poison !== 'halt') problems.push(`'relay.poison' must be 'park' or 'halt'`);
  let retry: RetryPolicy | undefined;
  try {
    retry = retryPolicy(config.retry, 'relay.retry');
  } catch (error) {
    problems.push(...((error as { problems?: string[] }).problems ?? [describeError(error)]));
  }
  if (problems.length > 0 || retry === undefined) return { problems };
  const owner = config.owner ?? `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;
  return { settings: { batchSize, leaseMs, pollIntervalMs, retry, pauseInitialMs, pauseMaxMs, poison, owner }, problems };
}

/** A lease the relay holds on a batch it is sending, as `bus.health()` reports it. */
export interface RelayLease {
  /** The lease's fencing token (the store's `lease_token` column, decimal). */
  readonly token: string;
  /** Rows claimed under it. */
  readonly rows: number;
  /** Milliseconds since the claim that took it (this process's clock). */
  readonly heldForMs: number;
}

/** A snapshot of the relay's state for `bus.health()`. */
export interface RelayHealth {
  readonly running: boolean;
  readonly paused: boolean;
  readonly lastError: string | null;
  readonly sinceLastClaimMs: number;
  /** The name the relay claims under (the store's `lease_owner` column): `relay.owner`, or host:pid:random. */
  readonly owner: string;
  /** The leases on batches it is sending now, oldest first; empty between batches. */
  readonly leases: readonly RelayLease[];
}

/**
 * Moves committed outbox rows to the broker: claim under a lease, publish, complete
 * only what the broker confirmed.
 *
 * Guarantees:
 * - at-least-once: a row is marked published only after its confirm; any crash before
 *   that leaves it to be claimed again when the lease expires;
 * - per-key order: claims take a key's head only (or a contiguous run when the transport
 *   declares ordered pipelining), so at most one unconfirmed message per key otherwise;
 * - a transport or store that is down pauses the relay with capped backoff and counts no
 *   attempts; attempts count only failures the transport attributes to the message, never
 *   a per-message connectivity result (`CONNECTIVITY_CODES`) or a message not sent (`ABORTED`);
 * - leases are short and kept only while a batch is in hand, where the store renews them
 *   (`OutboxStore.renew`): the relay renews every third of the lease until the batch is
 *   completed, failed or released; a relay that dies stops renewing, so its keys flow again
 *   about one lease later. When a renewal finds rows re-claimed by another relay, or none
 *   succeeded for most of a lease, nothing more of the batch is sent;
 * - without renewals, every answer of a batch arrives within its lease: nothing is sent
 *   after a deadline that leaves the transport's declared publish timeout before the lease
 *   runs out;
 * - `stop` sends nothing more, completes what the broker confirmed, releases the rest of
 *   its claims without an attempt, and leaves no timer behind;
 * - a head that exhausts its attempts (or is refused as not retriable) is parked (dead,
 *   the key moves on) or halted (the key stops until an operator resumes it).
 */
export class Relay<Tx> {
  readonly #deps: RelayDependencies<Tx>;
  readonly #settings: RelaySettings;
  readonly #waker = new Waker();
  /** Wakes the helper loops (all but the first). */
  readonly #helpers = new Waker();
  /** The commit → confirm histogram's attributes per topic: recorded for every confirmed row. */
  readonly #latencyAttributes = new TopicAttributes({ 'messaging.system': 'courier' });
  #primaryBusy = false;
  /** Aborted by `stop`: claim and send nothing more. */
  #stopping = new AbortController();
  /** Aborted when `stop` times out: abandon the store calls in flight to their leases. */
  #abandon = new AbortController();
  #loop: Promise<void> | undefined;
  #unwatch: (() => Promise<void>) | undefined;
  #paused = false;
  #pauseMs = 0;
  /** Per topic: when a failed attempt was last logged, and how many were not logged since. */
  readonly #failureLog = new Map<string, { at: number; suppressed: number }>();
  #lastError: string | null = null;
  #lastClaimAt = -1;
  /** Batches being sent, by lease token: what `health()` reports as the leases held. */
  readonly #inHand = new Map<bigint, { readonly rows: number; readonly since: number }>();
  /** Told the outcome of the first claim (undefined: it succeeded), then cleared. */
  #firstClaim: ((error: unknown) => void) | undefined;

  constructor(deps: RelayDependencies<Tx>, settings: RelaySettings) {
    this.#deps = deps;
    this.#settings = settings;
  }

  /**
   * Starts the loops (idempotent) and resolves once the first claim has been tried.
   * Subscribes to the store's wake-up signal when it has one.
   *
   * A first claim that fails with a retriable error (the database is down) does not reject:
   * the loops keep claiming with capped backoff and `health()` reports the relay paused with
   * the error. It rejects, loops still running (the caller stops them), when the first claim
   * fails with a non-retriable error (a missing schema) or with any error under `failFast`.
   * A wake-up signal that cannot be set up yet is retried in the background; meanwhile the
   * relay polls.
   */
  async start(options: { readonly failFast?: boolean } = {}): Promise<void> {
    if (this.#loop) return;
    // Counters exist at 0 from the start, so `increase()` sees the first failure too.
    this.#deps.instruments.primeRelay();
    this.#stopping = new AbortController();
    this.#abandon = new AbortController();
    const signal = this.#stopping.signal;
    if (this.#deps.store.watch) await this.#watch(signal);
    const firstClaim = new Promise<unknown>((resolve) => {
      this.#firstClaim = resolve;
    });
    const loops = Array.from({ length: RELAY_LOOPS }, (_, index) => this.#run(index === 0));
    this.#loop = Promise.all(loops).then(() => undefined);
    // Stopped before any claim was tried: nothing to report.
    // `stop` may have come while the wake-up signal was being set up: the loops then end
    // without a claim, and a listener added after the abort would never fire.
    const stopped = aborted(signal).then(() => undefined);
    const error = await Promise.race([firstClaim, stopped]);
    this.#firstClaim = undefined;
    if (error !== undefined && (options.failFast || !isRetriable(error))) throw error;
  }

  /** Subscribes to the store's wake-up signal; a retriable failure is retried in the background. */
  async #watch(signal: AbortSignal): Promise<void> {
    const watch = async (): Promise<boolean> => {
      try {
        const unwatch = await this.#deps.store.watch!(() => this.wake());
        // Stopped meanwhile: `stop` has already looked for something to unwatch.
        if (signal.aborted) await unwatch().catch(() => undefined);
        else this.#unwatch = unwatch;
        return true;
      } catch (error) {
        // Wake-ups are an optimisation: polling still delivers everything.
        this.#deps.logger.warn('outbox wake-up signal unavailable; polling', { error: describeError(error) });
        return !isRetriable(error);
      }
    };
    if (await watch()) return;
    void (async () => {
      let delay = this.#settings.pauseInitialMs;
      while (!signal.aborted) {
        await sleep(delay * (0.5 + Math.random() / 2), signal);
        if (signal.aborted || (await watch())) return;
        delay = Math.min(this.#settings.pauseMaxMs, delay * 2);
      }
    })();
  }

  /** Wakes the relay at once (e.g. after an in-process commit). */
  wake(): void {
    this.#waker.notify();
    if (this.#primaryBusy) this.#helpers.notify();
  }

  /**
   * Stops: sends nothing more, waits (at most `timeoutMs`) for the answers of what was
   * sent, completes what was confirmed and releases the rest without counting an attempt.
   * Store calls still running at the timeout are abandoned: their rows come back when the
   * lease expires.
   */
  async stop(timeoutMs: number): Promise<void> {
    const loop = this.#loop;
    if (!loop) return;
    this.#stopping.abort();
    this.#waker.notify();
    this.#helpers.notify();
    const finished = await withTimeout(loop, timeoutMs);
    if (!finished.done) {
      this.#abandon.abort();
      this.#deps.logger.warn('relay stop timed out; rows in flight come back when their lease expires', { timeoutMs });
    }
    this.#loop = undefined;
    const unwatch = this.#unwatch;
    this.#unwatch = undefined;
    if (unwatch) await unwatch().catch((error: unknown) => this.#deps.logger.warn('outbox unwatch failed', { error: describeError(error) }));
  }

  health(): RelayHealth {
    return {
      running: this.#loop !== undefined,
      paused: this.#paused,
      lastError: this.#lastError,
      sinceLastClaimMs: this.#lastClaimAt < 0 ? -1 : Date.now() - this.#lastClaimAt,
      owner: this.#settings.owner,
      leases: [...this.#inHand].map(([token, held]) => ({ token: String(token), rows: held.rows, heldForMs: Date.now() - held.since })),
    };
  }

  async #run(primary: boolean): Promise<void> {
    const stopping = this.#stopping.signal;
    const { store } = this.#deps;
    // A confirmed batch waiting to be completed with this loop's next claim (one round
    // trip and one commit instead of two), where the store can. It is never more than one
    // claim behind. Taken with a fault hook too: the kill scenarios must run the path
    // production runs, with the hook inside the combined transaction.
    let pending: PendingCompletion | undefined;
    const defer = store.completeAndClaim ? (done: PendingCompletion) => void (pending = done) : undefined;
    const beforeCommit = this.#beforeCommit();
    if (primary) this.#primaryBusy = true;
    while (!stopping.aborted) {
      try {
        await this.#deps.fault('database-restart', { messageIds: [] });
        const claimedAt = Date.now();
        const options: ClaimOptions = {
          owner: this.#settings.owner,
          limit: this.#settings.batchSize,
          leaseMs: this.#settings.leaseMs,
          perKey: this.#deps.transport.capabilities.orderedPipelining ? this.#settings.batchSize : 1,
          // Not `stopping`: a claim cut short could still take rows this loop would then not
          // know to release; a claim that finishes during a stop is released in #process.
          signal: this.#abandon.signal,
        };
        let batch: ClaimedBatch;
        let completedNow = false;
        if (pending) {
          const done = pending;
          // Kept until a claim succeeds: a failed one may or may not have completed it, and
          // completing again changes nothing (only pending rows of the lease are touched).
          const result = await store.completeAndClaim!(done, beforeCommit ? { ...options, beforeCommit } : options);
          pending = undefined;
          this.#completed(done.sequences.length, result.completed);
          completedNow = result.completed > 0;
          batch = result;
        } else {
          batch = await store.claim(options);
        }
        this.#lastClaimAt = Date.now();
        this.#firstClaim?.(undefined);
        // A full batch means more may be due: the helper loops claim too.
        if (batch.records.length >= this.#settings.batchSize) this.#helpers.notify();
        if (batch.records.length === 0) {
          if (this.#paused) this.#resume();
          // The completion may have made a key's next row claimable, which a claim reading
          // from before it cannot see: look once more before sleeping.
          if (completedNow) continue;
          if (primary) this.#primaryBusy = false;
          await (primary ? this.#waker : this.#helpers).wait(this.#settings.pollIntervalMs, stopping);
          if (primary) this.#primaryBusy = true;
          continue;
        }
        const transportOk = await this.#process(batch, claimedAt, defer);
        if (transportOk) this.#resume();
        else {
          // Nothing renews confirmed rows waiting for the next claim, and a pause may
          // outlast their lease: complete them first, or another relay sends them again.
          if (pending && (await this.#completePending(pending, beforeCommit, 'before pausing'))) pending = undefined;
          await this.#pause();
        }
      } catch (error) {
        if (stopping.aborted) break;
        this.#firstClaim?.(error);
        this.#lastError = describeError(error);
        this.#deps.instruments.relayPauses.add(1, PAUSED_BY_STORE);
        this.#deps.logger.warn('relay cycle failed; pausing', { error: this.#lastError });
        // Confirmed rows still pending stay for the next claim: the store itself failed, so
        // a separate complete now would most likely fail as well.
        await this.#pause();
      }
    }
    // Stopping: what the broker confirmed is completed now, not left to its lease.
    const done = pending as PendingCompletion | undefined;
    if (done) await this.#completePending(done, beforeCommit, 'while stopping');
  }

  /**
   * Completes confirmed rows that were waiting for the loop's next claim, on their own;
   * resolves whether the store answered. Never rejects: a failure is logged, and rows not
   * completed are published again after their lease (at least once).
   */
  async #completePending(done: PendingCompletion, beforeCommit: FaultHook | undefined, when: string): Promise<boolean> {
    try {
      const completed = await this.#deps.store.complete(done.lease, done.sequences, { signal: this.#abandon.signal, ...(beforeCommit ? { beforeCommit } : {}) });
      this.#completed(done.sequences.length, completed);
      return true;
    } catch (error) {
      this.#deps.logger.warn(`complete failed ${when}; confirmed rows are published again after their lease`, { error: describeError(error) });
      return false;
    }
  }

  /** The hook a store calls inside a completion before it commits; none without fault injection. */
  #beforeCommit(): FaultHook | undefined {
    const { fault } = this.#deps;
    return fault === NO_FAULTS ? undefined : (point, context) => fault(point, context);
  }

  /** Counts completed rows; fewer than confirmed means another relay holds part of the batch. */
  #completed(confirmed: number, completed: number): void {
    this.#deps.instruments.published.add(completed);
    if (completed < confirmed) {
      this.#deps.logger.warn('relay was fenced: another relay holds part of this batch', { confirmed, completed });
    }
  }

  /**
   * Publishes one batch and records the outcome. Returns false when the transport is
   * unwell: it failed as a whole, or reported connectivity trouble for some messages.
   */
  async #process(batch: ClaimedBatch, claimedAt: number, defer: ((done: PendingCompletion) => void) | undefined): Promise<boolean> {
    const { store, fault } = this.#deps;
    const stopping = this.#stopping.signal;
    const abandon = this.#abandon.signal;
    const { lease, records } = batch;
    const sequences = records.map((record) => record.sequence);
    const messageIds = records.map((record) => record.envelope.messageId);
    await fault('stale-relay', { messageIds });
    if (stopping.aborted) {
      await store.release(lease, sequences, 0);
      return true;
    }
    const { leaseMs } = this.#settings;
    // Started after the stale-relay point on purpose: a stalled process renews nothing, and
    // the heartbeat counts its lease from the claim, so a stall past the lease is seen here.
    const heartbeat = store.renew
      ? new LeaseHeartbeat({ store, lease, sequences, leaseMs, heldSince: claimedAt, logger: this.#deps.logger, signal: abandon })
      : undefined;
    this.#inHand.set(lease.token, { rows: records.length, since: claimedAt });
    try {
      return await this.#send(batch, sequences, messageIds, claimedAt, heartbeat, defer);
    } finally {
      this.#inHand.delete(lease.token);
      await heartbeat?.stop();
    }
  }

  /**
   * The rest of {@link Relay.#process}, with the batch's heartbeat (when the store renews)
   * running. With `defer`, the confirmed rows are handed to it (completed with the loop's
   * next claim) instead of completed here.
   */
  async #send(
    batch: ClaimedBatch,
    sequences: readonly bigint[],
    messageIds: readonly string[],
    claimedAt: number,
    heartbeat: LeaseHeartbeat | undefined,
    defer: ((done: PendingCompletion) => void) | undefined,
  ): Promise<boolean> {
    const { store, transport, fault, instruments } = this.#deps;
    const stopping = this.#stopping.signal;
    const abandon = this.#abandon.signal;
    const { lease, records } = batch;
    const { leaseMs } = this.#settings;
    // Without renewals nothing is sent after this instant, so that even an answer that
    // takes the whole publish timeout arrives while the lease still holds. A transport that
    // declares no timeout promises no bound to plan with: it may send until the budget is
    // spent. With renewals the heartbeat decides: the lease holds while renewals succeed.
    const sendBy = heartbeat ? Number.POSITIVE_INFINITY : claimedAt + leaseMs * LEASE_BUDGET - (transport.capabilities.publishTimeoutMs ?? 0);
    if (Date.now() >= sendBy || heartbeat?.lost.aborted) {
      // The lease is (nearly) gone: publishing now would race the relay that re-claims it.
      // The release is fenced out if another relay has already re-claimed the rows.
      this.#deps.logger.warn('relay stalled past its sending deadline; releasing the batch', { lease: String(lease.token) });
      await store.release(lease, sequences, 0);
      return true;
    }
    await fault('broker-restart', { messageIds });
    const envelopes = records.map((record) => record.envelope);
    const sending = linkSignals(heartbeat ? [stopping, heartbeat.lost] : [stopping], sendBy - Date.now());
    let results: readonly PublishResult[];
    try {
      results = await inSpan(
        this.#deps.tracer,
        'courier relay publish',
        { kind: SpanKind.PRODUCER, parent: ROOT_CONTEXT, links: traceLinks(envelopes), attributes: { 'messaging.batch.message_count': envelopes.length } },
        () => transport.publish(envelopes, { signal: sending.signal }),
      );
      if (results.length !== records.length) {
        throw new CourierError('TRANSPORT', `transport returned ${results.length} results for ${records.length} messages`, { retriable: true });
      }
      await fault('confirm-lost', { messageIds });
    } catch (error) {
      // Whether or not the broker has them, nothing is confirmed: give the rows back
      // without counting an attempt; a duplicate publish later is what at-least-once allows.
      const notSent = sending.signal.aborted && error instanceof CourierError && error.code === NOT_SENT_CODE;
      if (!notSent) {
        this.#lastError = describeError(error);
        instruments.relayPauses.add(1, PAUSED_BY_TRANSPORT);
        this.#deps.logger.warn('transport unavailable; relay pauses', { error: this.#lastError, batch: records.length });
      }
      await store.release(lease, sequences, 0).catch((releaseError: unknown) => {
        this.#deps.logger.warn('release failed; rows come back when the lease expires', { error: describeError(releaseError) });
      });
      return notSent;
    } finally {
      sending.dispose();
    }
    // From here on rows leave the lease one by one (complete, fail, release): a renewal
    // that finds fewer of them is expected, not a sign of another relay.
    heartbeat?.settle();
    await fault('after-publish-before-complete', { messageIds });

    const confirmed: bigint[] = [];
    const released: bigint[] = [];
    const failed: { record: OutboxRecord; error: CourierError }[] = [];
    const failedKeys = new Set<string>();
    let unwell: CourierError | undefined;
    records.forEach((record, index) => {
      const result = results[index]!;
      // A key's identity is built only once something failed: a batch the broker confirmed
      // whole (the usual one) makes no string per message for it.
      const keyId = record.envelope.key === null || (result.ok && failedKeys.size === 0) ? null : `${record.envelope.topic}\u0000${record.envelope.key}`;
      if (keyId !== null && failedKeys.has(keyId)) {
        // An earlier message of this key failed in this batch: completing a later one
        // would let it overtake its predecessor.
        released.push(record.sequence);
        return;
      }
      if (result.ok) {
        confirmed.push(record.sequence);
        return;
      }
      const { code } = result.error;
      // Neither trouble on the way to the broker nor a message left unsent is the
      // message's fault, whatever `retriable` says: released, no attempt counted. An
      // ABORTED the relay did not ask for is the transport's own trouble.
      if (CONNECTIVITY_CODES.has(code) || code === NOT_SENT_CODE) {
        released.push(record.sequence);
        if (code !== NOT_SENT_CODE || !sending.signal.aborted) unwell ??= result.error;
      } else {
        failed.push({ record, error: result.error });
      }
      if (keyId !== null) failedKeys.add(keyId);
    });

    // Every row confirmed (the usual batch) needs no set to tell which were.
    if (confirmed.length > 0) this.#recordLatency(records, confirmed.length === records.length ? undefined : new Set(confirmed), claimedAt);
    if (confirmed.length > 0 && defer) {
      // Completed by the loop's next claim, right after this batch is recorded (or by
      // `stop`). Rows of other keys are unaffected; a key's next row waits for it, as it
      // would for a separate complete.
      defer({ lease, sequences: confirmed });
    } else if (confirmed.length > 0) {
      // A store without completeAndClaim completes here. The hook makes it complete in a
      // transaction of several statements; without fault injection a single UPDATE is
      // enough (and ~4× fewer round trips). A stop does not cut it short (the broker has
      // these messages); only an expired stop timeout does.
      const beforeCommit = this.#beforeCommit();
      const options = beforeCommit ? { beforeCommit, signal: abandon } : { signal: abandon };
      this.#completed(confirmed.length, await store.complete(lease, confirmed, options));
    }
    await fault('mid-batch', { messageIds });
    if (failed.length > 0) await this.#recordFailures(batch, failed);
    if (released.length > 0) await store.release(lease, released, 0);
    if (unwell === undefined) return true;
    // The rows just released are due at once: pausing keeps the relay from sending them
    // straight back into the trouble the transport reported.
    this.#lastError = describeError(unwell);
    instruments.relayPauses.add(1, PAUSED_BY_TRANSPORT);
    this.#deps.logger.warn('transport reported connectivity trouble for part of a batch; relay pauses', {
      error: this.#lastError,
      released: released.length,
      confirmed: confirmed.length,
    });
    return false;
  }

  /**
   * Records due → confirm per confirmed row: the row's age at the claim (database clock,
   * from the store) plus the time since the claim started on this process's clock, so the
   * two clocks are never compared. Starting at the claim's start counts its round trip once
   * (an overestimate by at most that). A row without `ageMs` is not recorded: a made-up
   * start would skew the distribution an alert reads. `confirmed`: the rows the broker
   * confirmed, or undefined when it confirmed every row of `records`.
   */
  #recordLatency(records: readonly OutboxRecord[], confirmed: ReadonlySet<bigint> | undefined, claimedAt: number): void {
    const histogram = this.#deps.durations?.commitToConfirm;
    if (!histogram) return;
    const heldMs = Math.max(0, Date.now() - claimedAt);
    records.forEach((record) => {
      if (record.ageMs === undefined || (confirmed !== undefined && !confirmed.has(record.sequence))) return;
      histogram.record((record.ageMs + heldMs) / 1000, this.#latencyAttributes.of(record.envelope.topic));
    });
  }

  async #recordFailures(batch: ClaimedBatch, failed: readonly { record: OutboxRecord; error: CourierError }[]): Promise<void> {
    const { retry, poison } = this.#settings;
    const failures: OutboxFailure[] = [];
    for (const { record, error } of failed) {
      const attempt = record.attempts + 1;
      // Bounded and cleaned here, once, for every store: the text comes from the broker or
      // the transport, and a store's column may refuse it (U+0000 in PostgreSQL) or cut it.
      const message = boundReasonText(describeError(error));
      const detail = failureDetail(error);
      // Topic and code are bounded label values: topics are the application's, codes Courier's.
      this.#deps.instruments.publishFailures.add(1, { 'messaging.destination.name': record.envelope.topic, 'error.type': error.code });
      if (error.retriable && attempt < retry.maxAttempts) {
        const delayMs = backoffDelay(retry, attempt);
        failures.push({ sequence: record.sequence, error: message, outcome: 'retry', delayMs, ...detail });
        this.#warnFailedAttempt(record, attempt, delayMs, message);
        continue;
      }
      await this.#deps.fault('poison-head', { messageIds: [record.envelope.messageId] });
      const halt = poison === 'halt' && record.envelope.key !== null;
      failures.push({ sequence: record.sequence, error: message, outcome: halt ? 'halt' : 'dead', ...detail });
      this.#deps.instruments.deadLettered.add(1);
      this.#deps.logger.error(halt ? 'relay halted a key on a poison head' : 'relay dead-lettered a message', {
        messageId: record.envelope.messageId,
        type: record.envelope.type,
        topic: record.envelope.topic,
        key: record.envelope.key,
        attempts: attempt,
        error: message,
      });
      if (halt) {
        this.#deps.instruments.haltedKeys.add(1);
        this.#notifyHalted(record.envelope, message);
      }
    }
    await this.#deps.store.fail(batch.lease, failures, { signal: this.#abandon.signal });
  }

  /**
   * Logs a failed attempt that will be retried at warn, at most once per topic per
   * {@link FAILED_ATTEMPT_LOG_INTERVAL_MS}, with how many were left out since: an operator
   * sees a message failing long before it is finally dead-lettered, and a topic failing
   * thousands of times a minute does not flood the log.
   */
  #warnFailedAttempt(record: OutboxRecord, attempt: number, retryInMs: number, error: string): void {
    const topic = record.envelope.topic;
    const now = Date.now();
    const last = this.#failureLog.get(topic);
    if (last && now - last.at < FAILED_ATTEMPT_LOG_INTERVAL_MS) {
      last.suppressed += 1;
      return;
    }
    this.#failureLog.set(topic, { at: now, suppressed: 0 });
    this.#deps.logger.warn('publish attempt failed; retrying', {
      messageId: record.envelope.messageId,
      type: record.envelope.type,
      topic,
      key: record.envelope.key,
      attempt,
      maxAttempts: this.#settings.retry.maxAttempts,
      retryInMs,
      error,
      ...(last && last.suppressed > 0 ? { suppressedSinceLast: last.suppressed } : {}),
    });
  }

  #notifyHalted(envelope: Envelope, error: string): void {
    try {
      this.#deps.onKeyHalted?.(envelope.topic, envelope.key ?? '', error);
    } catch (hookError) {
      this.#deps.logger.warn('onKeyHalted hook threw', { error: describeError(hookError) });
    }
  }

  #resume(): void {
    if (this.#paused) this.#deps.logger.info('relay resumed');
    this.#paused = false;
    this.#pauseMs = 0;
  }

  async #pause(): Promise<void> {
    this.#paused = true;
    this.#pauseMs = Math.min(this.#settings.pauseMaxMs, this.#pauseMs === 0 ? this.#settings.pauseInitialMs : this.#pauseMs * 2);
    await sleep(this.#pauseMs, this.#stopping.signal);
  }
}

/**
 * Keeps one claimed batch's lease alive while the relay has it in hand: renews it every
 * third of the lease (`OutboxStore.renew`, one call at a time) until `stop`.
 *
 * Guarantees: `lost` aborts when a renewal before `settle` finds fewer rows than claimed
 * (another relay re-claimed some: sending the rest could break their order), or when no
 * renewal has succeeded for `LEASE_BUDGET` of a lease (the database may already count it
 * expired); it never un-aborts. A failed renewal is retried at the next beat. `stop`
 * clears every timer and waits for a renewal in flight, but no longer than the lease's
 * budget: a renewal that hangs never holds the relay's loop.
 */
class LeaseHeartbeat {
  readonly #lost = new AbortController();
  readonly #renew: () => Promise<number>;
  readonly #expected: number;
  readonly #leaseMs: number;
  readonly #logger: Logger;
  #beat: NodeJS.Timeout | undefined;
  #lapse: NodeJS.Timeout | undefined;
  #renewing: Promise<void> | undefined;
  #settled = false;
  #stopped = false;

  constructor(options: {
    readonly store: OutboxStore<unknown>;
    readonly lease: OutboxLease;
    readonly sequences: readonly bigint[];
    readonly leaseMs: number;
    /** Local time at which the lease was last known to start (the claim's start). */
    readonly heldSince: number;
    readonly logger: Logger;
    readonly signal: AbortSignal;
  }) {
    const { store, lease, sequences, leaseMs, signal } = options;
    this.#renew = () => store.renew!(lease, sequences, leaseMs, { signal });
    this.#expected = sequences.length;
    this.#leaseMs = leaseMs;
    this.#logger = options.logger;
    this.#holdFrom(options.heldSince);
    if (!this.#lost.signal.aborted) this.#schedule();
  }

  /** Aborts once the lease can no longer be trusted (see the class guarantees). */
  get lost(): AbortSignal {
    return this.#lost.signal;
  }

  /** The batch is being recorded: rows leaving the lease from now on are expected. */
  settle(): void {
    this.#settled = true;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#beat);
    // A renewal that never answers (a hung connection) must not hold the relay's loop: it is
    // waited for only until the lease could lapse. A late answer touches only rows still
    // held by the lease, and by then none is.
    if (this.#renewing) await Promise.race([this.#renewing, aborted(this.#lost.signal)]);
    clearTimeout(this.#lapse);
  }

  /** The lease is known to hold from `since` (local clock, taken before the store call). */
  #holdFrom(since: number): void {
    clearTimeout(this.#lapse);
    const lapseIn = since + this.#leaseMs * LEASE_BUDGET - Date.now();
    // Only at construction (a stall before sending): the relay then says so itself.
    if (lapseIn <= 0) return void this.#lost.abort();
    this.#lapse = setTimeout(() => this.#lose('relay could not renew its lease in time; sending no more of the batch'), lapseIn);
  }

  #lose(message: string, fields: Record<string, unknown> = {}): void {
    if (this.#lost.signal.aborted) return;
    clearTimeout(this.#lapse);
    clearTimeout(this.#beat);
    this.#lost.abort();
    if (!this.#settled && !this.#stopped) this.#logger.warn(message, fields);
  }

  #schedule(): void {
    if (this.#stopped || this.#lost.signal.aborted) return;
    this.#beat = setTimeout(() => {
      this.#renewing = this.#tick().finally(() => {
        this.#renewing = undefined;
        this.#schedule();
      });
    }, this.#leaseMs / RENEWALS_PER_LEASE);
  }

  async #tick(): Promise<void> {
    const startedAt = Date.now();
    try {
      const renewed = await this.#renew();
      if (this.#stopped || this.#lost.signal.aborted) return;
      if (renewed >= this.#expected) this.#holdFrom(startedAt);
      else if (!this.#settled) this.#lose('relay was fenced: another relay re-claimed part of its batch; sending no more of it', { claimed: this.#expected, renewed });
      // Settled: the missing rows were completed, failed or released here; the rest still
      // holds, and the lapse timer is moot once nothing more is sent.
    } catch (error) {
      // The next beat retries; the lapse timer bounds how long sending may go on meanwhile.
      if (!this.#stopped) this.#logger.warn('relay lease renewal failed; retrying', { error: describeError(error) });
    }
  }
}

/** The fault caller of a bus without a fault hook (production). */
const NO_FAULTS = (): Promise<void> => Promise.resolve();

/**
 * The code and class name a store keeps with a failed row, bounded to the store's columns
 * ({@link FAILURE_DETAIL_LIMITS}): codes are Courier's (short), but a name comes from whatever
 * class an adapter threw.
 */
function failureDetail(error: CourierError): FailureDetail {
  return { code: error.code.slice(0, FAILURE_DETAIL_LIMITS.code), errorName: error.name.slice(0, FAILURE_DETAIL_LIMITS.errorName) };
}

/** Wraps an optional fault hook so the engine can always await it. */
export function faultCaller(hook: FaultHook | undefined): (point: FaultPoint, context: FaultContext) => Promise<void> {
  if (!hook) return NO_FAULTS;
  return async (point, context) => {
    await hook(point, context);
  };
}
