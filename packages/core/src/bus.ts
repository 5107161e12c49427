import type { Tracer } from '@opentelemetry/api';
import type {
  BusConfig,
  BusCounters,
  BusHealth,
  Handler,
  OutboxPublisher,
  StartOptions,
  SubscribeOptions,
} from './bus-types.js';
import { ClosedError, ConfigError, describeError } from './errors.js';
import { defaultLogger, type Logger } from './logger.js';
import type { MessageDefinition } from './message-definition.js';
import type { Transport, TransportCapabilities } from './transport.js';
import { Consumer, INBOX_NAME_SUFFIXES, type ConsumerSettings, type Registration } from './consumer.js';
import { createOutboxPublisher, newMessageId, type PublisherSettings } from './outbox-publisher.js';
import type { AppendResult } from './outbox-store.js';
import { aborted, Gate } from './internal/async.js';
import { Relay, faultCaller, relaySettings, type RelaySettings } from './relay.js';
import { retryPolicy } from './retry.js';
import { Instruments, defaultTracer } from './telemetry.js';
import { DurationHistograms, timedHandler, timedTransport } from './timed-transport.js';
import { hasInboxHalts } from './inbox-store.js';
import { isValidTopic, lengthProblem, portLimitsProblems, type LengthLimit, type NamedLimits } from './envelope.js';

/** Per-call options of {@link Bus.stop}. */
export interface StopOptions {
  /**
   * How long in-flight work may take to finish before it is abandoned (redelivered /
   * re-claimed when its lease expires). Default 10 s. Within it the relay sends nothing
   * more, completes what the broker confirmed and releases the rest without an attempt.
   */
  readonly timeoutMs?: number;
}

/**
 * The Courier bus: publishes through the outbox, relays to the broker, consumes
 * through the inbox.
 *
 * Guarantees: a message published with `outbox(tx)` reaches the broker at least once
 * if and only if `tx` commits; a handler's effects written through `ctx.tx` are applied
 * once per (messageId, consumer) within the inbox retention; nothing is dropped silently
 * — what cannot be delivered or handled is dead-lettered with its error. `start` and
 * `stop` are idempotent; `stop` never closes the stores or transport it was given.
 */
export interface Bus<Tx, A extends AppendResult = void> extends AsyncDisposable {
  /**
   * A publisher that appends to the unit of work `tx`. Its `publish` returns the messageId
   * when the outbox store queues rows in the unit of work (`A` is `void`: MikroORM,
   * in-memory) and a promise of it when the store writes at once (`A` is `Promise<void>`:
   * node-postgres and the other driver adapters), which the caller must await before
   * committing `tx`.
   */
  outbox(tx: Tx): OutboxPublisher<A>;
  /**
   * Registers a handler of `definition` for the consumer (group) `consumer`. Call before
   * `start`. On a transport declaring `fanOut: false`, a second consumer group on a topic
   * this bus already consumes is refused (`ConfigError`): it would take part of the first
   * group's messages instead of getting its own copy.
   */
  subscribe<D extends MessageDefinition<unknown, unknown>>(consumer: string, definition: D, handler: Handler<D, Tx, A>, options?: SubscribeOptions): void;
  /**
   * Starts the relay and/or the consumers, and resolves once each part has made its first
   * try: every consumer its subscription, then the relay its first claim. The relay starts
   * only after this bus's consumers subscribed (their queues must exist before anything is
   * published); while one still retries, the relay start waits for it in the background.
   *
   * Guarantees: a part whose first try fails with a retriable error (the broker or the
   * database is down) does not fail `start()`; it keeps trying in the background with
   * capped, jittered backoff (`relay.pause`), `health()` reports it not ready with the
   * error, and it becomes ready by itself when its server returns. A non-retriable error
   * (a bad configuration, queues declared with other settings, a missing schema) rejects
   * at once, as does any first failure with `failFast: true`; what had started is stopped
   * first, and `start()` may be called again. Idempotent while started; `stop()` ends
   * background retries promptly.
   */
  start(options?: StartOptions): Promise<void>;
  /** Drains and stops what runs; resolves when done or after `timeoutMs`. Idempotent. */
  stop(options?: StopOptions): Promise<void>;
  /**
   * A snapshot of the bus's state: `ready` (every part it runs works), each part's
   * readiness with its last error, and the counters. Cheap and synchronous: no I/O, so a
   * readiness probe may call it as often as it likes.
   */
  health(): BusHealth;
  /** Wakes the relay at once, e.g. right after a commit in this process. */
  wake(): void;
}

interface ConsumerPlan<Tx> {
  readonly registrations: Map<string, Registration<Tx>>;
  options: SubscribeOptions;
}

/**
 * Creates a bus. Throws `ConfigError` listing every problem with `config`. `A` is inferred
 * from the outbox store's `append`: it decides whether `bus.outbox(tx).publish()` returns a
 * `string` or a `Promise<string>`.
 */
export function createBus<Tx, A extends AppendResult = void>(config: BusConfig<Tx, A>): Bus<Tx, A> {
  const problems: string[] = [];
  if (!config || typeof config !== 'object') throw new ConfigError('createBus needs a config object');
  if (!config.outbox || typeof config.outbox.append !== 'function') problems.push(`'outbox' must be an OutboxStore`);
  if (config.inbox !== undefined && typeof config.inbox.run !== 'function') problems.push(`'inbox' must be an InboxStore`);
  if (!config.transport || typeof config.transport.publish !== 'function') problems.push(`'transport' must be a Transport`);
  problems.push(
    ...portLimitsProblems(config.outbox?.limits, 'outbox.limits'),
    ...portLimitsProblems(config.inbox?.limits, 'inbox.limits'),
    ...portLimitsProblems(config.transport?.limits, 'transport.limits'),
  );
  const maxPayloadBytes = config.maxPayloadBytes ?? 1024 * 1024;
  if (!Number.isSafeInteger(maxPayloadBytes) || maxPayloadBytes <= 0) problems.push(`'maxPayloadBytes' must be a positive integer`);
  const relay = relaySettings(config.relay, config.transport?.capabilities?.publishTimeoutMs, typeof config.outbox?.renew === 'function');
  problems.push(...relay.problems);
  let consumerRetry;
  try {
    consumerRetry = retryPolicy(config.retry, 'retry');
  } catch (error) {
    problems.push(...((error as ConfigError).problems ?? [describeError(error)]));
  }
  const limit = config.transport?.capabilities?.retryDelayLimit;
  if (consumerRetry) problems.push(...retryDelayProblems(consumerRetry.maxDelayMs, 'retry.maxDelayMs', limit));
  if (relay.settings) problems.push(...retryDelayProblems(relay.settings.pauseMaxMs, 'relay.pause.maxDelayMs', limit));
  if (problems.length > 0 || !relay.settings || !consumerRetry) throw new ConfigError(problems);
  return new CourierBus<Tx, A>(config, relay.settings, consumerRetry, maxPayloadBytes);
}

/**
 * A retry delay the transport cannot keep a delivery waiting for (see
 * `TransportCapabilities.retryDelayLimit`): the message would come back with its old attempt.
 */
function retryDelayProblems(delayMs: number, name: string, limit: TransportCapabilities['retryDelayLimit']): string[] {
  if (!limit || delayMs <= limit.maxMs) return [];
  return [
    `'${name}' (${delayMs} ms) is longer than the transport's '${limit.setting}' (${limit.maxMs} ms): a delivery waiting that long loses its hold and returns with its old attempt; lower '${name}' or raise '${limit.setting}'`,
  ];
}

class CourierBus<Tx, A extends AppendResult> implements Bus<Tx, A> {
  readonly #config: BusConfig<Tx, A>;
  readonly #relaySettings: RelaySettings;
  readonly #defaultRetry;
  readonly #logger: Logger;
  readonly #tracer: Tracer = defaultTracer();
  readonly #instruments = new Instruments();
  readonly #durations = new DurationHistograms();
  /** The transport the relay and consumers use: the user's, with publish timed (consumers time delivery → ack). */
  readonly #transport: Transport;
  readonly #publisher: PublisherSettings;
  /** What a consumer name must fit, and whose limit each is. */
  readonly #consumerLimits: readonly { readonly holder: string; readonly limit: LengthLimit | undefined }[];
  readonly #plans = new Map<string, ConsumerPlan<Tx>>();
  readonly #gate = new Gate();
  #relay: Relay<Tx> | undefined;
  #consumers: Consumer<Tx>[] = [];
  #status: BusHealth['status'] = 'stopped';
  #starting: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;
  /** Aborted when `stop()` is called: ends a relay start still waiting for consumers. */
  readonly #stopRequested = new AbortController();
  /** A relay start deferred until the bus's consumers have subscribed (see #start). */
  #relayDeferred: { readonly waitingFor: readonly string[]; readonly done: Promise<void> } | undefined;

  constructor(config: BusConfig<Tx, A>, relay: RelaySettings, retry: ReturnType<typeof retryPolicy>, maxPayloadBytes: number) {
    this.#config = config;
    this.#transport = timedTransport(config.transport, this.#durations);
    this.#relaySettings = relay;
    this.#defaultRetry = retry;
    this.#logger = config.logger ?? defaultLogger;
    this.#publisher = {
      maxPayloadBytes: Math.min(maxPayloadBytes, config.transport.capabilities.maxMessageBytes),
      limits: publishLimits(config),
      newId: config.newId ?? newMessageId,
      tracer: this.#tracer,
      ...(config.transport.validate ? { validate: config.transport.validate.bind(config.transport) } : {}),
    };
    this.#consumerLimits = consumerLimits(config);
  }

  outbox(tx: Tx): OutboxPublisher<A> {
    return createOutboxPublisher(this.#config.outbox, tx, this.#publisher);
  }

  subscribe<D extends MessageDefinition<unknown, unknown>>(consumer: string, definition: D, handler: Handler<D, Tx, A>, options: SubscribeOptions = {}): void {
    const problems: string[] = [];
    if (this.#status !== 'stopped') problems.push(`subscribe '${String(consumer)}' before start()`);
    if (typeof consumer !== 'string' || !isValidTopic(consumer)) {
      problems.push(`consumer name ${JSON.stringify(consumer)} is malformed: use letters, digits, '.', '_' or '-'`);
    } else {
      // Checked here, once: a name the inbox or the broker cannot hold would otherwise fail
      // every delivery (redelivered without end) or the subscription at start.
      for (const { holder, limit } of this.#consumerLimits) {
        const problem = lengthProblem(`consumer name '${consumer}'`, consumer, limit, holder);
        if (problem !== undefined) problems.push(problem);
      }
    }
    if (!definition || typeof definition.type !== 'string') problems.push(`subscribe '${String(consumer)}': a message definition from defineMessage(...) is required`);
    else {
      const topicProblem = lengthProblem(`topic '${definition.topic}'`, definition.topic, this.#config.transport.limits?.topic, 'the transport');
      if (topicProblem !== undefined) problems.push(`subscribe '${String(consumer)}': ${topicProblem}`);
    }
    if (typeof handler !== 'function') problems.push(`subscribe '${String(consumer)}': handler must be a function`);
    const plan = this.#plans.get(consumer);
    if (plan && definition && plan.registrations.has(definition.type)) {
      problems.push(`consumer '${consumer}' already handles '${definition.type}'`);
    }
    if (plan && options.ordered !== undefined && plan.options.ordered !== undefined && options.ordered !== plan.options.ordered) {
      problems.push(`consumer '${consumer}' cannot be both ordered and unordered: options apply to the whole consumer`);
    }
    if (options.ordered && !this.#config.transport.capabilities.orderingByKey) {
      problems.push(`consumer '${consumer}' asks for ordered delivery, but the transport does not declare 'orderingByKey'`);
    }
    if (definition && typeof definition.topic === 'string' && this.#config.transport.capabilities.fanOut === false) {
      // A queue per topic: a second group would compete with the first for the same messages.
      for (const [other, otherPlan] of this.#plans) {
        if (other === consumer || ![...otherPlan.registrations.values()].some((registration) => registration.definition.topic === definition.topic)) continue;
        problems.push(
          `consumer '${consumer}' subscribes to topic '${definition.topic}', which consumer '${other}' already consumes, but the transport does not declare 'fanOut': consumers of one topic compete for its messages there, so each group would get only part of them`,
        );
      }
    }
    if (options.concurrency !== undefined && (!Number.isSafeInteger(options.concurrency) || options.concurrency < 1)) {
      problems.push(`consumer '${consumer}': 'concurrency' must be an integer of 1 or more`);
    }
    if (options.maxCrashes !== undefined && (!Number.isSafeInteger(options.maxCrashes) || options.maxCrashes < 1)) {
      problems.push(`consumer '${consumer}': 'maxCrashes' must be an integer of 1 or more`);
    }
    if (options.crashWindowMs !== undefined && (!Number.isSafeInteger(options.crashWindowMs) || options.crashWindowMs < 1)) {
      problems.push(`consumer '${consumer}': 'crashWindowMs' must be an integer of 1 or more (milliseconds)`);
    }
    if (options.poison !== undefined) {
      const ordered = options.ordered ?? plan?.options.ordered ?? false;
      if (options.poison !== 'park' && options.poison !== 'halt') {
        problems.push(`consumer '${consumer}': 'poison' must be 'park' or 'halt'`);
      } else if (options.poison === 'halt' && !ordered) {
        problems.push(`consumer '${consumer}': poison 'halt' is for ordered subscriptions only (set 'ordered: true', or use 'park')`);
      } else if (options.poison === 'halt' && !(this.#config.inbox && hasInboxHalts(this.#config.inbox))) {
        problems.push(
          `consumer '${consumer}': poison 'halt' needs an inbox store with halts (InboxHalts: halt, listHalted, resumeHalted, …); the configured inbox store has none`,
        );
      }
    } else if (plan?.options.poison === 'halt' && options.ordered === false) {
      problems.push(`consumer '${consumer}': poison 'halt' is for ordered subscriptions only`);
    }
    if (options.retry !== undefined) {
      try {
        const policy = retryPolicy({ ...this.#defaultRetry, ...options.retry }, `${consumer}.retry`);
        problems.push(...retryDelayProblems(policy.maxDelayMs, `${consumer}.retry.maxDelayMs`, this.#config.transport.capabilities.retryDelayLimit));
      } catch (error) {
        problems.push(...((error as ConfigError).problems ?? [describeError(error)]));
      }
    }
    if (problems.length > 0) throw new ConfigError(problems);
    const entry = plan ?? { registrations: new Map<string, Registration<Tx>>(), options: {} };
    const attributes = { 'messaging.system': 'courier', 'messaging.consumer.group.name': consumer, 'messaging.destination.name': definition.topic, 'courier.type': definition.type };
    entry.registrations.set(definition.type, { definition, handler: timedHandler(handler as unknown as Registration<Tx>['handler'], this.#durations, attributes) });
    entry.options = { ...entry.options, ...options };
    this.#plans.set(consumer, entry);
  }

  start(options: StartOptions = {}): Promise<void> {
    if (this.#stopping) return Promise.reject(new ClosedError('bus'));
    if (!this.#starting) {
      const starting = this.#start(options.relay ?? true, options.consumers ?? true, options.failFast ?? false);
      this.#starting = starting;
      // A failed start may be tried again (say, with consumers: false). Cleared here, not in
      // #start: a check that throws before #start's first await would run before the assignment.
      void starting.catch(() => {
        if (this.#starting === starting) this.#starting = undefined;
      });
    }
    return this.#starting;
  }

  async #start(runRelay: boolean, runConsumers: boolean, failFast: boolean): Promise<void> {
    this.#status = 'starting';
    const fault = faultCaller(this.#config.faults);
    if (runConsumers && this.#plans.size > 0 && !this.#config.inbox) {
      this.#status = 'stopped';
      throw new ConfigError(`consumers need an 'inbox' store in createBus(...)`);
    }
    try {
      if (runConsumers && this.#config.inbox) {
        for (const [consumer, plan] of this.#plans) {
          const ordered = plan.options.ordered ?? false;
          const settings: ConsumerSettings = {
            consumer,
            ordered,
            concurrency: plan.options.concurrency ?? 8,
            retry: retryPolicy({ ...this.#defaultRetry, ...plan.options.retry }, `${consumer}.retry`),
            maxCrashes: plan.options.maxCrashes ?? 3,
            crashWindowMs: plan.options.crashWindowMs ?? 10_000,
            pauseInitialMs: this.#relaySettings.pauseInitialMs,
            pauseMaxMs: this.#relaySettings.pauseMaxMs,
            poison: plan.options.poison ?? 'park',
            haltPollMs: this.#relaySettings.pollIntervalMs,
            drainLeaseMs: this.#relaySettings.leaseMs,
          };
          const worker = new Consumer<Tx>(
            {
              inbox: this.#config.inbox,
              outbox: this.#config.outbox,
              transport: this.#transport,
              logger: this.#logger,
              instruments: this.#instruments,
              tracer: this.#tracer,
              publisher: this.#publisher,
              fault,
              gate: this.#gate,
              durations: this.#durations,
            },
            settings,
            plan.registrations,
          );
          this.#consumers.push(worker);
        }
      }
      if (runRelay) {
        this.#relay = new Relay<Tx>(
          {
            store: this.#config.outbox,
            transport: this.#transport,
            logger: this.#logger,
            instruments: this.#instruments,
            tracer: this.#tracer,
            fault,
            durations: this.#durations,
            ...(this.#config.onKeyHalted ? { onKeyHalted: this.#config.onKeyHalted } : {}),
          },
          this.#relaySettings,
        );
      }
      // The consumers try at once: during an outage, one failed connect attempt each in
      // parallel instead of one after another. All settle before the first error is
      // reported, so the shutdown below never races a start still in flight.
      const starts = this.#consumers.map((consumer) => consumer.start({ failFast }));
      const failure = (await Promise.allSettled(starts)).find((outcome) => outcome.status === 'rejected');
      if (failure) throw failure.reason;
      // The relay starts only once this bus's consumers have subscribed: a subscription
      // declares its queues, and a message published before they exist may be unroutable
      // (RabbitMQ) and dead-lettered. If some are still retrying, so does the relay start.
      const waiting = this.#consumers.filter((consumer) => !consumer.connected);
      if (this.#relay && waiting.length === 0) await this.#relay.start({ failFast });
      else if (this.#relay) this.#relayDeferred = { waitingFor: waiting.map((consumer) => consumer.name), done: this.#startRelayLater(this.#relay, waiting) };
      this.#status = 'running';
      this.#logger.info('bus started', {
        relay: runRelay,
        consumers: this.#consumers.map((consumer) => consumer.name),
        ready: this.health().ready,
        waiting: waiting.map((consumer) => consumer.name),
      });
    } catch (error) {
      await this.#shutdown(0);
      this.#status = 'stopped';
      throw error;
    }
  }

  /** Starts `relay` once every consumer in `waiting` has subscribed, unless the bus stops first; never rejects. */
  async #startRelayLater(relay: Relay<Tx>, waiting: readonly Consumer<Tx>[]): Promise<void> {
    const signal = this.#stopRequested.signal;
    // A stop requested before this started (while the consumers' first tries were in flight)
    // must end the wait too: a broker that stays down would otherwise hold stop() forever.
    await Promise.race([Promise.all(waiting.map((consumer) => consumer.subscribed)), aborted(signal)]);
    if (signal.aborted) return;
    try {
      await relay.start();
      this.#logger.info('relay started after the consumers subscribed');
    } catch (error) {
      // Not retriable (say, a missing schema): the relay keeps trying, and says why in health().
      this.#logger.error('relay start failed; it keeps retrying', { error: describeError(error) });
    }
  }

  stop(options: StopOptions = {}): Promise<void> {
    this.#stopping ??= (async () => {
      this.#stopRequested.abort();
      await this.#starting?.catch(() => undefined);
      // A deferred relay start in progress finishes first, so `stop` below sees its loops.
      await this.#relayDeferred?.done;
      this.#status = 'stopping';
      await this.#shutdown(options.timeoutMs ?? 10_000);
      this.#status = 'stopped';
      this.#logger.info('bus stopped');
    })();
    return this.#stopping;
  }

  async #shutdown(timeoutMs: number): Promise<void> {
    const relay = this.#relay;
    this.#relay = undefined;
    const consumers = this.#consumers;
    this.#consumers = [];
    await Promise.all([relay?.stop(timeoutMs), ...consumers.map((consumer) => consumer.stop(timeoutMs))]);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }

  wake(): void {
    this.#relay?.wake();
  }

  health(): BusHealth {
    let state: Omit<BusHealth['relay'], 'ready'> = this.#relay?.health() ?? { running: false, paused: false, lastError: null, sinceLastClaimMs: -1, owner: null, leases: [] };
    if (this.#relayDeferred && !state.running) {
      const names = this.#relayDeferred.waitingFor.map((name) => `'${name}'`).join(', ');
      state = { ...state, lastError: `relay starts once consumer ${names} has subscribed` };
    }
    // Ready once a claim succeeded and nothing failed since (a failure pauses the relay).
    const relay = { ...state, ready: state.running && !state.paused && state.sinceLastClaimMs >= 0 };
    const consumers = this.#consumers.map((consumer) => ({
      consumer: consumer.name,
      connected: consumer.connected,
      inFlight: consumer.inFlight,
      lastError: consumer.lastError,
    }));
    const degraded = (this.#relay !== undefined && !relay.ready) || consumers.some((consumer) => !consumer.connected);
    const status = this.#status === 'running' && degraded ? 'degraded' : this.#status;
    return {
      status,
      ready: status === 'running',
      relay,
      consumers,
      counters: this.#instruments.snapshot() satisfies BusCounters,
    };
  }
}

/** The declared limits every published envelope must fit, with the names errors give their ports. */
function publishLimits<Tx, A extends AppendResult>(config: BusConfig<Tx, A>): NamedLimits[] {
  return [
    { holder: 'the outbox store', limits: config.outbox.limits },
    { holder: 'the transport', limits: config.transport.limits },
    // The inbox keeps the messageIds of what this service consumes, often its own messages.
    { holder: 'the inbox store', limits: config.inbox?.limits?.id ? { id: config.inbox.limits.id } : undefined },
  ];
}

/** What a consumer name must fit: the inbox's column less the longest suffix the consumer appends, and the transport's limit. */
function consumerLimits<Tx, A extends AppendResult>(config: BusConfig<Tx, A>): { holder: string; limit: LengthLimit | undefined }[] {
  const inbox = config.inbox?.limits?.consumer;
  const suffix = INBOX_NAME_SUFFIXES.reduce((longest, next) => (next.length > longest.length ? next : longest), '');
  // The suffixes are ASCII: as long in characters as in bytes.
  const less = (bound: number | undefined) => (bound === undefined ? undefined : bound - suffix.length);
  const shrunk: LengthLimit | undefined = inbox
    ? { ...(inbox.chars !== undefined ? { chars: less(inbox.chars)! } : {}), ...(inbox.bytes !== undefined ? { bytes: less(inbox.bytes)! } : {}) }
    : undefined;
  return [
    { holder: `the inbox store (its limit less the ${suffix.length} characters of Courier's suffix '${suffix}')`, limit: shrunk },
    { holder: 'the transport', limit: config.transport.limits?.consumer },
  ];
}
