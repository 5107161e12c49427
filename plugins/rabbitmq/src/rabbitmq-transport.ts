import {
  ClosedError,
  ConfigError,
  CourierError,
  describeError,
  isValidTopic,
  noopLogger,
  SerializationError,
  TransportError,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type Logger,
  type PortLimits,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
} from '@courier/core';
import { connect, type ChannelModel } from 'amqplib';
import { amqpEnvelopeProblems, toAmqpMessage } from './amqp-mapping.js';
import { closeAmqp } from './amqp-close.js';
import { ConfirmPublisher, sweepIntervalMs, type ConfirmOutcome, type ConfirmPublishOptions, type OutcomeSink } from './confirm-publisher.js';
import { RabbitMqDeadLetters, depthOf } from './rabbitmq-dead-letters.js';
import { RabbitMqSubscription } from './rabbitmq-subscription.js';
import {
  DEFAULT_DELAY_TIERS_MS,
  declareConsumer,
  declareExchange,
  QUEUE_LIMIT_ARGUMENTS,
  queueLimitProblems,
  rabbitMqNames,
  type RabbitMqNames,
  type RabbitMqQueueLimits,
} from './topology.js';
import { batchSocketWrites } from './write-batching.js';

/** Arguments of {@link RabbitMqTransport}. Every field but `connection` is optional. */
export interface RabbitMqTransportConfig {
  /**
   * An `amqp://` URL, or an async factory returning a fresh amqplib connection (a plain
   * `ChannelModel` from `connect`, not a recovering one: the transport recovers itself and
   * calls the factory again on every reconnect). The transport never reads the environment.
   * A URL is opened with `noDelay: true` (Nagle off); a factory should pass it too, or a
   * small publish or ack may wait up to 40 ms for the broker's delayed ACK.
   */
  readonly connection: string | (() => Promise<ChannelModel>);
  /** Prefix of every exchange and queue name. Default `courier`. */
  readonly prefix?: string;
  /** Most unconfirmed messages in flight on the publish channel. Default 256. */
  readonly confirmWindow?: number;
  /**
   * A message with no confirm after this long fails with `PUBLISH_TIMEOUT`. Default 10 s.
   * Declared (plus the quarter of it that detection may lag) as `capabilities.publishTimeoutMs`:
   * the bus requires a relay lease of at least twice that (the default lease, 30 s, fits).
   */
  readonly publishTimeoutMs?: number;
  /** Largest payload accepted, in bytes (RabbitMQ's own `max_message_size` defaults to 128 MiB). Default 16 MiB. */
  readonly maxMessageBytes?: number;
  /** Unacknowledged deliveries per subscription. Default `max(2 × concurrency, 8)`. */
  readonly prefetch?: (endpoint: Endpoint) => number;
  /** Retry delay tiers in ms, ascending; one queue per tier per unordered consumer. Default 1 s, 5 s, 20 s, 1 min, 5 min. */
  readonly delayTiersMs?: readonly number[];
  /** Reconnect backoff (capped exponential with jitter). Default 100 ms doubling to 10 s. */
  readonly reconnect?: { readonly initialDelayMs?: number; readonly maxDelayMs?: number };
  /** Gives up on one connection attempt after this long. Default 10 s. */
  readonly connectTimeoutMs?: number;
  /** Dead-letter error text is cut to this many UTF-8 bytes so headers fit a frame. Default 4096. */
  readonly maxErrorBytes?: number;
  /** Messages `deadLetters.list` / `replay` / `purge` read per call. Default 10,000. */
  readonly maxDeadLetterScan?: number;
  /**
   * Load limits per consumer name: message TTL, max length (messages and/or bytes) and
   * what a full queue does, declared as arguments of that consumer's queue when it is
   * created (README, "Load control"). Default: none. RabbitMQ refuses to redeclare a queue
   * with other arguments, so changing a limit on an existing queue fails `subscribe` and
   * `provision` with a `ConfigError` naming the argument: change it with a policy
   * (`rabbitmqctl set_policy`) or delete and recreate the queue.
   */
  readonly queueLimits?: Readonly<Record<string, RabbitMqQueueLimits>>;
  readonly logger?: Logger;
  /** Random source for tier choice and reconnect jitter (tests make it deterministic). */
  readonly random?: () => number;
}

/** Counters since construction, for metrics and tests. */
export interface RabbitMqTransportStats {
  /** Messages the broker confirmed. */
  readonly confirmed: number;
  /** Messages that failed: nacked, returned, timed out, lost with the connection, or refused before sending. */
  readonly publishFailures: number;
  /** Mandatory messages no queue took (`basic.return`); also counted in `publishFailures`. */
  readonly unroutable: number;
  /** Messages the broker nacked (a queue full under `reject-publish`); also counted in `publishFailures`. */
  readonly nacked: number;
  /**
   * Messages the broker refused by closing the publish channel (406), found by sending the
   * suspects of a closed channel one at a time; also counted in `publishFailures`.
   */
  readonly refused: number;
  readonly deliveries: number;
  readonly retried: number;
  readonly deadLettered: number;
  /** Connection losses noticed (not counting `close`). */
  readonly disconnects: number;
  /** Successful reconnects. */
  readonly reconnects: number;
}

type Counter = keyof RabbitMqTransportStats;

const NAME_PATTERN = /^[A-Za-z0-9._-]+$/;
const MAX_MESSAGE_BYTES_LIMIT = 512 * 1024 * 1024; // RabbitMQ's hard ceiling for max_message_size
/** AMQP 0-9-1 `shortstr`: names, routing keys, header names and most basic properties. */
const SHORTSTR_BYTES = 255;

/** Bytes of the longest queue name in `names` (the dead-letter queue or a delay-tier queue). */
function longestDerivedName(names: RabbitMqNames): number {
  return Math.max(...[names.queue, names.deadLetterQueue, ...names.retryQueues.map((tier) => tier.name)].map((name) => Buffer.byteLength(name, 'utf8')));
}

/**
 * Courier's transport on RabbitMQ, through amqplib.
 *
 * Guarantees (beyond the `Transport` contract):
 * - Publishing: persistent, mandatory messages on one confirm channel with a window of
 *   `confirmWindow` unconfirmed messages. `publish` resolves once the broker answered
 *   for every message; a nack, a return (no queue bound for the topic), a timeout or a
 *   connection lost before the confirm fails exactly the messages concerned, and a
 *   message that makes the broker close the channel fails alone (found by resending the
 *   suspects one at a time), not as an outage. It rejects with a retriable
 *   `TransportError` only when no connection is open.
 * - Order: messages published on the one channel reach a queue in publish order, but a
 *   refused message does not stop the later ones of its key, so `orderedPipelining` is
 *   false and the relay keeps one unconfirmed message per key.
 * - Topology (see the README): one durable direct exchange `<prefix>.topics` routed by
 *   topic; per consumer a quorum queue `<prefix>.q.<consumer>`, its delay-tier queues and
 *   its dead-letter queue, declared on `subscribe` (or {@link provision}).
 * - Recovery: a lost connection or channel is reopened with capped, jittered backoff,
 *   the topology re-declared and every subscription resumed. Nothing in flight is
 *   assumed delivered.
 * - `close` is idempotent, stops consumers, waits for handlers and confirms in flight,
 *   then closes the connection; `await using` works.
 */
export class RabbitMqTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  /**
   * AMQP short strings hold 255 bytes: the `message_id`, `correlation_id` and `type`
   * properties, the routing key (the topic), header names, and the queue names derived
   * from a consumer name (with this transport's prefix and delay-tier suffixes). The bus
   * refuses longer values at `publish()` and `subscribe`.
   */
  readonly limits: PortLimits;
  readonly deadLetters: RabbitMqDeadLetters;
  readonly #factory: () => Promise<ChannelModel>;
  readonly #prefix: string;
  readonly #window: number;
  readonly #publishTimeoutMs: number;
  readonly #prefetch: (endpoint: Endpoint) => number;
  readonly #tiers: readonly number[];
  readonly #reconnectInitialMs: number;
  readonly #reconnectMaxMs: number;
  readonly #connectTimeoutMs: number;
  readonly #maxErrorBytes: number;
  readonly #logger: Logger;
  readonly #random: () => number;
  readonly #queueLimits: ReadonlyMap<string, RabbitMqQueueLimits>;
  readonly #stats: Record<Counter, number> = {
    confirmed: 0,
    publishFailures: 0,
    unroutable: 0,
    nacked: 0,
    refused: 0,
    deliveries: 0,
    retried: 0,
    deadLettered: 0,
    disconnects: 0,
    reconnects: 0,
  };
  readonly #subscriptions = new Set<RabbitMqSubscription>();
  readonly #publishes = new Set<Promise<unknown>>();
  #connection: ChannelModel | null = null;
  #publisher: ConfirmPublisher | null = null;
  #opening: Promise<ConfirmPublisher> | null = null;
  #connecting: Promise<void> | null = null;
  #reconnectTimer: NodeJS.Timeout | null = null;
  #reconnectAttempt = 0;
  #everConnected = false;
  #closing: Promise<void> | null = null;
  #sendTurn: Promise<void> = Promise.resolve();
  /** messageIds that closed the publish channel: sent alone from now on (oldest forgotten first). */
  readonly #poison = new Set<string>();

  constructor(config: RabbitMqTransportConfig) {
    const problems: string[] = [];
    const { connection } = config;
    if (typeof connection === 'string') {
      if (!/^amqps?:\/\//.test(connection)) problems.push(`'connection' must be an amqp:// or amqps:// URL`);
    } else if (typeof connection !== 'function') {
      problems.push(`'connection' must be a URL or an async connection factory`);
    }
    const prefix = config.prefix ?? 'courier';
    if (!NAME_PATTERN.test(prefix) || prefix.length > 100) problems.push(`'prefix' must be 1-100 characters of [A-Za-z0-9._-], got '${prefix}'`);
    const positiveInt = (name: string, value: number | undefined, fallback: number, max = Number.MAX_SAFE_INTEGER): number => {
      const v = value ?? fallback;
      if (!Number.isSafeInteger(v) || v < 1 || v > max) problems.push(`'${name}' must be an integer from 1 to ${max}, got ${String(value)}`);
      return v;
    };
    this.#window = positiveInt('confirmWindow', config.confirmWindow, 256, 65_535);
    this.#publishTimeoutMs = positiveInt('publishTimeoutMs', config.publishTimeoutMs, 10_000);
    const maxMessageBytes = positiveInt('maxMessageBytes', config.maxMessageBytes, 16 * 1024 * 1024, MAX_MESSAGE_BYTES_LIMIT);
    this.#reconnectInitialMs = positiveInt('reconnect.initialDelayMs', config.reconnect?.initialDelayMs, 100);
    this.#reconnectMaxMs = positiveInt('reconnect.maxDelayMs', config.reconnect?.maxDelayMs, 10_000);
    this.#connectTimeoutMs = positiveInt('connectTimeoutMs', config.connectTimeoutMs, 10_000);
    this.#maxErrorBytes = positiveInt('maxErrorBytes', config.maxErrorBytes, 4096, 32 * 1024);
    const maxScan = positiveInt('maxDeadLetterScan', config.maxDeadLetterScan, 10_000);
    const tiers = config.delayTiersMs ?? DEFAULT_DELAY_TIERS_MS;
    if (tiers.length === 0 || tiers.some((t, i) => !Number.isSafeInteger(t) || t < 1 || (i > 0 && t <= tiers[i - 1]!))) {
      problems.push(`'delayTiersMs' must be a non-empty ascending list of positive integers`);
    }
    const queueLimits = new Map<string, RabbitMqQueueLimits>();
    if (config.queueLimits !== undefined && (typeof config.queueLimits !== 'object' || config.queueLimits === null || Array.isArray(config.queueLimits))) {
      problems.push(`'queueLimits' must be an object keyed by consumer name`);
    } else {
      for (const [consumer, limits] of Object.entries(config.queueLimits ?? {})) {
        if (!NAME_PATTERN.test(consumer)) problems.push(`'queueLimits' key '${consumer}' is not a consumer name ([A-Za-z0-9._-])`);
        const found = queueLimitProblems(consumer, limits);
        problems.push(...found);
        if (found.length === 0) queueLimits.set(consumer, Object.freeze({ ...limits }));
      }
    }
    if (problems.length > 0) throw new ConfigError(problems);

    // Nagle off: with it on (amqplib's default) a small publish or ack written while earlier
    // bytes are unacknowledged waits for the broker's ACK, which Linux may delay by up to
    // 40 ms — measured: steady-state commit → confirm p50 37 ms with it, 2–5 ms without.
    // Whole batches already leave in large writes (write-batching.ts), so it costs no packets there.
    this.#factory = typeof connection === 'string' ? () => connect(connection, { noDelay: true }) : connection;
    this.#prefix = prefix;
    this.#tiers = Object.freeze([...tiers]);
    this.#prefetch = config.prefetch ?? ((endpoint) => Math.max(endpoint.concurrency * 2, 8));
    this.#logger = config.logger ?? noopLogger;
    this.#random = config.random ?? Math.random;
    this.#queueLimits = queueLimits;
    this.capabilities = Object.freeze({
      orderingByKey: true,
      // Publish order is kept on the one channel, but a nack or return of one message does
      // not stop the later messages of its key: pipelining a key could let them overtake it.
      orderedPipelining: false,
      nativeDelay: false,
      // Honoured for consumers whose queueLimits set maxPriority (a classic priority queue).
      priorities: true,
      nativeDeadLetter: true,
      maxMessageBytes,
      // The longest wait for an answer: timeouts are found by a sweep, not a timer per message.
      publishTimeoutMs: this.#publishTimeoutMs + sweepIntervalMs(this.#publishTimeoutMs),
    });
    const shortstr = { bytes: SHORTSTR_BYTES };
    this.limits = Object.freeze({
      id: shortstr,
      type: shortstr,
      topic: shortstr,
      headerName: shortstr,
      consumer: { bytes: SHORTSTR_BYTES - longestDerivedName(this.names('')) },
    });
    this.deadLetters = new RabbitMqDeadLetters({
      logger: this.#logger,
      maxScan,
      names: (consumer) => this.names(consumer),
      requireConnection: () => this.#requireConnection(),
      publishToQueue: (queue, content, options) => this.#publishToQueue(queue, content, options),
    });
  }

  /**
   * The consumer's lag: its queue's ready messages (RabbitMQ's `messageCount`), read by a
   * passive declare on a channel of its own — nothing created, taken or locked. Messages
   * delivered and not yet acknowledged, and those waiting out a retry delay in the tier
   * queues, are not counted. `null` when the queue does not exist (never subscribed).
   */
  async consumerLag(consumer: string): Promise<number | null> {
    return (await depthOf(await this.#requireConnection(), this.names(consumer).queue)) ?? null;
  }

  /** Names of the exchange and of `consumer`'s queues under this transport's prefix and tiers. */
  names(consumer: string): RabbitMqNames {
    return rabbitMqNames(this.#prefix, consumer, this.#tiers);
  }

  /** A snapshot of the counters. */
  stats(): RabbitMqTransportStats {
    return Object.freeze({ ...this.#stats });
  }

  /**
   * Lists what makes RabbitMQ refuse `envelope` whatever its state: user headers it
   * reserves — `CC` and `BCC` (sender-selected routing; a string there makes the broker
   * close the publish channel), and the `x-` headers it adds itself (`x-death`,
   * `x-first-death-*`, `x-delivery-count`, …), which would not round-trip. Empty when
   * deliverable. The bus calls it at `publish()`; `publish` refuses the same envelopes.
   */
  validate(envelope: Envelope): readonly string[] {
    return amqpEnvelopeProblems(envelope);
  }

  /** True while a connection is open. */
  get connected(): boolean {
    return this.#connection !== null;
  }

  /**
   * Publishes `messages` and resolves with one result per message, in input order, once
   * the broker answered for each.
   *
   * A result is `ok: false` with a `TransportError` (retriable) for a nack — a queue full
   * under `reject-publish` (`PUBLISH_BACKPRESSURE`: the relay pauses and retries without
   * counting an attempt) —, a message that made the broker close the publish channel (406,
   * also `PUBLISH_REJECTED`, with the broker's reason), a return (`PUBLISH_UNROUTABLE`: no
   * consumer queue is bound to the topic yet), a timeout (`PUBLISH_TIMEOUT`) or a
   * connection lost, or a channel closed for another reason, before the confirm
   * (`TRANSPORT`), or `ABORTED` for messages not yet sent when `signal` aborted mid-call; and with a
   * `SerializationError` (not retriable) for a payload over `maxMessageBytes` or a message
   * amqplib cannot encode (headers over 64 KiB, a header name RabbitMQ reserves, see
   * {@link validate}). Rejects with a retriable `TransportError` when no connection is
   * open or (code `ABORTED`, nothing sent) when `signal` is already aborted, `ClosedError`
   * after `close`.
   *
   * When the broker closes the channel, the unconfirmed messages are suspects: each is
   * sent again alone on a fresh channel, so the one that closes it again fails alone and
   * its neighbours are confirmed (possibly twice: at-least-once). A message found so is
   * sent alone from then on and cannot close the shared channel again.
   */
  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    if (this.#closing) throw new ClosedError('rabbitmq transport');
    // The Transport contract: a call already aborted rejects and sends nothing (it used to
    // answer with ABORTED results, which a relay that gave the rows back never reads).
    if (options.signal?.aborted) throw new TransportError('publish aborted before sending', { code: 'ABORTED', retriable: true, cause: options.signal.reason });
    const run = this.#publish(messages, options.signal);
    this.#publishes.add(run);
    try {
      return await run;
    } finally {
      this.#publishes.delete(run);
    }
  }

  async #publish(messages: readonly Envelope[], signal: AbortSignal | undefined): Promise<readonly PublishResult[]> {
    if (messages.length === 0) return [];
    // Calls send one after another (confirms still overlap), so messages reach the broker
    // in call order even when a relay pipelines batches: that is what keeps the order of
    // a key across several unconfirmed messages. Taken before the first await.
    const previous = this.#sendTurn;
    let done!: () => void;
    this.#sendTurn = new Promise<void>((resolve) => {
      done = resolve;
    });
    const results = new Array<PublishResult>(messages.length);
    const suspects: Suspect[] = [];
    const answers = new BatchAnswers(messages, results, suspects, (envelope, outcome) => this.#result(envelope, outcome));
    try {
      await previous;
      const publisher = await this.#readyPublisher();
      await this.#sendAll(publisher, messages, signal, results, answers);
    } finally {
      done();
    }
    await answers.all();
    if (suspects.length > 0) await this.#isolate(suspects.sort((a, b) => a.index - b.index), signal, results);
    return results;
  }

  async #sendAll(publisher: ConfirmPublisher, messages: readonly Envelope[], signal: AbortSignal | undefined, results: PublishResult[], answers: BatchAnswers): Promise<void> {
    const exchange = `${this.#prefix}.topics`;
    const max = this.capabilities.maxMessageBytes;
    for (let i = 0; i < messages.length; i++) {
      const envelope = messages[i]!;
      const { messageId } = envelope;
      if (signal?.aborted) {
        results[i] = this.#failed(messageId, new TransportError(`publish of message '${messageId}' aborted before sending`, { code: 'ABORTED' }));
        continue;
      }
      try {
        const message = toAmqpMessage(envelope);
        if (message.content.length > max) {
          throw new SerializationError('PAYLOAD_TOO_LARGE', `message '${messageId}' payload is ${message.content.length} bytes; at most ${max} are allowed`);
        }
        // Most of the time no message is remembered as poison: no lookup per message then.
        if (this.#poison.size > 0 && this.#poison.has(messageId)) {
          // It closed the shared channel before: it goes alone, so it cannot take others with it again.
          answers.suspect(i);
          continue;
        }
        if (!publisher.hasCapacity()) {
          await publisher.capacity();
          // The wait for the window may outlast the relay's sending deadline: check again.
          if (signal?.aborted) {
            results[i] = this.#failed(messageId, new TransportError(`publish of message '${messageId}' aborted before sending`, { code: 'ABORTED' }));
            continue;
          }
        }
        answers.expect();
        try {
          publisher.sendTo(exchange, envelope.topic, message.content, message.properties, answers, i);
        } catch (error) {
          answers.unexpect();
          throw error;
        }
      } catch (error) {
        const failure =
          error instanceof CourierError
            ? error
            : new SerializationError('ENVELOPE_INVALID', `message '${messageId}' cannot be encoded for AMQP: ${describeError(error)}`, { cause: error });
        results[i] = this.#failed(messageId, failure);
      }
    }
  }

  /**
   * Sends the suspects of a channel the broker closed one at a time, each alone on a
   * fresh channel of its own, so the message that closes it again is known: it fails alone
   * with a retriable `PUBLISH_REJECTED` (the relay counts an attempt and parks it in the
   * end) and is sent alone from then on; the others are confirmed. A close with another
   * code than 406 (permissions, a missing exchange) or a lost connection is not the
   * message's fault and answers as a connectivity failure, as before.
   */
  async #isolate(suspects: readonly Suspect[], signal: AbortSignal | undefined, results: PublishResult[]): Promise<void> {
    const exchange = `${this.#prefix}.topics`;
    let publisher: ConfirmPublisher | null = null;
    try {
      for (const { index, envelope } of suspects) {
        const { messageId } = envelope;
        if (signal?.aborted) {
          results[index] = this.#failed(messageId, new TransportError(`publish of message '${messageId}' aborted before sending`, { code: 'ABORTED' }));
          continue;
        }
        if (!publisher?.alive) {
          await publisher?.close();
          try {
            publisher = await this.#newPublisher(await this.#requireConnection(), 1);
          } catch (error) {
            publisher = null;
            results[index] = this.#failed(
              messageId,
              new TransportError(`rabbitmq publish channel could not be opened for message '${messageId}': ${describeError(error)}`, { cause: error }),
            );
            continue;
          }
        }
        const message = toAmqpMessage(envelope);
        const answer = await publisher.send(exchange, envelope.topic, message.content, message.properties);
        if (answer.kind === 'closed' && answer.channelError?.code === PRECONDITION_FAILED) {
          this.#stats.refused++;
          this.#remember(messageId);
          this.#logger.warn('rabbitmq refused a message by closing the publish channel', { messageId, topic: envelope.topic, error: answer.channelError.message });
          results[index] = this.#failed(
            messageId,
            new TransportError(`rabbitmq refused message '${messageId}' and closed the publish channel: ${answer.channelError.message}`, {
              code: 'PUBLISH_REJECTED',
              cause: answer.cause,
            }),
          );
          continue;
        }
        if (answer.kind === 'ok') this.#poison.delete(messageId);
        results[index] = this.#result(envelope, answer);
      }
    } finally {
      await publisher?.close();
    }
  }

  #remember(messageId: string): void {
    this.#poison.delete(messageId);
    this.#poison.add(messageId);
    if (this.#poison.size > MAX_REMEMBERED_POISON) this.#poison.delete(this.#poison.values().next().value!);
  }

  #result(envelope: Envelope, outcome: ConfirmOutcome): PublishResult {
    const { messageId, topic } = envelope;
    switch (outcome.kind) {
      case 'ok':
        this.#stats.confirmed++;
        return { messageId, ok: true };
      case 'nacked':
        this.#stats.nacked++;
        return this.#failed(messageId, nackError(`rabbitmq nacked message '${messageId}'`));
      case 'returned':
        this.#stats.unroutable++;
        this.#logger.warn('rabbitmq returned an unroutable message', { messageId, topic, replyText: outcome.replyText });
        return this.#failed(
          messageId,
          new TransportError(`message '${messageId}' is unroutable: no queue is bound to topic '${topic}' (${outcome.replyText})`, {
            code: 'PUBLISH_UNROUTABLE',
          }),
        );
      case 'timeout':
        return this.#failed(
          messageId,
          new TransportError(`no confirm for message '${messageId}' within ${this.#publishTimeoutMs} ms; it may still arrive`, { code: 'PUBLISH_TIMEOUT' }),
        );
      case 'closed':
        return this.#failed(
          messageId,
          new TransportError(
            outcome.channelError
              ? `rabbitmq closed the publish channel before the confirm of message '${messageId}' (${outcome.channelError.message}); it may still arrive`
              : `connection lost before the confirm of message '${messageId}'; it may still arrive`,
            { cause: outcome.cause },
          ),
        );
    }
  }

  #failed(messageId: string, error: CourierError): PublishResult {
    this.#stats.publishFailures++;
    return { messageId, ok: false, error };
  }

  /**
   * Declares `endpoint.consumer`'s queues and binds them to its topics without consuming,
   * so messages published before the consumer first starts are kept instead of returned
   * as unroutable. Idempotent.
   */
  async provision(endpoint: Pick<Endpoint, 'consumer' | 'topics' | 'ordered'>): Promise<void> {
    this.#checkEndpoint({ ...endpoint, concurrency: 1 });
    const connection = await this.#requireConnection();
    const channel = await connection.createChannel();
    channel.on('error', () => undefined);
    try {
      await declareConsumer(channel, this.names(endpoint.consumer), endpoint, {
        deadLetterDeliveryLimit: DEAD_LETTER_DELIVERY_LIMIT,
        limits: this.#queueLimits.get(endpoint.consumer),
      });
    } catch (error) {
      throw declarationError(endpoint.consumer, error);
    } finally {
      await closeAmqp(channel);
    }
  }

  /**
   * Starts consuming `endpoint` from its quorum queue, declaring the topology first.
   *
   * Resolves once the consumer is registered with the broker; rejects with a `ConfigError`
   * for a bad endpoint or a queue that exists with other settings (ordered vs not), or a
   * retriable `TransportError` when the broker is unreachable, and with a `ClosedError`
   * after `close` or when `close` began while it was under way (nothing of it consumes
   * then). Afterwards it survives reconnects until closed.
   */
  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    if (this.#closing) throw new ClosedError('rabbitmq transport');
    this.#checkEndpoint(endpoint);
    try {
      await this.#requireConnection();
    } catch (error) {
      throw this.#closedOr(error);
    }
    // close() began while the connection was awaited: it has already stopped every
    // subscription it saw, and one started now would outlive it.
    if (this.#closing) throw new ClosedError('rabbitmq transport');
    const frozen: Endpoint = Object.freeze({ ...endpoint, topics: Object.freeze([...endpoint.topics]) });
    const subscription = new RabbitMqSubscription(
      {
        logger: this.#logger,
        random: this.#random,
        maxErrorBytes: this.#maxErrorBytes,
        deadLetterDeliveryLimit: DEAD_LETTER_DELIVERY_LIMIT,
        queueLimits: this.#queueLimits.get(endpoint.consumer),
        connection: () => this.#connection,
        publishToQueue: (queue, content, options) => this.#publishToQueue(queue, content, options),
        count: (counter) => {
          this.#stats[counter]++;
        },
        forget: (s) => {
          this.#subscriptions.delete(s);
        },
      },
      frozen,
      handler,
      this.names(endpoint.consumer),
      this.#prefetch(frozen),
    );
    this.#subscriptions.add(subscription);
    try {
      await subscription.start();
    } catch (error) {
      this.#subscriptions.delete(subscription);
      await subscription.close();
      throw this.#closedOr(declarationError(endpoint.consumer, error));
    }
    return subscription;
  }

  /** `error`, or a `ClosedError` (caused by it) when close() began meanwhile: the failure is the close's doing, and retrying it is pointless. */
  #closedOr(error: unknown): unknown {
    return this.#closing ? new ClosedError('rabbitmq transport', { cause: error }) : error;
  }

  /**
   * Stops every subscription (waiting for handlers in flight), waits for publishes in
   * flight to be answered, then closes the connection. Idempotent. With `signal`, stops
   * waiting for handlers when it aborts, or at once if it already has (their deliveries
   * are redelivered). Once it resolved nothing is declared on the broker any more: every
   * declaration runs on the connection it closed, and no reconnect or restart outlives it.
   */
  close(options: { signal?: AbortSignal } = {}): Promise<void> {
    this.#closing ??= this.#close(options.signal);
    return this.#closing;
  }

  /** Same as {@link close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #close(signal: AbortSignal | undefined): Promise<void> {
    if (this.#reconnectTimer) clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = null;
    await Promise.all([...this.#subscriptions].map((s) => s.close(signal ? { signal } : {})));
    await Promise.allSettled([...this.#publishes]);
    await this.#connecting?.catch(() => undefined);
    const connection = this.#connection;
    this.#connection = null;
    await this.#publisher?.close();
    this.#publisher = null;
    if (connection) await closeAmqp(connection);
  }

  #checkEndpoint(endpoint: Endpoint): void {
    const problems: string[] = [];
    if (typeof endpoint.consumer !== 'string' || !NAME_PATTERN.test(endpoint.consumer)) {
      problems.push(`consumer '${String(endpoint.consumer)}' must be non-empty [A-Za-z0-9._-]`);
    } else if (longestDerivedName(this.names(endpoint.consumer)) > SHORTSTR_BYTES) {
      problems.push(`consumer '${endpoint.consumer}' is too long for RabbitMQ's 255-byte queue names`);
    }
    if (!Array.isArray(endpoint.topics) || endpoint.topics.length === 0) problems.push(`consumer '${endpoint.consumer}' needs at least one topic`);
    else for (const topic of endpoint.topics) if (!isValidTopic(topic)) problems.push(`topic '${String(topic)}' is not a valid topic name`);
    if (!Number.isSafeInteger(endpoint.concurrency) || endpoint.concurrency < 1) {
      problems.push(`consumer '${endpoint.consumer}' concurrency must be an integer of 1 or more`);
    }
    if (endpoint.ordered && this.#queueLimits.get(endpoint.consumer)?.maxPriority !== undefined) {
      // A priority queue delivers a later, higher-priority message of a key before an earlier one.
      problems.push(`consumer '${endpoint.consumer}' is ordered, and 'queueLimits.${endpoint.consumer}.maxPriority' would reorder its keys: use one or the other`);
    }
    if (problems.length > 0) throw new ConfigError(problems);
  }

  /** The open connection, connecting first if this is the first use. */
  async #requireConnection(): Promise<ChannelModel> {
    if (this.#closing) throw new ClosedError('rabbitmq transport');
    if (!this.#connection) {
      if (!this.#connecting && this.#everConnected) {
        throw new TransportError('rabbitmq connection is down; reconnecting');
      }
      try {
        await this.#connect();
      } catch (error) {
        throw new TransportError(`rabbitmq is unreachable: ${describeError(error)}`, { cause: error });
      }
    }
    const connection = this.#connection as ChannelModel | null;
    if (!connection) throw new TransportError('rabbitmq connection is down; reconnecting');
    return connection;
  }

  async #readyPublisher(): Promise<ConfirmPublisher> {
    if (this.#publisher?.alive) return this.#publisher;
    const connection = await this.#requireConnection();
    if (this.#publisher?.alive) return this.#publisher;
    // The connection is up but the publish channel died (a channel error): open another.
    this.#opening ??= this.#openPublisher(connection).finally(() => {
      this.#opening = null;
    });
    try {
      return await this.#opening;
    } catch (error) {
      throw new TransportError(`rabbitmq publish channel could not be opened: ${describeError(error)}`, { cause: error });
    }
  }

  async #openPublisher(connection: ChannelModel): Promise<ConfirmPublisher> {
    const publisher = await this.#newPublisher(connection, this.#window);
    if (this.#connection === connection) this.#publisher = publisher;
    return publisher;
  }

  async #newPublisher(connection: ChannelModel, window: number): Promise<ConfirmPublisher> {
    const channel = await connection.createConfirmChannel();
    channel.on('error', (error: Error) => this.#logger.warn('rabbitmq publish channel error', { error: describeError(error) }));
    await declareExchange(channel, { exchange: `${this.#prefix}.topics` });
    return new ConfirmPublisher(channel, { window, timeoutMs: this.#publishTimeoutMs });
  }

  async #publishToQueue(queue: string, content: Buffer, options: ConfirmPublishOptions): Promise<void> {
    const publisher = await this.#readyPublisher();
    if (!publisher.hasCapacity()) await publisher.capacity();
    const outcome = await publisher.send('', queue, content, options);
    if (outcome.kind === 'ok') return;
    const what = `republish of message '${options.messageId}' to '${queue}'`;
    if (outcome.kind === 'returned') throw new TransportError(`${what} was unroutable (${outcome.replyText})`, { code: 'PUBLISH_UNROUTABLE' });
    if (outcome.kind === 'nacked') throw nackError(`${what} was nacked`);
    if (outcome.kind === 'timeout') throw new TransportError(`${what} was not confirmed in time`, { code: 'PUBLISH_TIMEOUT' });
    const lost = outcome.channelError ? `lost its channel (${outcome.channelError.message})` : 'lost its connection';
    throw new TransportError(`${what} ${lost} before the confirm`, { cause: outcome.cause });
  }

  #connect(): Promise<void> {
    if (this.#connection) return Promise.resolve();
    this.#connecting ??= this.#open().finally(() => {
      this.#connecting = null;
    });
    return this.#connecting;
  }

  async #open(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const attempt = this.#factory();
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no connection within ${this.#connectTimeoutMs} ms`)), this.#connectTimeoutMs);
    });
    let connection: ChannelModel;
    try {
      connection = await Promise.race([attempt, timeout]);
    } catch (error) {
      // A factory that answers after the timeout must not leak its connection.
      attempt.then((late) => late.close().catch(() => undefined)).catch(() => undefined);
      if (!this.#closing) this.#scheduleReconnect();
      throw error;
    } finally {
      clearTimeout(timer);
    }
    // amqplib emits 'error' before 'close' on a connection failure; without a listener the
    // EventEmitter would throw it out of the socket handler and crash the process.
    connection.on('error', (error: Error) => this.#logger.warn('rabbitmq connection error', { error: describeError(error) }));
    connection.on('close', () => this.#onConnectionClosed(connection));
    connection.on('blocked', (reason: string) => this.#logger.warn('rabbitmq blocked publishing (resource alarm)', { reason }));
    connection.on('unblocked', () => this.#logger.info('rabbitmq unblocked publishing'));
    if (!batchSocketWrites(connection)) {
      this.#logger.debug('rabbitmq: amqplib internals differ from 2.x; socket writes are not batched', {});
    }
    // The publish channel (which declares the exchange) opens at the first publish, not
    // here: an operator command that only reads dead letters must create nothing on the
    // broker (a mistyped prefix once left an exchange behind).
    this.#connection = connection;
    if (this.#everConnected) {
      this.#stats.reconnects++;
      this.#logger.info('rabbitmq reconnected', { subscriptions: this.#subscriptions.size });
    }
    this.#everConnected = true;
    this.#reconnectAttempt = 0;
    if (this.#closing) return;
    for (const subscription of this.#subscriptions) subscription.resume();
  }

  #onConnectionClosed(connection: ChannelModel): void {
    if (this.#connection !== connection) return;
    this.#connection = null;
    this.#publisher = null;
    if (this.#closing) return;
    this.#stats.disconnects++;
    this.#logger.warn('rabbitmq connection lost; reconnecting', {});
    this.#scheduleReconnect();
  }

  #scheduleReconnect(): void {
    if (this.#closing || this.#reconnectTimer) return;
    const base = Math.min(this.#reconnectMaxMs, this.#reconnectInitialMs * 2 ** this.#reconnectAttempt);
    const delay = base * (0.5 + this.#random() / 2);
    this.#reconnectAttempt++;
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = null;
      this.#connect().catch((error: unknown) => {
        this.#logger.warn('rabbitmq reconnect failed', { attempt: this.#reconnectAttempt, error: describeError(error) });
      });
    }, delay);
  }
}

/** One message of a `publish` call whose channel the broker closed before confirming it. */
interface Suspect {
  readonly index: number;
  readonly envelope: Envelope;
}

/**
 * The broker's answers for one publish call's messages, gathered without a promise per
 * message: each outcome lands in `results` (or, for a channel the broker closed, in
 * `suspects`, to be sent again alone) as it arrives, and {@link all} resolves once every
 * message expected has its answer. A result that cannot be made (a logger throwing on a
 * return, say) rejects {@link all} with that error, as the per-message reaction did.
 */
class BatchAnswers implements OutcomeSink {
  readonly #messages: readonly Envelope[];
  readonly #results: PublishResult[];
  readonly #suspects: Suspect[];
  readonly #toResult: (envelope: Envelope, outcome: ConfirmOutcome) => PublishResult;
  #unanswered = 0;
  #failure: { readonly error: unknown } | undefined;
  #wake: (() => void) | undefined;

  constructor(messages: readonly Envelope[], results: PublishResult[], suspects: Suspect[], toResult: (envelope: Envelope, outcome: ConfirmOutcome) => PublishResult) {
    this.#messages = messages;
    this.#results = results;
    this.#suspects = suspects;
    this.#toResult = toResult;
  }

  /** One more message is about to be sent to this sink. */
  expect(): void {
    this.#unanswered++;
  }

  /** The message just expected was not sent after all (the send threw: it gets no answer). */
  unexpect(): void {
    this.#unanswered--;
  }

  /** Message `index` goes to the suspects without being sent on the shared channel. */
  suspect(index: number): void {
    this.#suspects.push({ index, envelope: this.#messages[index]! });
  }

  settle(index: number, outcome: ConfirmOutcome): void {
    const envelope = this.#messages[index]!;
    try {
      // The broker closed the channel: any unconfirmed message may be the cause, and the
      // connection is fine, so this is not an outage. Found out one at a time afterwards.
      if (outcome.kind === 'closed' && outcome.channelError !== null) this.#suspects.push({ index, envelope });
      else this.#results[index] = this.#toResult(envelope, outcome);
    } catch (error) {
      this.#failure ??= { error };
    }
    this.#unanswered--;
    if (this.#unanswered === 0) this.#wake?.();
  }

  /** Resolves once every expected message has its answer; call after the last send. */
  all(): Promise<void> {
    if (this.#unanswered > 0) {
      return new Promise<void>((resolve) => {
        this.#wake = resolve;
      }).then(() => this.#outcome());
    }
    return this.#outcome();
  }

  #outcome(): Promise<void> {
    return this.#failure === undefined ? Promise.resolve() : Promise.reject(this.#failure.error as Error);
  }
}

// AMQP reply code for content the broker refuses (CC/BCC of the wrong type, a message over
// max_message_size, a user_id that is not the connection's user, a malformed expiration).
const PRECONDITION_FAILED = 406;
// Enough to keep every live poison message; each entry is one messageId.
const MAX_REMEMBERED_POISON = 10_000;

// Far above any real browsing, within a signed 32-bit argument (see topology.ts).
const DEAD_LETTER_DELIVERY_LIMIT = 1_000_000_000;

/**
 * The failure of a nacked message. RabbitMQ nacks a publish when a queue it routes to is
 * full under `reject-publish` overflow (or, rarely, when a queue process fails): neither is
 * the message's fault, so it is back-pressure — the relay keeps the message, counts no
 * attempt and retries after a pause; nothing is dead-lettered because a queue was full.
 */
function nackError(what: string): TransportError {
  return new TransportError(`${what}: a queue it routes to is full (reject-publish overflow) or failed; retry once it drains`, {
    code: 'PUBLISH_BACKPRESSURE',
    retriable: true,
  });
}

/** Queue arguments a policy can also set (`message-ttl`, `max-length`, `max-length-bytes`, `overflow`). */
const POLICY_ARGUMENTS = new Set(['x-message-ttl', 'x-max-length', 'x-max-length-bytes', 'x-overflow']);

function declarationError(consumer: string, error: unknown): CourierError {
  if (error instanceof CourierError) return error;
  if ((error as { code?: unknown }).code === 406) {
    // `PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received … but current is …`
    const text = describeError(error);
    const match = /inequivalent arg '([^']+)' for queue '([^']+)'/.exec(text);
    const argument = match?.[1];
    const queue = match?.[2];
    if (argument !== undefined && queue !== undefined && QUEUE_LIMIT_ARGUMENTS.has(argument) && !POLICY_ARGUMENTS.has(argument)) {
      // The queue's type, priorities or dead-letter strategy: no policy changes those.
      return new ConfigError(
        `queue '${queue}' of consumer '${consumer}' exists with another '${argument}' than 'queueLimits.${consumer}' declares ` +
          `(maxPriority makes it a classic priority queue; drop-head changes its dead-letter strategy), and no policy can change ` +
          `that: drain and delete the queue (rabbitmqctl delete_queue ${queue}) so Courier creates it anew, or set ` +
          `'queueLimits.${consumer}' back to what the queue was created with (${text})`,
        { cause: error },
      );
    }
    if (argument !== undefined && queue !== undefined && QUEUE_LIMIT_ARGUMENTS.has(argument)) {
      return new ConfigError(
        `queue '${queue}' of consumer '${consumer}' exists with another '${argument}' than 'queueLimits.${consumer}' declares, and RabbitMQ ` +
          `cannot change a queue's arguments: either keep 'queueLimits.${consumer}' as the queue was created and change the limit with a ` +
          `policy (rabbitmqctl set_policy --apply-to queues <name> '^${queue.replaceAll('.', '\\.')}$' '{"max-length":…}'; where both ` +
          `set a length or TTL the lower wins), or drain and delete the queue (rabbitmqctl delete_queue ${queue}) so Courier creates it ` +
          `with the new limits (${text})`,
        { cause: error },
      );
    }
    if (argument !== undefined && queue !== undefined) {
      return new ConfigError(
        `queue '${queue}' of consumer '${consumer}' exists with another '${argument}' (was it declared ordered, or unordered, before?): ${text}`,
        { cause: error },
      );
    }
    return new ConfigError(`queues of consumer '${consumer}' exist with other settings (was it declared ordered, or unordered, before?): ${text}`, {
      cause: error,
    });
  }
  return new TransportError(`could not declare the topology of consumer '${consumer}': ${describeError(error)}`, { cause: error });
}
