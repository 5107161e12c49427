import { SpanKind, type Tracer } from '@opentelemetry/api';
import type { Handler, HandlerContext, PoisonPolicy, ReceivedMessage } from './bus-types.js';
import { PRIORITY_HEADER, type Envelope } from './envelope.js';
import { CourierError, SerializationError, StorageError, UnrecoverableError, describeError, isRetriable } from './errors.js';
import type { FaultContext, FaultPoint } from './fault-points.js';
import { hasInboxHalts, type InboxDrainClaim, type InboxHalts, type InboxStore } from './inbox-store.js';
import { Gate, sleep, withTimeout } from './internal/async.js';
import { DrainLease } from './internal/drain-lease.js';
import { parsePayload } from './json.js';
import { boundReason, boundReasonText } from './reason-text.js';
import type { Logger } from './logger.js';
import { decodeForConsume, type MessageDefinition } from './message-definition.js';
import { createOutboxPublisher, type PublisherSettings } from './outbox-publisher.js';
import type { AppendResult, OutboxStore } from './outbox-store.js';
import { backoffDelay, type RetryPolicy } from './retry.js';
import { linkSignals } from './signals.js';
import { extractTrace, inSpan, type Instruments } from './telemetry.js';
import { TopicAttributes, type DurationHistograms } from './timed-transport.js';
import type { DeadLetterReason, Delivery, Endpoint, Subscription, Transport } from './transport.js';

/** Suffix of the inbox counter of a suspect's runs alone (see the crash-loop check). */
/** The semantic conventions' attribute for a consumer group, on every counter the consumer adds to. */
const CONSUMER_GROUP = 'messaging.consumer.group.name';
const ALONE_SUFFIX = '~alone';
/** Suffix of the inbox record that says a message was dead-lettered for a consumer. */
const DEAD_SUFFIX = '~dead';
/**
 * Suffix of the inbox record of a replay's run: the replay id. A replay of a dead letter is
 * identified by the dead letter itself, (messageId, consumer), so every copy of it (a
 * broker's duplicate, a second operator's replay, a retry of the replayed copy) meets the
 * others at this one unique key and at most one commits its effects. No longer than the
 * other suffixes, so no consumer name accepted before is refused now.
 */
const REPLAY_SUFFIX = '~rerun';
/**
 * Suffix of the inbox counter of a drained message's starts (a resumed halted key's head or
 * held message), the drain's own crash accounting: apart from `~alone`, so that a copy of
 * the same message delivered meanwhile never adds to it.
 */
const DRAIN_SUFFIX = '~drain';
/** Every suffix appended to the consumer's name in inbox calls: the bus refuses names too long to carry them. */
export const INBOX_NAME_SUFFIXES: readonly string[] = [ALONE_SUFFIX, DEAD_SUFFIX, REPLAY_SUFFIX, DRAIN_SUFFIX];
/**
 * Header that marks an envelope stored by a halt (as its head or held behind it) as a
 * replay of a dead letter, so the drain records its run under the replay's inbox key (see
 * REPLAY_SUFFIX) as a delivery of it would; without it the drain would find the consumer's
 * own record (left by the dead-lettering) and drop the replay as a duplicate. The drain
 * hands the handler the envelope without it.
 */
const REPLAY_HEADER = 'courier-replay';

/**
 * What the inbox store recorded of a message before its ack (see `Consumer.#ackSettled`): run
 * and committed, a copy of one that was, held behind its key's halt, or its key halted at it.
 */
type AckedAfter = 'applied' | 'duplicate' | 'held' | 'halted';

/** Thrown inside an inbox unit of work to read without writing: the work rolls back. */
class ReadOnly extends Error {}

/** One message type a consumer handles. */
export interface Registration<Tx> {
  readonly definition: MessageDefinition<unknown, unknown>;
  readonly handler: Handler<MessageDefinition<unknown, unknown>, Tx, AppendResult>;
}

/** A consumer's resolved settings. */
export interface ConsumerSettings {
  readonly consumer: string;
  readonly ordered: boolean;
  readonly concurrency: number;
  readonly retry: RetryPolicy;
  readonly maxCrashes: number;
  /** A suspect's run alone counts as a crash only if its process dies within this many milliseconds of the run's start. */
  readonly crashWindowMs: number;
  /** Backoff while the inbox store is unavailable (no attempt is counted). */
  readonly pauseInitialMs: number;
  readonly pauseMaxMs: number;
  /** What happens to a message given up on: dead-lettered (`park`) or its key halted (`halt`, ordered only). */
  readonly poison: PoisonPolicy;
  /** How often a `halt` consumer looks for keys an operator resumed. */
  readonly haltPollMs: number;
  /** How long a drain claim on a resumed key lasts without a word from its drainer; renewed every third of it while the drain runs. */
  readonly drainLeaseMs: number;
}

/** Held messages read per step of a drain. */
const DRAIN_BATCH = 50;

/** Everything a consumer needs from its bus. */
export interface ConsumerDependencies<Tx> {
  readonly inbox: InboxStore<Tx>;
  readonly outbox: OutboxStore<Tx>;
  readonly transport: Transport;
  readonly logger: Logger;
  readonly instruments: Instruments;
  readonly tracer: Tracer;
  readonly publisher: PublisherSettings;
  readonly fault: (point: FaultPoint, context: FaultContext) => Promise<void>;
  /** Shared by every consumer of a bus: suspects of a crash loop run alone. */
  readonly gate: Gate;
  /** Where the delivery → ack time is recorded, at the ack site (no wrapper per delivery). */
  readonly durations?: DurationHistograms;
}

/**
 * Runs one consumer (group): decodes, upcasts and validates each delivery, runs its
 * handler through the inbox so effects and the inbox record commit together, and
 * settles the delivery only after that commit.
 *
 * Guarantees:
 * - exactly-once effects for writes made through `ctx.tx`, within the inbox retention;
 * - every retry goes through the transport's delayed redelivery (`delivery.retry`). On an
 *   ordered subscription the transport keeps the message's place, so only its key waits
 *   (the `Delivery.retry` contract); no handler slot and no bus-wide gate is held while a
 *   message backs off, so other keys and other consumers of the bus keep flowing;
 * - poison (unknown type, newer version, invalid payload, `UnrecoverableError`, attempts
 *   exhausted, a message that keeps killing its process) is dead-lettered with its error;
 *   a message whose unit of work committed is never parked as a crash loop (the inbox is
 *   read first), so no message ends both applied and dead-lettered by a crash count;
 * - an inbox store that fails before the handler runs (unreachable) pauses the delivery
 *   without counting an attempt; once the handler has run, any failure, including the
 *   commit of its unit of work (a statement timeout, a deferred constraint), counts one,
 *   so such a message is dead-lettered after `maxAttempts` instead of retried forever;
 * - an ack that fails once the inbox store recorded how the message ended — applied, a
 *   duplicate (a suspect already applied included), held behind a halted key, or its key
 *   halted at it — (a lock that lapsed before it, a lost connection) is logged as a warning,
 *   counted in `ackFailures` and counts no attempt: the broker redelivers the message and the
 *   inbox acknowledges that copy (or holds it again), so it is never retried, dead-lettered,
 *   halted or settled again for it;
 * - a `retry` or `deadLetter` the transport fails is logged as an error, counted in
 *   `settleFailures`, and followed by a `retry` after the longest pause: the message comes
 *   back and is retried or given up on again (a dead-lettering the broker failed is tried
 *   again each pause until it takes it), never acknowledged before its copy is safe;
 * - pauses release the bus-wide gate and take it again before the next try.
 */
export class Consumer<Tx> {
  readonly #deps: ConsumerDependencies<Tx>;
  readonly #settings: ConsumerSettings;
  readonly #registrations: ReadonlyMap<string, Registration<Tx>>;
  /** The delivery → ack histogram's attributes per topic (the names `timedTransport` used). */
  readonly #ackAttributes: TopicAttributes;
  readonly #topics: readonly string[];
  #abort = new AbortController();
  #subscription: Subscription | undefined;
  #inFlight = 0;
  /** The background subscribe retries after a failed first try, until they succeed or `stop`. */
  #subscribing: Promise<void> | undefined;
  #stopSubscribing = new AbortController();
  #lastError: string | null = null;
  #onSubscribed: () => void = () => {};
  /** The loop that drains keys an operator resumed (`halt` policy only), and its stop signal. */
  #draining: Promise<void> | undefined;
  #stopDraining = new AbortController();
  /** Aborted when `stop` gave up waiting for a drain: its claim is no longer renewed. */
  #abandonDrain = new AbortController();
  /** This instance's name on drain claims. */
  readonly #owner = `drain-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
  /** Resolves when the subscription has started (never if it is stopped first). */
  readonly subscribed: Promise<void> = new Promise((resolve) => {
    this.#onSubscribed = resolve;
  });

  constructor(deps: ConsumerDependencies<Tx>, settings: ConsumerSettings, registrations: ReadonlyMap<string, Registration<Tx>>) {
    this.#deps = deps;
    this.#settings = settings;
    this.#ackAttributes = new TopicAttributes({ 'messaging.system': 'courier', 'messaging.consumer.group.name': settings.consumer });
    this.#registrations = registrations;
    this.#topics = [...new Set([...registrations.values()].map((registration) => registration.definition.topic))].sort();
  }

  get name(): string {
    return this.#settings.consumer;
  }

  get inFlight(): number {
    return this.#inFlight;
  }

  get connected(): boolean {
    return this.#subscription !== undefined;
  }

  /** Why the subscription is not started (the last subscribe failure); null once it is. */
  get lastError(): string | null {
    return this.#subscription ? null : this.#lastError;
  }

  /**
   * Subscribes the endpoint. Resolves once subscribed or, when the first try fails with a
   * retriable error (the broker is down) and `failFast` is false, at once: the subscription
   * is then retried in the background with capped, jittered backoff until it starts or
   * `stop()` is called. Rejects with the first try's error when it is not retriable or
   * `failFast` is set.
   */
  async start(options: { readonly failFast?: boolean } = {}): Promise<void> {
    if (this.#subscription || this.#subscribing) return;
    this.#deps.instruments.primeConsumer(this.#settings.consumer);
    this.#abort = new AbortController();
    this.#stopSubscribing = new AbortController();
    if (this.#halts && !this.#draining) {
      this.#stopDraining = new AbortController();
      this.#abandonDrain = new AbortController();
      this.#draining = this.#drainLoop(this.#stopDraining.signal);
    }
    try {
      this.#subscription = await this.#subscribe();
      this.#lastError = null;
      this.#onSubscribed();
    } catch (error) {
      if (options.failFast || !isRetriable(error)) throw error;
      this.#lastError = describeError(error);
      this.#deps.logger.warn('consumer cannot subscribe yet; retrying in the background', { consumer: this.#settings.consumer, error: this.#lastError });
      this.#subscribing = this.#retrySubscribe(this.#stopSubscribing.signal);
    }
  }

  #subscribe(): Promise<Subscription> {
    const endpoint: Endpoint = {
      consumer: this.#settings.consumer,
      topics: this.#topics,
      ordered: this.#settings.ordered,
      concurrency: this.#settings.concurrency,
    };
    return this.#deps.transport.subscribe(endpoint, (delivery) => this.#handle(delivery));
  }

  /** Retries the subscription until it starts or `signal` aborts; never rejects. */
  async #retrySubscribe(signal: AbortSignal): Promise<void> {
    const { consumer, pauseInitialMs, pauseMaxMs } = this.#settings;
    let delay = pauseInitialMs;
    while (!signal.aborted) {
      // Jitter spreads the retries of many consumers (and processes) restarted together.
      await sleep(delay * (0.5 + Math.random() / 2), signal);
      if (signal.aborted) return;
      delay = Math.min(pauseMaxMs, delay * 2);
      try {
        const subscription = await this.#subscribe();
        if (signal.aborted) {
          // `stop` came while this try was in flight and will not see it: close it here.
          await subscription.close().catch(() => undefined);
          return;
        }
        this.#subscription = subscription;
        this.#lastError = null;
        this.#onSubscribed();
        this.#deps.logger.info('consumer subscribed after retrying', { consumer });
        return;
      } catch (error) {
        this.#lastError = describeError(error);
        const fields = { consumer, error: this.#lastError };
        if (error instanceof CourierError && error.code === 'CLOSED') {
          // The transport was closed under a running bus (shut down in the wrong order): no
          // try can succeed again, and one a second forever would only fill the logs.
          this.#deps.logger.error('consumer cannot subscribe: its transport is closed; it stops trying', fields);
          return;
        }
        // A non-retriable failure (say, queues declared with other settings) is kept trying
        // too, at the slowest pace: an operator may fix it, and health() shows it meanwhile.
        if (isRetriable(error)) this.#deps.logger.warn('consumer cannot subscribe yet; retrying', fields);
        else {
          delay = pauseMaxMs;
          this.#deps.logger.error('consumer cannot subscribe: not retriable; retrying slowly', fields);
        }
      }
    }
  }

  /**
   * Stops receiving; handlers in flight get `timeoutMs` to finish, then their deliveries are
   * left unsettled (redelivered). Background subscribe retries stop at once; a try in flight
   * is waited for at most `timeoutMs` and closed if it succeeds later.
   */
  async stop(timeoutMs: number): Promise<void> {
    // A drain of a resumed key stops between messages; one in its handler gets the same
    // grace as deliveries in flight (and the same abort after it).
    const draining = this.#draining;
    this.#draining = undefined;
    this.#stopDraining.abort();
    const abandon = this.#abandonDrain;
    await Promise.all([
      this.#stopReceiving(timeoutMs),
      draining
        ? withTimeout(draining, timeoutMs).then((finished) => {
            // Work left running is abandoned as a dead process's is: its claim runs out.
            if (!finished.done) abandon.abort();
          })
        : undefined,
    ]);
  }

  async #stopReceiving(timeoutMs: number): Promise<void> {
    const subscribing = this.#subscribing;
    this.#subscribing = undefined;
    if (subscribing) {
      this.#stopSubscribing.abort();
      await withTimeout(subscribing, timeoutMs);
    }
    const subscription = this.#subscription;
    if (!subscription) return;
    this.#subscription = undefined;
    const closing = subscription.close();
    const deadline = Date.now() + timeoutMs;
    while (this.#inFlight > 0 && Date.now() < deadline) await sleep(10);
    // Handlers still running past the deadline are told to give up; their deliveries
    // stay unsettled and the broker redelivers them.
    this.#abort.abort();
    // A timer left running here would keep the process alive after `stop` resolved.
    await withTimeout(closing, Math.max(0, deadline - Date.now()));
  }

  async #handle(delivery: Delivery): Promise<void> {
    const receivedAt = performance.now();
    this.#inFlight += 1;
    try {
      await this.#process(delivery, receivedAt);
    } catch (error) {
      // Something outside the handler failed (a non-retriable store error, a settle on a
      // dead connection). Ask for a later redelivery; if even that fails the connection
      // is gone and the broker redelivers on its own.
      this.#deps.logger.warn('delivery failed outside its handler; redelivering later', {
        consumer: this.#settings.consumer,
        messageId: delivery.envelope.messageId,
        error: describeError(error),
      });
      const reason = { code: error instanceof CourierError ? error.code : 'HANDLER_FAILED', message: describeError(error) };
      await delivery.retry(this.#settings.pauseMaxMs, boundReason(reason)).catch(() => undefined);
    } finally {
      this.#inFlight -= 1;
    }
  }

  async #process(delivery: Delivery, receivedAt: number): Promise<void> {
    const { envelope } = delivery;
    const { consumer } = this.#settings;
    const { fault, inbox } = this.#deps;
    const messageIds = [envelope.messageId];
    await fault('concurrent-duplicate-delivery', { messageIds, consumer });

    const registration = this.#registrations.get(envelope.type);
    if (!registration) {
      return this.#giveUp(delivery, { code: 'UNKNOWN_MESSAGE_TYPE', message: `consumer '${consumer}' has no handler for '${envelope.type}'` });
    }
    let payload: unknown;
    try {
      payload = await decodeForConsume(registration.definition, envelope.version, parsePayload(envelope.payload));
    } catch (error) {
      const code = error instanceof CourierError ? error.code : 'PAYLOAD_INVALID';
      return this.#giveUp(delivery, { code, message: describeError(error) });
    }

    const { gate } = this.#deps;
    let exclusive = false;
    let release = await gate.acquire(exclusive, this.#abort.signal);
    // Sleeping with the gate held would stall the whole bus: a suspect queued for the
    // exclusive side blocks every new shared holder. So a pause lets go of it.
    const pause = async (ms: number): Promise<void> => {
      release();
      await sleep(ms, this.#abort.signal);
      release = await gate.acquire(exclusive, this.#abort.signal);
    };
    let suspectRun: SuspectRun | undefined;
    try {
      // An operator's replay of a dead letter runs again, but under its replay id rather
      // than the consumer's own record: that record (left by the dead-lettering) stays, so
      // relay copies remain duplicates, and copies of the replay meet at the replay id's
      // unique key. Nothing is removed, so no copy can remove a record another copy's run
      // has just committed (which let a replay delivered twice run twice). A replay whose
      // run fails is dead-lettered again with no replay record committed, so it can be
      // replayed again; one whose run committed is a duplicate for every later copy.
      const inboxKey = delivery.replayed && (await this.#wasDeadLettered(envelope.messageId)) ? `${consumer}${REPLAY_SUFFIX}` : consumer;
      if (delivery.redelivered) {
        // Only a redelivery can follow a run that never finished, so only a redelivery
        // writes anything before the handler's own transaction: a first delivery costs one
        // commit. This one was in hand when a process or connection died: it may have
        // killed its process, or only have been in flight beside the one that did. It now
        // runs alone, and only runs alone that die young count against it (see SuspectRun).
        release();
        exclusive = true;
        release = await gate.acquire(exclusive, this.#abort.signal);
        if (this.#abort.signal.aborted) return;
        const aloneKey = `${consumer}${ALONE_SUFFIX}`;
        // Waiting for a turn is not a start: the count is taken once this delivery may run.
        const alone = await this.#untilAvailable(() => inbox.recordStart(envelope.messageId, aloneKey), pause);
        if (alone === undefined || this.#abort.signal.aborted) return;
        // The unfinished run that made it a suspect, plus `alone - 1` runs alone that died
        // within the crash window.
        const crashes = alone;
        if (crashes >= this.#settings.maxCrashes) {
          // A run alone that committed its unit of work and died before its ack (or before
          // its count was dropped) left the count behind, but the message is applied, not
          // poison: parking it would leave it both applied and dead, and a replay of that
          // dead letter would apply it again. So the inbox is asked first (a read, only on
          // this rare path) and an applied message is settled as the duplicate it is.
          if (await this.#untilAvailable(() => this.#hasRecord(envelope.messageId, inboxKey), pause)) {
            if (this.#abort.signal.aborted) return;
            this.#deps.instruments.duplicates.add(1, { [CONSUMER_GROUP]: consumer });
            this.#deps.logger.info('suspect already applied; acknowledged as a duplicate, not parked', { consumer, messageId: envelope.messageId, runs: crashes });
            await this.#clearCrashes(envelope.messageId);
            await this.#ackSettled(delivery, 'duplicate');
            return;
          }
          if (this.#abort.signal.aborted) return;
          await fault('poison-head', { messageIds, consumer });
          return await this.#giveUp(
            delivery,
            {
              code: 'CRASH_LOOP',
              message: `message never finished in ${crashes} runs on '${consumer}' (${alone - 1} of them alone, each dying within ${this.#settings.crashWindowMs} ms of its start); treated as poison`,
            },
            inboxKey !== consumer,
          );
        }
        suspectRun = new SuspectRun(() => this.#clearCrashes(envelope.messageId), this.#settings.crashWindowMs, () =>
          this.#deps.logger.info('suspect outlived its crash window; a death from now on is not counted against it', {
            consumer,
            messageId: envelope.messageId,
            crashWindowMs: this.#settings.crashWindowMs,
          }),
        );
      }
      await fault('crash-loop', { messageIds, consumer });
      await this.#run(delivery, registration, payload, pause, inboxKey, receivedAt);
    } finally {
      // It finished (handled or failed in a way we saw) or the bus stopped it: no crash.
      // The count of unfinished runs alone restarts.
      if (suspectRun) await suspectRun.finish();
      release();
    }
  }

  /** Drops the count of a message's unfinished runs alone; never rejects (a count left behind only errs towards parking later). */
  async #clearCrashes(messageId: string): Promise<void> {
    await this.#deps.inbox.forget(messageId, `${this.#settings.consumer}${ALONE_SUFFIX}`).catch((error: unknown) => {
      this.#deps.logger.warn('could not clear the crash count of a suspect', { consumer: this.#settings.consumer, messageId, error: describeError(error) });
    });
  }

  /**
   * Runs the handler through the inbox until it commits or fails; `pause` waits without
   * holding the gate. `inboxKey` is the consumer name the run is recorded under: the
   * consumer's own, or a replay's (see #process). `receivedAt` starts the delivery→ack timer.
   */
  async #run(delivery: Delivery, registration: Registration<Tx>, payload: unknown, pause: (ms: number) => Promise<void>, inboxKey: string, receivedAt: number): Promise<void> {
    const { envelope } = delivery;
    const { consumer } = this.#settings;
    const { fault, inbox } = this.#deps;
    const messageIds = [envelope.messageId];

    const attempt = delivery.attempt;
    // Publish → handler latency is of a message's first run only: a retry's backoff, a crash
    // redelivery, a replay's days in the dead letters are not the pipeline's latency.
    let firstStart = attempt === 1 && !delivery.redelivered && !delivery.replayed && inboxKey === consumer;
    for (;;) {
      if (this.#abort.signal.aborted) return;
      // Whether the store got as far as the handler: before it, a retriable failure is the
      // store's (unreachable); after it, the failure is this run's, commit included.
      let handlerRan = false;
      let recorded: AckedAfter;
      try {
        // A replay is held behind its consumer's halt as a replay (see REPLAY_HEADER).
        const replay = inboxKey !== consumer;
        const hold = this.#haltable(envelope)
          ? { hold: { topic: envelope.topic, key: envelope.key!, envelope: replay ? markReplay(envelope) : envelope, ...(replay ? { consumer } : {}) } }
          : undefined;
        const result = await inbox.run(
          envelope.messageId,
          inboxKey,
          async (tx) => {
            handlerRan = true;
            if (firstStart) {
              firstStart = false;
              this.#recordOccurredToHandler(envelope);
            }
            await this.#invoke(tx, envelope, registration, payload, attempt);
          },
          hold,
        );
        if (result.duplicate) {
          this.#deps.instruments.duplicates.add(1, { [CONSUMER_GROUP]: consumer });
          recorded = 'duplicate';
        } else if ('held' in result) {
          this.#deps.logger.info('key halted; message held behind its head', { consumer, messageId: envelope.messageId, topic: envelope.topic, key: envelope.key });
          recorded = 'held';
        } else {
          this.#deps.instruments.processed.add(1, { [CONSUMER_GROUP]: consumer });
          recorded = 'applied';
        }
        await fault('after-handler-commit-before-ack', { messageIds, consumer });
      } catch (error) {
        if (this.#abort.signal.aborted) return;
        if (!handlerRan && error instanceof StorageError && error.retriable) {
          // The inbox store failed before the handler ran: it is unwell, not the message.
          // Wait, count nothing.
          this.#deps.logger.warn('inbox unavailable; delivery waits', { consumer, messageId: envelope.messageId, error: describeError(error) });
          await pause(this.#settings.pauseInitialMs);
          continue;
        }
        // The handler ran. Even a retriable storage error now (its commit hit a statement
        // timeout, a deferred trigger, an idle-transaction timeout) counts an attempt: the
        // same work may fail the same way every time, and must end as a dead letter.
        const reason: DeadLetterReason = { code: error instanceof CourierError ? error.code : 'HANDLER_FAILED', message: describeError(error) };
        const poison = error instanceof UnrecoverableError || (error instanceof SerializationError && !error.retriable);
        if (poison || attempt >= this.#settings.retry.maxAttempts) {
          await fault('poison-head', { messageIds, consumer });
          return this.#giveUp(delivery, poison ? reason : { code: 'ATTEMPTS_EXHAUSTED', message: `${attempt} attempts; last: ${reason.message}` }, inboxKey !== consumer);
        }
        const delay = backoffDelay(this.#settings.retry, attempt);
        this.#deps.instruments.retries.add(1, { [CONSUMER_GROUP]: consumer });
        this.#deps.logger.info('handler failed; retrying', { consumer, messageId: envelope.messageId, attempt, delayMs: delay, error: reason.message });
        // Ordered subscriptions too: on an ordered endpoint the transport keeps the message's
        // place (nothing of its key overtakes it) while freeing the handler slot, and the gate
        // is released when this delivery returns. Waiting here instead would hold both.
        try {
          await delivery.retry(delay, boundReason(reason));
        } catch (settleError) {
          await this.#settleFailed(delivery, 'retry', settleError);
        }
        return;
      }
      // Outside the try: a failed ack is not this run's failure (see #ackSettled).
      if (await this.#ackSettled(delivery, recorded)) {
        this.#deps.durations?.deliveryToAck.record((performance.now() - receivedAt) / 1000, this.#ackAttributes.of(envelope.topic));
      }
      return;
    }
  }

  /**
   * Records `occurredAt` → now in `courier.consumer.occurred_to_handler.duration`. The two
   * instants are read on different hosts' clocks: a consumer whose clock runs behind the
   * producer's would record a negative time, recorded as 0 (a histogram of seconds has no
   * negative bucket; the skew is documented, not hidden in a sum).
   */
  #recordOccurredToHandler(envelope: Envelope): void {
    const histogram = this.#deps.durations?.occurredToHandler;
    if (!histogram) return;
    const occurredAt = Date.parse(envelope.occurredAt);
    if (Number.isNaN(occurredAt)) return;
    histogram.record(Math.max(0, Date.now() - occurredAt) / 1000, this.#ackAttributes.of(envelope.topic));
  }

  /** Runs the handler of `envelope` in the unit of work `tx`, in its span. */
  async #invoke(tx: Tx, envelope: Envelope, registration: Registration<Tx>, payload: unknown, attempt: number): Promise<void> {
    const { consumer } = this.#settings;
    const message: ReceivedMessage<unknown> = Object.freeze({
      messageId: envelope.messageId,
      type: envelope.type,
      version: envelope.version,
      topic: envelope.topic,
      key: envelope.key,
      occurredAt: new Date(envelope.occurredAt),
      correlationId: envelope.correlationId,
      causationId: envelope.causationId,
      headers: userHeaders(envelope.headers),
      payload,
    });
    // Appends the handler made on a store that writes at once: every one is awaited before
    // the inbox transaction commits, and one that failed fails the delivery, even when the
    // handler did not await it (its write may be missing from tx, or tx may be aborted).
    const appends: Promise<string>[] = [];
    let appendFailure: { readonly error: unknown } | undefined;
    const track = (pending: Promise<string>): void => {
      appends.push(
        pending.then(
          (id) => id,
          (error: unknown) => {
            appendFailure ??= { error };
            return '';
          },
        ),
      );
    };
    const context = this.#context(tx, envelope, attempt, track);
    try {
      await inSpan(
      this.#deps.tracer,
      `${envelope.topic} process`,
      {
        kind: SpanKind.CONSUMER,
        parent: extractTrace(envelope),
        attributes: {
          'messaging.system': 'courier',
          'messaging.destination.name': envelope.topic,
          'messaging.consumer.group.name': consumer,
          'messaging.message.id': envelope.messageId,
          'courier.type': envelope.type,
          'courier.attempt': attempt,
        },
      },
      () => registration.handler(message, context),
      );
    } finally {
      // Also when the handler threw: its appends settle before tx rolls back and is released.
      // An append made while an earlier one is awaited here is awaited too.
      for (let settled = 0; settled < appends.length; settled = appends.length) await Promise.all(appends.slice(settled));
    }
    if (appendFailure !== undefined) throw appendFailure.error;
    await this.#deps.fault('before-handler-commit', { messageIds: [envelope.messageId], consumer });
  }

  #context(tx: Tx, envelope: Envelope, attempt: number, track: (pending: Promise<string>) => void): HandlerContext<Tx, AppendResult> {
    const publisher = createOutboxPublisher(
      this.#deps.outbox,
      tx,
      this.#deps.publisher,
      {
        correlationId: envelope.correlationId,
        causationId: envelope.messageId,
      },
      track,
    );
    return {
      tx,
      consumer: this.#settings.consumer,
      attempt,
      signal: this.#abort.signal,
      logger: this.#deps.logger,
      envelope,
      publish: (definition, payload, options) => publisher.publish(definition, payload, options),
    };
  }

  /** The store's halts when this consumer halts keys (`poison: 'halt'`; the bus checked the store has them). */
  get #halts(): (InboxStore<Tx> & InboxHalts) | undefined {
    const { inbox } = this.#deps;
    return this.#settings.poison === 'halt' && hasInboxHalts(inbox) ? inbox : undefined;
  }

  /** Whether a message given up on halts its key rather than being dead-lettered: `halt` policy and a key to halt. */
  #haltable(envelope: Envelope): boolean {
    return this.#halts !== undefined && envelope.key !== null;
  }

  /**
   * Gives up on a delivery: under `halt`, with a key, the key is halted at it (or it is held
   * behind an existing halt) and the delivery acknowledged, only after the store committed
   * it; otherwise it is dead-lettered. A crash between the two redelivers it, and the
   * redelivery is held behind the halt the first attempt made (a duplicate when drained).
   */
  async #giveUp(delivery: Delivery, given: DeadLetterReason, replay = false): Promise<void> {
    // Every port gets the handler's error bounded and sanitised (REASON_LIMITS): it may quote
    // a whole payload, or a NUL that PostgreSQL text cannot hold, and a write that fails
    // here would bring the message back for ever.
    const reason = boundReason(given);
    const halts = this.#halts;
    const { envelope } = delivery;
    if (!halts || envelope.key === null) return this.#deadLetter(delivery, reason);
    const { consumer } = this.#settings;
    const error = boundReasonText(`${reason.code}: ${reason.message}`);
    // A replay's run is recorded under the replay's key: the halt keeps it marked as one.
    const outcome = await halts.halt(consumer, envelope.topic, envelope.key, replay ? markReplay(envelope) : envelope, error);
    if (outcome === 'halted') {
      this.#deps.instruments.consumerHaltedKeys.add(1, { [CONSUMER_GROUP]: consumer });
      this.#deps.logger.error('key halted: its head was given up on; the key waits for an operator (courier halted resume)', {
        consumer,
        messageId: envelope.messageId,
        topic: envelope.topic,
        key: envelope.key,
        code: reason.code,
        error: reason.message,
      });
    }
    await this.#ackSettled(delivery, outcome);
  }

  /**
   * Acknowledges a delivery whose end the inbox store has already recorded — applied, a
   * duplicate, held behind a halted key, or its key halted at it — and resolves whether the
   * broker answered the ack.
   *
   * Guarantees: never rejects, and asks nothing else of the delivery. An ack that fails
   * there (a lock that lapsed before it, a connection that dropped before or after the
   * broker took it) is logged once as a warning and counted (`ackFailures`), never taken for
   * the message's failure: the store's record already says how the message ended, so the
   * copy the broker hands out again (it does for an unsettled delivery) is acknowledged by
   * the inbox without running, or held again behind its halt. Retried, dead-lettered or
   * halted for it instead, an applied message would run its attempts again, end applied and
   * dead, or hold its key's next message; and a second settle of a delivery the broker did
   * take closes a RabbitMQ channel.
   */
  async #ackSettled(delivery: Delivery, recorded: AckedAfter): Promise<boolean> {
    try {
      await delivery.ack();
      return true;
    } catch (error) {
      const { consumer } = this.#settings;
      this.#deps.instruments.ackFailures.add(1, { [CONSUMER_GROUP]: consumer });
      this.#deps.logger.warn('acknowledgement failed after the inbox recorded the message; the broker redelivers it and the inbox drops that copy', {
        consumer,
        messageId: delivery.envelope.messageId,
        recorded,
        error: describeError(error),
      });
      return false;
    }
  }

  /**
   * Reacts to a `retry` or `deadLetter` settle the transport failed (a copy the broker
   * refused or never confirmed, a broker-native settle that failed): logs it as an error,
   * counts it (`settleFailures`) and asks the transport to give the message back after the
   * longest pause, as `retry` — a settle that rejected left the delivery unsettled, so the
   * transport takes this one (the `Delivery` contract). The message then comes back and is
   * retried or given up on again, so a dead-lettering that failed is tried again each pause
   * until the broker takes it. Never rejects: if even that retry fails, the transport
   * brings the message back itself (a lapsed lease, lock or connection, or, where nothing
   * would, its own redelivery: the contract again), and this says so in the log.
   */
  async #settleFailed(delivery: Delivery, kind: 'retry' | 'deadLetter', error: unknown): Promise<void> {
    const { consumer, pauseMaxMs } = this.#settings;
    const { messageId } = delivery.envelope;
    this.#deps.instruments.settleFailures.add(1, { [CONSUMER_GROUP]: consumer });
    this.#deps.logger.error(`the transport failed the ${kind} of a message; it is asked back in ${pauseMaxMs} ms and settled again then`, {
      consumer,
      messageId,
      attempt: delivery.attempt,
      error: describeError(error),
    });
    const code = error instanceof CourierError ? error.code : 'SETTLE_FAILED';
    try {
      await delivery.retry(pauseMaxMs, boundReason({ code, message: `the ${kind} failed: ${describeError(error)}` }));
    } catch (again) {
      this.#deps.logger.error('the transport failed the retry asked after a failed settle too; it gives the message back itself (Delivery contract)', {
        consumer,
        messageId,
        error: describeError(again),
      });
    }
  }

  /** Looks for keys an operator resumed, and drains them, every `haltPollMs` until `signal` aborts; never rejects. */
  async #drainLoop(signal: AbortSignal): Promise<void> {
    const halts = this.#halts!;
    while (!signal.aborted) {
      try {
        for (;;) {
          if (signal.aborted) return;
          const claimedAt = Date.now();
          const claim = await halts.claimResumed(this.#settings.consumer, this.#owner, this.#settings.drainLeaseMs);
          if (!claim) break;
          // Renewed for as long as the drain works on the key, however long a step takes (a
          // held message retrying in place outlasts any fixed lease); a claim found lost
          // stops the drain, since the key's next drainer is already at work.
          const lease = new DrainLease(
            { halts, consumer: this.#settings.consumer, topic: claim.topic, key: claim.key, owner: this.#owner, leaseMs: this.#settings.drainLeaseMs, logger: this.#deps.logger },
            claimedAt,
            this.#abandonDrain.signal,
          );
          const step = linkSignals([signal, lease.lost]);
          try {
            await this.#drain(halts, claim, step.signal);
          } finally {
            step.dispose();
            await lease.stop();
          }
        }
      } catch (error) {
        // The store is away or failed: the claim's lease runs out and this (or another) instance takes it again.
        this.#deps.logger.warn('could not drain a resumed key; trying again later', { consumer: this.#settings.consumer, error: describeError(error) });
      }
      await sleep(this.#settings.haltPollMs, signal);
    }
  }

  /**
   * Drains one resumed key: its head first (run again, or parked), then what was held behind
   * it, oldest first, each through the inbox (so a crash mid-drain repeats nothing: the next
   * drainer's runs are duplicates). The halt is lifted once nothing is held; a message that
   * fails its attempts halts the key again, at that message.
   */
  async #drain(halts: InboxHalts, claim: InboxDrainClaim, signal: AbortSignal): Promise<void> {
    const { consumer } = this.#settings;
    const { topic, key } = claim;
    const owner = this.#owner;
    this.#deps.logger.info('draining a resumed key', { consumer, topic, key, action: claim.action });
    if (claim.head) {
      const head = claim.head.envelope;
      if (claim.action === 'park') {
        await this.#markDead(head.messageId, false);
        this.#deps.instruments.deadLettered.add(1, { [CONSUMER_GROUP]: consumer });
        if (!(await halts.settleHead(consumer, topic, key, owner, { parked: true }))) return;
      } else {
        const failure = await this.#applyOutsideDelivery(head, signal);
        if (failure === 'stopped') return;
        if (failure !== undefined) {
          await this.#rehalt(halts, claim, head, failure);
          return;
        }
        if (!(await halts.settleHead(consumer, topic, key, owner, { parked: false }))) return;
      }
    }
    for (;;) {
      const held = await halts.listHeld(consumer, topic, key, owner, DRAIN_BATCH);
      if (held.length === 0) {
        if (await halts.lift(consumer, topic, key, owner)) {
          this.#deps.logger.info('resumed key drained; halt lifted', { consumer, topic, key });
          return;
        }
        // Lost the claim, or a message was held meanwhile; the latter is drained next round.
        if ((await halts.listHeld(consumer, topic, key, owner, 1)).length === 0) return;
        continue;
      }
      for (const envelope of held) {
        const failure = await this.#applyOutsideDelivery(envelope, signal);
        if (failure === 'stopped') return;
        if (failure !== undefined) {
          await this.#rehalt(halts, claim, envelope, failure);
          return;
        }
        if (!(await halts.drop(consumer, topic, key, envelope.messageId, owner))) return;
      }
    }
  }

  /**
   * Halts a draining key again at `envelope`, which failed. Counted and logged only when the
   * re-halt took effect: `rehalt` answers false when this drainer lost its claim meanwhile
   * (another drainer owns the key now and decides), and a halt that did not happen must not
   * page anyone or move the halted-keys counter.
   */
  async #rehalt(halts: InboxHalts, claim: InboxDrainClaim, envelope: Envelope, failure: string): Promise<void> {
    const { consumer } = this.#settings;
    const { topic, key } = claim;
    if (await halts.rehalt(consumer, topic, key, envelope, boundReasonText(failure), this.#owner)) {
      this.#deps.instruments.consumerHaltedKeys.add(1, { [CONSUMER_GROUP]: consumer });
      this.#deps.logger.error('key halted again: a message failed while draining; the key waits for an operator (courier halted resume)', { consumer, topic, key, messageId: envelope.messageId, error: failure });
    } else {
      this.#deps.logger.info('drain claim lost before the key could be halted again; its new drainer decides', { consumer, topic, key, messageId: envelope.messageId });
    }
  }

  /**
   * Runs a message that has no delivery (a halted key's head or held message) through the
   * inbox, retrying in place with the subscription's backoff. Resolves undefined once it is
   * applied (or was already), the error once it is poison or its attempts are exhausted, or
   * 'stopped' when the consumer stops (or the drain loses its claim) first.
   *
   * A replay of a dead letter held by the halt (see REPLAY_HEADER) is recorded under the
   * replay's key and its handler sees the envelope as delivered. Crash accounting as for a
   * redelivery (see SuspectRun): each drain run of the message is counted (`~drain`) before
   * it starts and the count dropped when it ends in a way this process saw; a message whose
   * earlier drain runs never finished `maxCrashes` times (each dying within the crash
   * window) is not run again but resolves a `CRASH_LOOP` error, so its key halts again. A
   * message with unfinished runs behind it runs alone (the bus-wide gate), as a suspect does.
   */
  async #applyOutsideDelivery(stored: Envelope, signal: AbortSignal): Promise<string | undefined | 'stopped'> {
    const { consumer, maxCrashes, crashWindowMs } = this.#settings;
    const { inbox } = this.#deps;
    const replay = stored.headers[REPLAY_HEADER] !== undefined;
    const envelope = replay ? unmarkReplay(stored) : stored;
    const recordAs = replay ? `${consumer}${REPLAY_SUFFIX}` : consumer;
    const registration = this.#registrations.get(envelope.type);
    if (!registration) return `UNKNOWN_MESSAGE_TYPE: consumer '${consumer}' has no handler for '${envelope.type}'`;
    let payload: unknown;
    try {
      payload = await decodeForConsume(registration.definition, envelope.version, parsePayload(envelope.payload));
    } catch (error) {
      return `${error instanceof CourierError ? error.code : 'PAYLOAD_INVALID'}: ${describeError(error)}`;
    }
    const { messageId } = envelope;
    const drainKey = `${consumer}${DRAIN_SUFFIX}`;
    const starts = await this.#untilAvailable(() => inbox.recordStart(messageId, drainKey), (ms) => sleep(ms, signal), signal);
    if (starts === undefined || signal.aborted) return 'stopped';
    // This run is counted too: the runs before it never finished.
    const crashes = starts - 1;
    const clear = async () => {
      await inbox.forget(messageId, drainKey).catch((error: unknown) => {
        this.#deps.logger.warn('could not clear the crash count of a drained message', { consumer, messageId, error: describeError(error) });
      });
    };
    if (crashes >= maxCrashes) {
      // Applied by a run that died before its count was dropped: not poison (see #process).
      if (await this.#untilAvailable(() => this.#hasRecord(messageId, recordAs), (ms) => sleep(ms, signal), signal)) {
        await clear();
        this.#deps.instruments.duplicates.add(1, { [CONSUMER_GROUP]: consumer });
        return undefined;
      }
      if (signal.aborted) return 'stopped';
      // Dropped, so that an operator's next resume runs it afresh.
      await clear();
      return `CRASH_LOOP: message never finished in ${crashes} drain runs on '${consumer}' (each dying within ${crashWindowMs} ms of its start); treated as poison`;
    }
    const suspect = new SuspectRun(clear, crashWindowMs, () =>
      this.#deps.logger.info('drained message outlived its crash window; a death from now on is not counted against it', { consumer, messageId, crashWindowMs }),
    );
    try {
      return await this.#attemptOutsideDelivery(envelope, registration, payload, recordAs, crashes > 0, signal);
    } finally {
      await suspect.finish();
    }
  }

  /** The attempts of {@link Consumer.#applyOutsideDelivery}, recorded under `recordAs`; alone (the gate's exclusive side) for a suspect. */
  async #attemptOutsideDelivery(
    envelope: Envelope,
    registration: Registration<Tx>,
    payload: unknown,
    recordAs: string,
    alone: boolean,
    signal: AbortSignal,
  ): Promise<string | undefined | 'stopped'> {
    const { consumer } = this.#settings;
    for (let attempt = 1; ; ) {
      if (signal.aborted) return 'stopped';
      const release = await this.#deps.gate.acquire(alone, signal);
      let handlerRan = false;
      try {
        const result = await this.#deps.inbox.run(envelope.messageId, recordAs, async (tx) => {
          handlerRan = true;
          await this.#invoke(tx, envelope, registration, payload, attempt);
        });
        if (result.duplicate) this.#deps.instruments.duplicates.add(1, { [CONSUMER_GROUP]: consumer });
        else this.#deps.instruments.processed.add(1, { [CONSUMER_GROUP]: consumer });
        return undefined;
      } catch (error) {
        if (signal.aborted) return 'stopped';
        if (!handlerRan && error instanceof StorageError && error.retriable) {
          release();
          await sleep(this.#settings.pauseInitialMs, signal);
          continue;
        }
        const code = error instanceof CourierError ? error.code : 'HANDLER_FAILED';
        const poison = error instanceof UnrecoverableError || (error instanceof SerializationError && !error.retriable);
        if (poison) return `${code}: ${describeError(error)}`;
        if (attempt >= this.#settings.retry.maxAttempts) return `ATTEMPTS_EXHAUSTED: ${attempt} attempts; last: ${describeError(error)}`;
        this.#deps.instruments.retries.add(1, { [CONSUMER_GROUP]: consumer });
        release();
        await sleep(backoffDelay(this.#settings.retry, attempt), signal);
        attempt += 1;
      } finally {
        release();
      }
    }
  }

  async #deadLetter(delivery: Delivery, given: DeadLetterReason): Promise<void> {
    const reason = boundReason(given);
    // Sent outside any unit of work of the inbox: a transport that writes to the same
    // single-writer database (the SQL transport on SQLite) would wait for its lock forever.
    try {
      await delivery.deadLetter(reason);
    } catch (error) {
      // Not parked, and not acknowledged: it is asked back, given up on again when it
      // comes back, and dead-lettered then. Counted as dead only once it is.
      await this.#settleFailed(delivery, 'deadLetter', error);
      return;
    }
    this.#deps.instruments.deadLettered.add(1, { [CONSUMER_GROUP]: this.#settings.consumer });
    this.#deps.logger.error('message dead-lettered', {
      consumer: this.#settings.consumer,
      messageId: delivery.envelope.messageId,
      type: delivery.envelope.type,
      attempt: delivery.attempt,
      code: reason.code,
      error: reason.message,
    });
    // Only after the dead letter is safe: a crash in between leaves a second dead copy at
    // worst, never a message acknowledged without being parked.
    const { messageId } = delivery.envelope;
    const { consumer } = this.#settings;
    try {
      await this.#markDead(messageId, reason.code === 'CRASH_LOOP');
    } catch (error) {
      this.#deps.logger.warn('could not record a dead letter in the inbox; a later copy may be dead-lettered again', {
        consumer,
        messageId,
        error: describeError(error),
      });
    }
  }

  /**
   * Records in the inbox that `messageId` is dead for this consumer, so that later copies are
   * duplicates — unless another copy of it was applied meanwhile.
   *
   * Two copies of one message can be in hand at once (a rebalance hands a Kafka partition to
   * a new member while the old one still runs; a lock or a connection lapses and the broker
   * redelivers). If one copy fails for good while the other commits, the message is applied
   * and dead at once, and a replay of that dead letter (it runs again when the mark says the
   * record is a dead letter's) would apply it twice. The record write tells: the mark was new
   * but the record was already there, so a handled run wrote it. Then the mark is removed,
   * and replaying that dead letter is a duplicate: applied once, whatever operators do.
   */
  async #markDead(messageId: string, crashLoop: boolean): Promise<void> {
    const { consumer } = this.#settings;
    const { inbox } = this.#deps;
    // The mark first, then the record: a copy (the relay publishes at least once) then
    // finds the record and is acknowledged as a duplicate by the inbox itself, without
    // running, and at no cost on the happy path; the mark tells a replay that the record
    // is the dead letter's, not a handled run's (see #process).
    const marked = !(await inbox.run(messageId, `${consumer}${DEAD_SUFFIX}`, async () => undefined)).duplicate;
    const recorded = !(await inbox.run(messageId, consumer, async () => undefined)).duplicate;
    if (marked && !recorded) {
      await inbox.forget(messageId, `${consumer}${DEAD_SUFFIX}`);
      this.#deps.logger.warn('dead-lettered while another copy of it was applied: replaying this dead letter changes nothing', { consumer, messageId });
    }
    // A crash loop's count of runs alone starts again if an operator replays it.
    if (crashLoop) await inbox.forget(messageId, `${consumer}${ALONE_SUFFIX}`);
  }

  /** Whether this consumer dead-lettered the message (a read through a unit of work that rolls back); only replays ask. */
  #wasDeadLettered(messageId: string): Promise<boolean> {
    return this.#hasRecord(messageId, `${this.#settings.consumer}${DEAD_SUFFIX}`);
  }

  /** Whether the inbox holds a record of `messageId` under `key`: a read through a unit of work that rolls back, so nothing is written. */
  async #hasRecord(messageId: string, key: string): Promise<boolean> {
    try {
      const result = await this.#deps.inbox.run(messageId, key, async () => {
        throw new ReadOnly();
      });
      return result.duplicate;
    } catch (error) {
      if (error instanceof ReadOnly) return false;
      throw error;
    }
  }

  /** Retries `operation` while it fails with a retriable StorageError, backing off through `pause`; undefined when stopped first. */
  async #untilAvailable<T>(operation: () => Promise<T>, pause: (ms: number) => Promise<void>, signal: AbortSignal = this.#abort.signal): Promise<T | undefined> {
    let delay = this.#settings.pauseInitialMs;
    let wait = false;
    for (;;) {
      if (wait) {
        await pause(delay);
        delay = Math.min(this.#settings.pauseMaxMs, delay * 2);
      }
      if (signal.aborted) return undefined;
      try {
        return await operation();
      } catch (error) {
        if (!(error instanceof StorageError && error.retriable)) throw error;
        wait = true;
      }
    }
  }
}

/**
 * The crash accounting of one suspect's run alone. The run was counted (a `~alone` start)
 * before it began; the count is dropped again when the run ends in a way the process saw
 * (handled, failed, stopped by the bus) and also once the run has lasted `windowMs`: a
 * message that kills its process does so while it runs, within about its usual run time,
 * while a death that comes later (a kill from outside during a rollout, an orchestrator's
 * restart of a process that was only slow) is not plausibly its fault. So only deaths
 * within the window add up to `maxCrashes`.
 */
class SuspectRun {
  readonly #clear: () => Promise<void>;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #cleared: Promise<void> | undefined;

  constructor(clear: () => Promise<void>, windowMs: number, onWindowPassed: () => void) {
    this.#clear = clear;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      // Said once the count is dropped, so a reader of the log knows it is.
      this.#cleared ??= this.#clear().then(onWindowPassed);
    }, windowMs);
    // A suspect that runs long must not keep a stopping process alive.
    this.#timer.unref?.();
  }

  /** The run ended: stop the window's timer and drop the count (once). */
  async finish(): Promise<void> {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#cleared ??= this.#clear();
    await this.#cleared;
  }
}

/** `envelope` marked as a replay of a dead letter, as a halt stores it (see REPLAY_HEADER). */
function markReplay(envelope: Envelope): Envelope {
  return { ...envelope, headers: { ...envelope.headers, [REPLAY_HEADER]: '1' } };
}

/** `envelope` without the replay mark: as it was delivered. */
function unmarkReplay(envelope: Envelope): Envelope {
  const { [REPLAY_HEADER]: _mark, ...headers } = envelope.headers;
  return { ...envelope, headers };
}

/** The headers a handler sees: without {@link PRIORITY_HEADER}, Courier's own (every other `courier-` name is never in an envelope). */
function userHeaders(headers: Readonly<Record<string, string>>): Readonly<Record<string, string>> {
  if (headers[PRIORITY_HEADER] === undefined) return headers;
  const { [PRIORITY_HEADER]: _priority, ...rest } = headers;
  return Object.freeze(rest);
}
