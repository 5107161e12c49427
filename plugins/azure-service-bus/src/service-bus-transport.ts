import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  abortableSleep,
  noopLogger,
  decodeEnvelope,
  linkSignals,
  onAbort,
  payloadBytes,
  type DeadLetter,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type Logger,
  type PortLimits,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import {
  isServiceBusError,
  type ServiceBusClient,
  type ServiceBusMessage,
  type ServiceBusReceivedMessage,
  type ServiceBusReceiver,
  type ServiceBusReceiverOptions,
  type ServiceBusSender,
  type ServiceBusSessionReceiverOptions,
  type ServiceBusSessionReceiver,
} from '@azure/service-bus';
import { randomUUID } from 'node:crypto';
import Long from 'long';
import { ClientSource } from './client-source.js';

/** Configuration of {@link ServiceBusTransport}. */
export interface ServiceBusTransportConfig {
  /**
   * A factory of clients (`() => new ServiceBusClient(connectionString, { retryOptions })`),
   * or your one client. With a factory the transport owns the clients it makes: after a lost
   * connection it replaces the client (and with it every sender and receiver) at once, and
   * closes them on `close()`. Your own client is never closed by the transport (close it
   * after `transport.close()`), and cannot be replaced: after a cut connection
   * `@azure/service-bus` 7.9.5 can take its 60 s operation timeout to send and receive
   * again. Prefer the factory.
   */
  readonly client: ServiceBusClient | (() => ServiceBusClient);
  /**
   * What a Courier topic is on the namespace, for the whole transport:
   * - `'topics'` (default): the Service Bus topic `<prefix><topic>`; a consumer (group) is
   *   the subscription of its name on each of its topics, so every group gets each message
   *   (`fanOut`).
   * - `'queues'`: the Service Bus queue `<prefix><topic>` (a Basic-tier namespace has no
   *   topics). Every receiver of a queue competes for its messages, whatever its consumer
   *   group, so the transport declares `fanOut: false` and the bus refuses a second group on
   *   a topic: give each topic exactly one consumer group, in every process. Dead letters
   *   are in the queue's `$DeadLetterQueue`, marked with the group that dead-lettered them.
   */
  readonly entities?: 'topics' | 'queues';
  /**
   * Every message is sent with a sessionId (its key, or its messageId when it has none) and
   * the transport declares `orderingByKey`. Topics: ordered endpoints read session-enabled
   * subscriptions, unordered ones plain subscriptions. Queues: the queues must be
   * session-enabled (a session-enabled queue refuses messages without a sessionId, and a
   * plain one has no sessions), and every endpoint, ordered or not, receives through
   * sessions: at most `concurrency` keys at a time, each key's messages one at a time.
   * Default false: no sessionId is sent, `ordered: true` subscriptions are refused, and
   * queues must not be session-enabled.
   */
  readonly sessions?: boolean;
  /** Prefix of every topic or queue name (`<prefix><topic>`); letters, digits, `.`, `-`, `_`. Default none. */
  readonly prefix?: string;
  /** Longest wait for the broker's answer to one send before `PUBLISH_TIMEOUT`. Default 10 s. */
  readonly publishTimeoutMs?: number;
  /**
   * How long the SDK keeps renewing the lock of a delivery whose handler (or retry delay)
   * is still running. Default 5 min; after it the lock lapses and the broker redelivers.
   */
  readonly maxLockRenewalMs?: number;
  /** Largest payload (UTF-8 bytes of `envelope.payload`) declared; keep it under the entity's limit minus ~16 KiB of properties. Default 240 KiB (Standard tier: 256 KiB). */
  readonly maxMessageBytes?: number;
  /**
   * Topics whose dead letters `deadLetters` reads besides those this instance subscribed or
   * published to: a list, or a function asked at each call (say, from your provisioning).
   * Service Bus keeps dead letters per subscription, so an operator tool that subscribes
   * nothing must name the topics.
   */
  readonly topics?: readonly string[] | (() => Iterable<string>);
  /**
   * The broker-level MessageId of a send (default: `envelope.messageId`, so duplicate
   * detection drops a re-published message). Tests use it to send a second copy.
   */
  readonly brokerMessageId?: (envelope: Envelope) => string;
  /**
   * Where the transport reports what it does on its own: so far, a client given up after a
   * lost connection whose close it stopped waiting for in `close()` (warn). Default silent.
   */
  readonly logger?: Logger;
}

const P = {
  version: 'courier-version',
  topic: 'courier-topic',
  occurredAt: 'courier-occurred-at',
  key: 'courier-key',
  causationId: 'courier-causation-id',
  traceparent: 'traceparent',
  tracestate: 'tracestate',
  headers: 'courier-headers',
  messageId: 'courier-message-id',
  attempt: 'courier-attempt',
  replayedFor: 'courier-replayed-for',
  deadAt: 'courier-dead-at',
  /** The consumer (group) that dead-lettered the message: a queue's dead letters are shared by all its receivers. */
  deadFor: 'courier-dead-for',
} as const;

/** ServiceBusError codes that mean the namespace or the connection, not the message: the relay pauses. */
const CONNECTIVITY = new Set(['ServiceBusy', 'ServiceCommunicationProblem', 'ServiceTimeout']);
const NAME_PATTERN = /^[A-Za-z0-9._-]{0,100}$/;

const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));
const codeOf = (error: unknown): string | undefined => (isServiceBusError(error) ? error.code : (error as { code?: string } | undefined)?.code);
/**
 * A ServiceBusError (or any error of a send) as a transport error: `ServiceBusy` and the
 * connection codes are retriable connectivity (`TRANSPORT`: the relay pauses without
 * counting attempts); `MessageSizeExceeded` is `PAYLOAD_TOO_LARGE`; the rest are
 * `PUBLISH_REJECTED`, retriable only when the SDK says the error is.
 */
export function toTransportError(caught: unknown, what: string): CourierError {
  if (caught instanceof CourierError) return caught;
  // After its own retries the SDK throws an AggregateError of the attempts: the last one says why.
  const error = caught instanceof AggregateError && caught.errors.length > 0 ? caught.errors[caught.errors.length - 1] : caught;
  const code = codeOf(error);
  const message = `${what}: ${code ? `[${code}] ` : ''}${describe(error)}`;
  if (code === 'MessageSizeExceeded') return new SerializationError('PAYLOAD_TOO_LARGE', message, { cause: caught });
  if (code !== undefined && CONNECTIVITY.has(code)) return new TransportError(message, { cause: error });
  // The SDK reports socket failures (refused, reset) as GeneralError: the connection, not the message.
  if (code === 'GeneralError' && /ECONN|EPIPE|socket|disconnect|connection/i.test(describe(error))) return new TransportError(message, { cause: error });
  if (isServiceBusError(error)) return new TransportError(message, { code: 'PUBLISH_REJECTED', retriable: error.retryable, cause: error });
  // Not a ServiceBusError: a socket or AMQP-level failure of the connection.
  return new TransportError(message, { cause: error });
}

/**
 * Courier transport on Azure Service Bus (`@azure/service-bus` 7.9): a Courier topic is a
 * Service Bus topic, a consumer is a subscription of that name on each of its topics; or,
 * with `entities: 'queues'`, a Courier topic is a queue and every consumer of it competes
 * for its messages (`fanOut: false`, see {@link ServiceBusTransportConfig.entities}).
 *
 * Guarantees: `publish` sends in `createMessageBatch` batches (split when full; a batch the
 * broker refuses is sent again one message at a time, so one refusal fails alone) and
 * answers one result per message once the send resolved. Deliveries are received in
 * peek-lock and completed only when the core acks, i.e. after the handler's transaction
 * committed; the SDK renews the lock while a handler runs. `attempt` travels in the
 * `courier-attempt` application property (the broker's deliveryCount also counts crash
 * redeliveries). `retry` waits in place with the lock renewed, then abandons with the
 * attempt raised; `deadLetter` uses the subscription's dead-letter sub-queue with reason
 * and description (the queue's in queue mode). Ordered endpoints use sessions (see `sessions`). Given a factory as
 * `client`, a lost connection replaces the client with every sender and receiver on it, so
 * sending and receiving resume as soon as the broker answers again; until then `publish`
 * rejects retriably.
 */
export class ServiceBusTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  /** Subscription names hold 50 characters; topic names 260 with the prefix. */
  readonly limits: PortLimits;
  readonly deadLetters: TransportDeadLetters;
  readonly #config: Required<Omit<ServiceBusTransportConfig, 'topics' | 'brokerMessageId' | 'logger'>> & Pick<ServiceBusTransportConfig, 'brokerMessageId' | 'topics'>;
  /** Queue mode (`entities: 'queues'`). */
  readonly #queues: boolean;
  readonly #source: ClientSource;
  /** Where the subscriptions report settles that failed (an abandon retried, say). */
  readonly logger: Logger;
  readonly #senders = new Map<string, { sender: ServiceBusSender; generation: number }>();
  readonly #subscriptions = new Set<ServiceBusSubscription>();
  readonly #topics = new Set<string>();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(config: ServiceBusTransportConfig) {
    const problems: string[] = [];
    if (!config?.client || (typeof config.client !== 'function' && typeof config.client.createSender !== 'function')) problems.push("'client' must be a ServiceBusClient or a function that makes one");
    const prefix = config?.prefix ?? '';
    if (!NAME_PATTERN.test(prefix)) problems.push(`'prefix' must be up to 100 letters, digits, '.', '-' or '_', got ${JSON.stringify(prefix)}`);
    const positive = (name: string, value: number) => {
      if (!Number.isSafeInteger(value) || value <= 0) problems.push(`'${name}' must be a positive integer, got ${value}`);
    };
    const publishTimeoutMs = config?.publishTimeoutMs ?? 10_000;
    positive('publishTimeoutMs', publishTimeoutMs);
    const maxLockRenewalMs = config?.maxLockRenewalMs ?? 300_000;
    positive('maxLockRenewalMs', maxLockRenewalMs);
    const maxMessageBytes = config?.maxMessageBytes ?? 240 * 1024;
    positive('maxMessageBytes', maxMessageBytes);
    const entities = config?.entities ?? 'topics';
    if (entities !== 'topics' && entities !== 'queues') problems.push(`'entities' must be 'topics' or 'queues', got ${JSON.stringify(entities)}`);
    if (problems.length > 0) throw new ConfigError(problems);
    this.#queues = entities === 'queues';
    // A client still connecting gets two publish deadlines before a timeout gives it up.
    // A given-up client's close is waited for 2 s at most (see ClientSource): `bus.stop()` must not hang on a dead connection.
    this.#source = new ClientSource(config.client, { patienceMs: 2 * publishTimeoutMs, abandonCloseAfterMs: 2_000, logger: config.logger });
    this.logger = config.logger ?? noopLogger;
    this.#config = { client: config.client, entities, sessions: config.sessions ?? false, prefix, publishTimeoutMs, maxLockRenewalMs, maxMessageBytes, brokerMessageId: config.brokerMessageId, topics: config.topics };
    this.capabilities = {
      orderingByKey: this.#config.sessions,
      orderedPipelining: false,
      // A queue has one copy of each message for all its receivers.
      fanOut: !this.#queues,
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes,
      publishTimeoutMs,
    };
    // Service Bus: subscription names up to 50 characters (a queue's consumer is no entity
    // name: unbounded there); sessionId and messageId up to 128.
    this.limits = this.#queues ? { id: { bytes: 128 }, key: { bytes: 128 } } : { consumer: { bytes: 50 }, id: { bytes: 128 }, key: { bytes: 128 } };
    this.deadLetters = {
      list: (consumer: string, options?: { limit?: number }) => this.#listDead(consumer, options?.limit ?? 100),
      replay: (consumer: string, ids: readonly string[]) => this.#takeDead(consumer, ids, 'replay'),
      purge: (consumer: string, ids: readonly string[]) => this.#takeDead(consumer, ids, 'purge'),
    };
  }

  /** The Service Bus topic (queue in queue mode) of a Courier topic. */
  entityOf(topic: string): string {
    return `${this.#config.prefix}${topic}`;
  }

  /** Whether this transport maps topics onto queues (`entities: 'queues'`). */
  get queueMode(): boolean {
    return this.#queues;
  }

  /**
   * @internal Whether `endpoint` receives through sessions: ordered endpoints, and in queue
   * mode with `sessions` every endpoint (a session-enabled queue has no other receivers).
   */
  receivesSessions(endpoint: Endpoint): boolean {
    return endpoint.ordered || (this.#queues && this.#config.sessions);
  }

  /**
   * @internal A receiver of what `consumer` reads of `topic`: its subscription, or in queue
   * mode the queue itself (every consumer of a queue reads the same messages).
   */
  receiverOf(client: ServiceBusClient, topic: string, consumer: string, options: ServiceBusReceiverOptions): ServiceBusReceiver {
    return this.#queues ? client.createReceiver(this.entityOf(topic), options) : client.createReceiver(this.entityOf(topic), consumer, options);
  }

  /** @internal Locks the named session of what `consumer` reads of `topic` (see {@link receiverOf}). */
  acceptSessionOf(client: ServiceBusClient, topic: string, consumer: string, sessionId: string, options: ServiceBusSessionReceiverOptions): Promise<ServiceBusSessionReceiver> {
    return this.#queues ? client.acceptSession(this.entityOf(topic), sessionId, options) : client.acceptSession(this.entityOf(topic), consumer, sessionId, options);
  }

  /** @internal Locks the next free session with messages of what `consumer` reads of `topic` (see {@link receiverOf}). */
  acceptNextSessionOf(client: ServiceBusClient, topic: string, consumer: string, options: ServiceBusSessionReceiverOptions): Promise<ServiceBusSessionReceiver> {
    return this.#queues ? client.acceptNextSession(this.entityOf(topic), options) : client.acceptNextSession(this.entityOf(topic), consumer, options);
  }

  /** @internal The clients this transport works through (for its subscriptions). */
  get source(): ClientSource {
    return this.#source;
  }

  /** The sender of a topic on the current client, and that client's generation. */
  #sender(topic: string): { sender: ServiceBusSender; generation: number } {
    const entity = this.entityOf(topic);
    const { client, generation } = this.#source.current;
    let entry = this.#senders.get(entity);
    if (!entry || entry.generation !== generation || entry.sender.isClosed) {
      // A replaced client's senders close with it.
      entry = { sender: client.createSender(entity), generation };
      this.#senders.set(entity, entry);
    }
    return entry;
  }

  /**
   * A failure that means the connection, not the message (throttling excluded): the client
   * is replaced — after a timeout only if it has answered before (see ClientSource).
   */
  #check(failure: CourierError, generation: number): void {
    if (failure.code === 'PUBLISH_TIMEOUT' || (failure.code === 'TRANSPORT' && codeOf(failure.cause) !== 'ServiceBusy')) {
      this.#source.lost(generation, { timedOut: failure.code === 'PUBLISH_TIMEOUT' || codeOf(failure.cause) === 'ServiceTimeout' });
    }
  }

  /** The Service Bus message of an envelope: native properties, the rest as application properties. */
  toMessage(envelope: Envelope, attempt = 1, extra: Record<string, string | number | boolean> = {}): ServiceBusMessage {
    const properties: Record<string, string | number | boolean> = {
      [P.version]: envelope.version,
      [P.topic]: envelope.topic,
      [P.occurredAt]: envelope.occurredAt,
      [P.headers]: JSON.stringify(envelope.headers),
      [P.messageId]: envelope.messageId,
      ...extra,
    };
    if (envelope.key !== null) properties[P.key] = envelope.key;
    if (envelope.causationId !== null) properties[P.causationId] = envelope.causationId;
    if (envelope.traceparent !== null) properties[P.traceparent] = envelope.traceparent;
    if (envelope.tracestate !== null) properties[P.tracestate] = envelope.tracestate;
    if (attempt !== 1) properties[P.attempt] = attempt;
    const message: ServiceBusMessage = {
      messageId: this.#config.brokerMessageId?.(envelope) ?? envelope.messageId,
      subject: envelope.type,
      contentType: 'application/json',
      // A data section: the payload's bytes travel exactly as the outbox stored them.
      body: Buffer.from(envelope.payload, 'utf8'),
      applicationProperties: properties,
    };
    message.correlationId = envelope.correlationId;
    if (this.#config.sessions) message.sessionId = envelope.key ?? envelope.messageId;
    return message;
  }

  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    if (this.#closed) throw new ClosedError('ServiceBusTransport');
    if (options.signal?.aborted) throw new TransportError('publish aborted before sending', { code: 'ABORTED', retriable: true });
    const results: (PublishResult | undefined)[] = messages.map(() => undefined);
    // Groups of consecutive messages per topic, in input order.
    const pending: { index: number; envelope: Envelope }[] = [];
    messages.forEach((envelope, index) => {
      if (payloadBytes(envelope) > this.capabilities.maxMessageBytes) {
        results[index] = { messageId: envelope.messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of ${payloadBytes(envelope)} bytes is over maxMessageBytes ${this.capabilities.maxMessageBytes}`) };
      } else pending.push({ index, envelope });
    });
    let sentAny = false;
    let firstConnectivity: CourierError | undefined;
    const settle = (group: { index: number; envelope: Envelope }[], result: CourierError | undefined) => {
      for (const { index, envelope } of group) results[index] = result ? { messageId: envelope.messageId, ok: false, error: result } : { messageId: envelope.messageId, ok: true };
    };
    while (pending.length > 0) {
      if (options.signal?.aborted) {
        settle(pending.splice(0), new TransportError('publish aborted', { code: 'ABORTED', retriable: true }));
        break;
      }
      const topic = pending[0]!.envelope.topic;
      this.#topics.add(topic);
      const { sender, generation } = this.#sender(topic);
      // Operations on a client end when it is given up (replaced or closed), not at their deadline.
      const { signal: retired } = this.#source.current;
      let batch;
      try {
        batch = await this.#withTimeout(() => sender.createMessageBatch({ abortSignal: retired }), 'createMessageBatch');
        this.#source.answered(generation);
      } catch (error) {
        const failure = toTransportError(error, `cannot open a batch on ${this.entityOf(topic)}`);
        this.#check(failure, generation);
        if (!sentAny && isConnectivity(failure)) throw failure;
        settle(pending.splice(0), failure);
        break;
      }
      const group: { index: number; envelope: Envelope }[] = [];
      while (pending.length > 0 && pending[0]!.envelope.topic === topic) {
        const next = pending[0]!;
        if (!batch.tryAddMessage(this.toMessage(next.envelope))) break;
        group.push(pending.shift()!);
      }
      if (group.length === 0) {
        // Does not fit in an empty batch: too large with its properties.
        const next = pending.shift()!;
        settle([next], new SerializationError('PAYLOAD_TOO_LARGE', `message ${next.envelope.messageId} with its properties is over the entity's ${batch.maxSizeInBytes} bytes`));
        continue;
      }
      const failure = await this.#send(sender, batch, group.length, retired);
      sentAny = true;
      if (failure) this.#check(failure, generation);
      else this.#source.answered(generation);
      if (!failure) {
        settle(group, undefined);
        continue;
      }
      if (isConnectivity(failure) || group.length === 1) {
        if (isConnectivity(failure)) firstConnectivity ??= failure;
        settle(group, failure);
        continue;
      }
      // The broker refused the batch as a whole: send its messages alone, so a refusal fails only its own.
      for (const item of group) {
        const alone = await this.#send(sender, [this.toMessage(item.envelope)], 1, retired);
        settle([item], alone);
      }
    }
    const final = results.map((result, index) => result ?? { messageId: messages[index]!.messageId, ok: false as const, error: new TransportError('not sent') });
    // Nothing answered and the connection is gone: reject as a whole, so the relay pauses.
    if (firstConnectivity && final.every((result) => !result.ok && isConnectivity(result.error))) throw firstConnectivity;
    return final;
  }

  async #send(sender: ServiceBusSender, batch: Parameters<ServiceBusSender['sendMessages']>[0], count: number, retired: AbortSignal): Promise<CourierError | undefined> {
    try {
      await this.#withTimeout(() => sender.sendMessages(batch, { abortSignal: retired }), `send of ${count} message(s)`);
      return undefined;
    } catch (error) {
      return toTransportError(error, `send to ${sender.entityPath}`);
    }
  }

  /**
   * Resolves as `run` does, or rejects with `PUBLISH_TIMEOUT` once `publishTimeoutMs`
   * passed. The SDK operation is not aborted then, only when its client is given up (the
   * caller passes that client's signal): aborting one while the client's connection is still
   * being opened left that client unusable (its next operation failed with "Invalid protocol
   * header for AMQP", seen behind a slow link), so a slow handshake could never complete; and
   * an operation nobody aborts holds its client's close for the SDK's 60 s. A send that
   * completes late is harmless: the relay sends the message again under the same MessageId,
   * which duplicate detection drops.
   */
  async #withTimeout<T>(run: () => Promise<T>, what: string): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(new TransportError(`${what}: no answer within ${this.#config.publishTimeoutMs} ms`, { code: 'PUBLISH_TIMEOUT', retriable: true }));
      }, this.#config.publishTimeoutMs);
    });
    try {
      return await Promise.race([run(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    if (this.#closed) throw new ClosedError('ServiceBusTransport');
    if (endpoint.ordered && !this.#config.sessions) throw new ConfigError(`consumer ${endpoint.consumer}: ordered endpoints need 'sessions: true' and session-enabled ${this.#queues ? 'queues' : 'subscriptions'}`);
    for (const topic of endpoint.topics) this.#topics.add(topic);
    const subscription = new ServiceBusSubscription(this, endpoint, handler, this.#config.maxLockRenewalMs);
    this.#subscriptions.add(subscription);
    subscription.onClosed = () => this.#subscriptions.delete(subscription);
    try {
      await subscription.start();
    } catch (error) {
      await subscription.close();
      // A failure because close() began meanwhile is the close's doing: retrying it is pointless.
      if (this.#closed) throw new ClosedError('ServiceBusTransport', { cause: error });
      throw toTransportError(error, `cannot subscribe ${endpoint.consumer}`);
    }
    // close() overtook the start (and stopped this subscription): say so rather than hand
    // back a subscription that never receives.
    if (this.#closed) throw new ClosedError('ServiceBusTransport');
    return subscription;
  }

  /** Decodes a received message into an envelope (throws `SerializationError` ENVELOPE_INVALID). */
  fromMessage(message: ServiceBusReceivedMessage): Envelope {
    const properties = message.applicationProperties ?? {};
    const optional = (name: string) => (properties[name] === undefined || properties[name] === null ? null : String(properties[name]));
    let headers: unknown;
    try {
      headers = JSON.parse(String(properties[P.headers] ?? '{}'));
    } catch {
      headers = properties[P.headers];
    }
    const body = message.body as unknown;
    return decodeEnvelope({
      messageId: optional(P.messageId) ?? message.messageId,
      type: message.subject,
      version: properties[P.version],
      topic: properties[P.topic],
      occurredAt: properties[P.occurredAt],
      key: optional(P.key),
      correlationId: message.correlationId === undefined || message.correlationId === null ? undefined : String(message.correlationId),
      causationId: optional(P.causationId),
      traceparent: optional(P.traceparent),
      tracestate: optional(P.tracestate),
      headers,
      payload: Buffer.isBuffer(body) ? body.toString('utf8') : typeof body === 'string' ? body : body,
    });
  }

  /**
   * Whether a lock of this message ran out before (a receiver died or stalled with it). The
   * broker's deliveryCount starts at 1 and grows with every abandon and every expired lock;
   * the transport abandons only for a `retry` (ordered or not), each time raising
   * `courier-attempt` in the same settle, so the deliveries beyond `1 + (attempt - 1)` are
   * lost locks (a renewal that came too late included: the broker handed the message out
   * again). Without a deliveryCount the transport cannot tell and says true, as the
   * `Delivery.redelivered` contract asks.
   */
  static redeliveredOf(message: ServiceBusReceivedMessage, attempt: number): boolean {
    const count = message.deliveryCount;
    if (typeof count !== 'number' || !Number.isFinite(count)) return true;
    return count - (attempt - 1) > 1;
  }

  /** The attempt a received message carries (absent: 1). */
  static attemptOf(message: ServiceBusReceivedMessage): number {
    const value = Number(message.applicationProperties?.[P.attempt] ?? 1);
    return Number.isSafeInteger(value) && value >= 1 ? value : 1;
  }

  #deadReceiver(topic: string, consumer: string): ServiceBusReceiver {
    return this.receiverOf(this.#source.current.client, topic, consumer, { subQueueType: 'deadLetter', skipParsingBodyAsJson: true, maxAutoLockRenewalDurationInMs: 0 });
  }

  /**
   * Whether a dead letter is `consumer`'s. A subscription's are all its own; a queue's are
   * shared by every receiver of the queue, so those another group dead-lettered (marked
   * `courier-dead-for`) are not. Unmarked ones (the broker's own, MaxDeliveryCountExceeded)
   * count for every group: with one group per queue they are that group's.
   */
  #deadFor(message: ServiceBusReceivedMessage, consumer: string): boolean {
    if (!this.#queues) return true;
    const owner = message.applicationProperties?.[P.deadFor];
    return owner === undefined || owner === null || owner === consumer;
  }

  async #listDead(consumer: string, limit: number): Promise<readonly DeadLetter[]> {
    const letters: DeadLetter[] = [];
    for (const topic of this.#knownTopics()) {
      const receiver = this.#deadReceiver(topic, consumer);
      try {
        // Always from an explicit sequence number: without one the SDK continues after the
        // last message any receiver of this entity peeked (its management link keeps it).
        let from = Long.ZERO;
        while (letters.length < limit) {
          const page = await receiver.peekMessages(Math.min(100, limit - letters.length), { fromSequenceNumber: from });
          if (page.length === 0) break;
          for (const message of page) {
            if (this.#deadFor(message, consumer) && letters.length < limit) letters.push(this.#letterOf(topic, consumer, message));
            if (message.sequenceNumber) from = message.sequenceNumber.add(1);
          }
        }
      } catch (error) {
        if (codeOf(error) !== 'MessagingEntityNotFound') throw toTransportError(error, `cannot list dead letters of ${consumer}`);
      } finally {
        await receiver.close().catch(() => undefined);
      }
    }
    return letters.slice(0, limit);
  }

  #knownTopics(): Set<string> {
    const given = this.#config.topics;
    return new Set([...this.#topics, ...(typeof given === 'function' ? given() : (given ?? []))]);
  }

  #letterOf(topic: string, consumer: string, message: ServiceBusReceivedMessage): DeadLetter {
    let envelope: Envelope;
    try {
      envelope = this.fromMessage(message);
    } catch {
      envelope = decodeEnvelope({ messageId: String(message.messageId ?? 'unknown'), type: 'courier.Undecodable', version: 1, topic, occurredAt: new Date(0).toISOString(), key: null, correlationId: String(message.messageId ?? 'unknown'), causationId: null, traceparent: null, tracestate: null, headers: {}, payload: 'null' });
    }
    const deadAt = message.applicationProperties?.[P.deadAt];
    return {
      // `<topic>:<sequenceNumber>`, one printable line: operators copy it from `courier dead
      // list` into `dlq:<consumer>:<id>` (a newline here made every such reference unusable).
      id: `${topic}:${message.sequenceNumber?.toString() ?? ''}`,
      consumer,
      envelope,
      reason: { code: message.deadLetterReason ?? 'UNKNOWN', message: message.deadLetterErrorDescription ?? '' },
      attempt: ServiceBusTransport.attemptOf(message),
      deadAt: typeof deadAt === 'string' ? new Date(deadAt) : (message.enqueuedTimeUtc ?? new Date(0)),
    };
  }

  /**
   * Replay or purge dead letters by id: received from the dead-letter sub-queue in
   * peek-lock, the wanted ones completed (after their copy was sent, for a replay), the
   * others abandoned. A replay is published to the topic with `courier-replayed-for` =
   * consumer: every subscription of the topic receives it, only this consumer runs it as a
   * replay; the others drop it through their inbox as the duplicate it is for them. In
   * queue mode the copy goes to the queue, and the ids of another group's dead letters are
   * left alone.
   */
  async #takeDead(consumer: string, ids: readonly string[], action: 'replay' | 'purge'): Promise<number> {
    const byTopic = new Map<string, Set<string>>();
    for (const id of ids) {
      // The sequence number is the digits after the last ':' (earlier builds put a newline there; still read).
      const parsed = /^(.+)[:\n](\d+)$/s.exec(id);
      if (!parsed) continue;
      const [, topic, sequence] = parsed as unknown as [string, string, string];
      const set = byTopic.get(topic) ?? new Set<string>();
      set.add(sequence);
      byTopic.set(topic, set);
    }
    let done = 0;
    for (const [topic, wanted] of byTopic) {
      const receiver = this.#deadReceiver(topic, consumer);
      const others: ServiceBusReceivedMessage[] = [];
      try {
        for (let round = 0; round < 20 && wanted.size > 0; round += 1) {
          const got = await receiver.receiveMessages(100, { maxWaitTimeInMs: 1_000 });
          if (got.length === 0) break;
          for (const message of got) {
            const sequence = message.sequenceNumber?.toString() ?? '';
            if (!wanted.has(sequence) || !this.#deadFor(message, consumer)) {
              others.push(message);
              continue;
            }
            if (action === 'replay') {
              const envelope = this.fromMessage(message);
              const copy = this.toMessage(envelope, 1, { [P.replayedFor]: consumer });
              // Another broker id than the original's, so duplicate detection keeps the replay.
              copy.messageId = `${envelope.messageId}#replay-${sequence}`;
              await this.#sender(topic).sender.sendMessages(copy);
            }
            await receiver.completeMessage(message);
            wanted.delete(sequence);
            done += 1;
          }
        }
      } catch (error) {
        throw toTransportError(error, `cannot ${action} dead letters of ${consumer}`);
      } finally {
        for (const message of others) await receiver.abandonMessage(message).catch(() => undefined);
        await receiver.close().catch(() => undefined);
      }
    }
    return done;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#closing ??= (async () => {
      await Promise.all([...this.#subscriptions].map((subscription) => subscription.close()));
      // Senders of a given-up client close with it (its close is bounded, see ClientSource);
      // waited for here, their close on a dead connection could take the SDK's 60 s.
      const live = this.#source.current.generation;
      await Promise.all(
        [...this.#senders.values()].filter(({ generation }) => generation === live).map(({ sender }) => sender.close().catch(() => undefined)),
      );
      await this.#source.close();
    })();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** An operation that outlived the deadline {@link deadline} gave it. */
class DeadlineMissed extends Error {
  override readonly name = 'DeadlineMissed';
}

/** Resolves as `promise` does, or rejects once `ms` passed. */
async function deadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([promise, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new DeadlineMissed(`no answer within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether a failed receive or accept means the connection is gone (throttling aside), and
 * whether by a timeout (ours or the SDK's): undefined when it does not. The client is then
 * reported lost.
 */
function connectionLoss(error: unknown): { timedOut: boolean } | undefined {
  const failure = toTransportError(error, 'receive');
  const lost = (failure.code === 'TRANSPORT' || failure.code === 'PUBLISH_TIMEOUT') && codeOf(failure.cause) !== 'ServiceBusy' && codeOf(error) !== 'SessionLockLost' && codeOf(error) !== 'MessageLockLost';
  return lost ? { timedOut: error instanceof DeadlineMissed || codeOf(failure.cause) === 'ServiceTimeout' } : undefined;
}

/**
 * Resolves as `promise` does, or rejects once `signal` aborts; a value that arrives after
 * that is handed to `late` (say, to close a receiver nobody will use).
 */
async function untilAborted<T>(promise: Promise<T>, signal: AbortSignal, late: (value: T) => void): Promise<T> {
  if (signal.aborted) {
    void promise.then(late, () => undefined);
    throw new Error('aborted');
  }
  let cancel: (() => void) | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        cancel = onAbort(signal, () => {
          void promise.then(late, () => undefined);
          reject(new Error('aborted'));
        });
      }),
    ]);
  } finally {
    cancel?.();
  }
}

/**
 * A settle (complete, abandon, dead-letter) on a client that may be given up meanwhile:
 * resolves as the settle does, or rejects once the client is given up. Why: a settle sent on
 * a connection that was cut waits for the SDK's 60 s operation timeout, and the subscription's
 * close waits for its in-flight deliveries, so `bus.stop()` hung a minute. The message was not
 * settled either way; it comes back after its lock.
 */
const onLiveClient = (settle: Promise<void>, givenUp: AbortSignal): Promise<void> =>
  untilAborted(settle, givenUp, () => undefined).catch((error: unknown) => {
    if (givenUp.aborted) throw new Error('its client was given up after a lost connection; the message comes back after its lock', { cause: error });
    throw error;
  });

/** Longest dead-letter reason and description Service Bus takes, in characters. */
const DEAD_TEXT_MAX = 4_096;

/** `text` cut to at most `max` UTF-16 characters (a split surrogate pair dropped), the cut marked with `…`. */
function cutText(text: string, max: number): string {
  if (text.length <= max) return text;
  return `${text.slice(0, max - 1).replace(/[\uD800-\uDBFF]$/u, '')}…`;
}

const isConnectivity = (error: CourierError): boolean => error.code === 'TRANSPORT' || error.code === 'PUBLISH_TIMEOUT' || error.code === 'CLOSED';

/** A pending in-place retry: after the delay the message is abandoned with the attempt raised. */
interface ParkedRetry {
  readonly delayMs: number;
  readonly attempt: number;
}

/**
 * One subscribed endpoint: a peek-lock receiver per topic (unordered), or session
 * receivers that each hold one key's session at a time (ordered; in queue mode with `sessions`, every endpoint).
 */
class ServiceBusSubscription implements Subscription {
  onClosed: (() => void) | undefined;
  readonly #stop = new AbortController();
  readonly #inFlight = new Set<Promise<void>>();
  readonly #receivers = new Set<ServiceBusReceiver | ServiceBusSessionReceiver>();
  readonly #loops = new Set<Promise<void>>();
  #slots: number;
  readonly #waiting: (() => void)[] = [];
  #parked = 0;
  #closing: Promise<void> | undefined;

  constructor(
    private readonly transport: ServiceBusTransport,
    private readonly endpoint: Endpoint,
    private readonly handler: DeliveryHandler,
    private readonly maxLockRenewalMs: number,
  ) {
    this.#slots = endpoint.concurrency;
  }

  async start(): Promise<void> {
    if (this.transport.receivesSessions(this.endpoint)) {
      // Lock a session of our own (empty, so nobody else's) on each topic before returning:
      // subscribe then fails while the entity is missing or the broker away, and the
      // subscription is known to the broker before the caller publishes (the next-session
      // accepts below may wait, and tell nothing, until a session has messages).
      const { client, generation } = this.transport.source.current;
      for (const topic of this.endpoint.topics) {
        const probe = await this.transport.acceptSessionOf(client, topic, this.endpoint.consumer, `courier-probe-${randomUUID()}`, { maxAutoLockRenewalDurationInMs: 0 });
        this.transport.source.answered(generation);
        await probe.close().catch(() => undefined);
      }
      for (const topic of this.endpoint.topics) {
        for (let index = 0; index < this.endpoint.concurrency; index += 1) this.#spawnSessionLoop(topic);
      }
      return;
    }
    for (const topic of this.endpoint.topics) {
      // Reaching the entity now makes subscribe fail while the broker is away.
      const { client, generation } = this.transport.source.current;
      const probe = this.#receiver(client, topic);
      try {
        await probe.peekMessages(1);
        this.transport.source.answered(generation);
      } finally {
        await probe.close().catch(() => undefined);
      }
    }
    for (const topic of this.endpoint.topics) {
      const loop = this.#receiveLoop(topic);
      this.#loops.add(loop);
      void loop.finally(() => this.#loops.delete(loop));
    }
  }

  #receiver(client: ServiceBusClient, topic: string): ServiceBusReceiver {
    return this.transport.receiverOf(client, topic, this.endpoint.consumer, {
      receiveMode: 'peekLock',
      skipParsingBodyAsJson: true,
      maxAutoLockRenewalDurationInMs: this.maxLockRenewalMs,
    });
  }

  /**
   * Receives as many messages as handler slots are free and runs them. A receive that
   * fails on the connection or hangs (the SDK can wait a minute re-opening a link after a
   * lost connection) reports the client lost, so the next receiver is made on a fresh
   * client and delivery resumes soon after the broker is back.
   */
  async #receiveLoop(topic: string): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const current = this.transport.source.current;
      const linked = linkSignals([signal, current.signal]);
      const both = linked.signal;
      let receiver: ServiceBusReceiver;
      try {
        receiver = this.#receiver(current.client, topic);
      } catch (error) {
        linked.dispose();
        throw error;
      }
      this.#receivers.add(receiver);
      try {
        while (!both.aborted) {
          await this.#acquire();
          let reserved = 1;
          while (this.#slots > 0) {
            this.#slots -= 1;
            reserved += 1;
          }
          let messages: ServiceBusReceivedMessage[] = [];
          try {
            messages = await deadline(receiver.receiveMessages(reserved, { maxWaitTimeInMs: 1_000, abortSignal: both }), 10_000);
            this.transport.source.answered(current.generation);
          } finally {
            for (let index = messages.length; index < reserved; index += 1) this.#release();
          }
          for (const message of messages) this.#track(this.#handle(receiver, message, current.signal).finally(() => this.#release()));
        }
      } catch (error) {
        const loss = both.aborted ? undefined : connectionLoss(error);
        if (loss) this.transport.source.lost(current.generation, loss);
        await abortableSleep(250, signal);
      } finally {
        linked.dispose();
        this.#receivers.delete(receiver);
        void receiver.close().catch(() => undefined);
      }
    }
  }

  #track(run: Promise<void>): void {
    this.#inFlight.add(run);
    void run.finally(() => this.#inFlight.delete(run));
  }

  async #acquire(): Promise<void> {
    if (this.#slots > 0) {
      this.#slots -= 1;
      return;
    }
    await new Promise<void>((resolve) => this.#waiting.push(resolve));
  }

  #release(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else this.#slots += 1;
  }

  /** Runs the handler for one message; returns the retry the handler asked for, if it did. */
  async #handle(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, givenUp: AbortSignal): Promise<void> {
    const parked = await this.#deliver(receiver, message, givenUp);
    if (parked) {
      // Unordered: the delay runs outside the handler slot; the lock is renewed meanwhile.
      this.#track(this.#retryLater(receiver, message, parked, givenUp));
    }
  }

  /**
   * `givenUp` is the signal of the client the message came through: once that client is
   * given up, its settles stop waiting (see {@link onLiveClient}).
   */
  async #deliver(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, givenUp: AbortSignal): Promise<ParkedRetry | undefined> {
    let envelope: Envelope;
    try {
      envelope = this.transport.fromMessage(message);
    } catch (error) {
      await onLiveClient(
        receiver.deadLetterMessage(message, { deadLetterReason: 'ENVELOPE_INVALID', deadLetterErrorDescription: describe(error), [P.deadAt]: new Date().toISOString(), [P.deadFor]: this.endpoint.consumer }),
        givenUp,
      ).catch(() => undefined);
      return undefined;
    }
    const attempt = ServiceBusTransport.attemptOf(message);
    let settled = false;
    let parked: ParkedRetry | undefined;
    const once = async (action: () => Promise<void>, what: string) => {
      if (settled) return;
      settled = true;
      try {
        await action();
      } catch (error) {
        // Settled nothing: the message is still locked here, so a later settle (the core's
        // retry after a failed dead letter) is taken rather than left to the lock's lapse.
        settled = false;
        // The ServiceBusError code (MessageLockLost: the lock lapsed before the settle) says
        // what happened in every log line, whatever wording the service gives its description.
        const code = codeOf(error);
        throw new TransportError(`${what} of ${envelope.messageId} failed: ${code ? `[${code}] ` : ''}${describe(error)}`, { cause: error });
      }
    };
    const delivery: Delivery = {
      envelope,
      attempt,
      replayed: message.applicationProperties?.[P.replayedFor] === this.endpoint.consumer,
      redelivered: ServiceBusTransport.redeliveredOf(message, attempt),
      ack: () => once(() => onLiveClient(receiver.completeMessage(message), givenUp), 'complete'),
      retry: (delayMs: number) =>
        once(async () => {
          parked = { delayMs: Math.max(0, delayMs), attempt: attempt + 1 };
        }, 'retry'),
      deadLetter: (reason: DeadLetterReason) =>
        once(
          () =>
            onLiveClient(
              // Service Bus takes at most 4,096 characters in either (a longer one fails the
              // settle every time: the key would never move on).
              receiver.deadLetterMessage(message, { deadLetterReason: cutText(reason.code, DEAD_TEXT_MAX), deadLetterErrorDescription: cutText(reason.message, DEAD_TEXT_MAX), [P.deadAt]: new Date().toISOString(), [P.deadFor]: this.endpoint.consumer }),
              givenUp,
            ),
          'deadLetter',
        ),
    };
    try {
      await this.handler(delivery);
    } catch {
      // The core settles handler failures itself; an unsettled delivery comes back after its lock.
    }
    return parked;
  }

  /**
   * Waits the retry delay (the lock renewed by the SDK), then abandons with the attempt raised.
   * An abandon that fails is asked again (1 s, doubling to 30 s; each failure logged) until it
   * goes through, the client is given up or the subscription stops: the SDK keeps renewing the
   * lock of a message it holds, so one failed abandon would otherwise hold the message (and,
   * ordered, its session's key) until `maxLockRenewalMs`. A given-up client or a stop leaves
   * the message to its lock, which then lapses.
   */
  async #retryLater(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, parked: ParkedRetry, givenUp: AbortSignal): Promise<void> {
    const linked = linkSignals([this.#stop.signal, givenUp]);
    try {
      await abortableSleep(parked.delayMs, linked.signal);
      for (let failures = 0; !linked.signal.aborted; ) {
        try {
          await onLiveClient(receiver.abandonMessage(message, { [P.attempt]: parked.attempt }), givenUp);
          return;
        } catch (error) {
          if (linked.signal.aborted) return;
          failures += 1;
          const delayMs = Math.min(30_000, 1_000 * 2 ** (failures - 1));
          this.transport.logger.error('service bus abandon of a retried message failed; asking again', {
            consumer: this.endpoint.consumer,
            messageId: String(message.messageId ?? ''),
            delayMs,
            error: describe(error),
          });
          await abortableSleep(delayMs, linked.signal).catch(() => undefined);
        }
      }
    } catch {
      // Stopped or given up during the delay: the message comes back after its lock.
    } finally {
      linked.dispose();
    }
  }

  #spawnSessionLoop(topic: string): void {
    const loop = this.#sessionLoop(topic);
    this.#loops.add(loop);
    void loop.finally(() => this.#loops.delete(loop));
  }

  /**
   * Accepts the next session with messages, handles its messages one at a time in order,
   * and lets it go when it has none left. A retry parks the session (the key waits, its
   * lock renewed) and starts another loop, so the handler slot is free for other keys.
   */
  async #sessionLoop(topic: string): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const current = this.transport.source.current;
      const linked = linkSignals([signal, current.signal]);
      const both = linked.signal;
      try {
        let receiver: ServiceBusSessionReceiver;
        try {
          // The broker holds the accept open until a session is free or the client's timeout
          // passes; closing, or a replaced client, must not wait for that.
          receiver = await untilAborted(
            this.transport.acceptNextSessionOf(current.client, topic, this.endpoint.consumer, {
              receiveMode: 'peekLock',
              skipParsingBodyAsJson: true,
              maxAutoLockRenewalDurationInMs: this.maxLockRenewalMs,
              abortSignal: both,
            }),
            both,
            (late) => void late.close().catch(() => undefined),
          );
        } catch (error) {
          if (both.aborted) continue;
          // No session free within the timeout (ServiceTimeout), or the one offered was taken: ask again.
          const code = codeOf(error);
          if (code === 'ServiceTimeout' || code === 'SessionCannotBeLocked') continue;
          const loss = connectionLoss(error);
          if (loss) this.transport.source.lost(current.generation, loss);
          await abortableSleep(250, signal);
          continue;
        }
        this.transport.source.answered(current.generation);
        this.#receivers.add(receiver);
        try {
          while (!both.aborted) {
            const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 500, abortSignal: both });
            if (!message || both.aborted) break;
            await this.#acquire();
            let parked: ParkedRetry | undefined;
            const run = this.#deliver(receiver, message, current.signal).then((value) => {
              parked = value;
            });
            this.#track(run);
            await run.catch(() => undefined);
            this.#release();
            if (parked) {
              // The key waits in place; another loop keeps the other keys flowing — unless as
              // many loops as slots are receiving already: one spawned per retry piled up loops
              // waiting for a session (each a receive link and listeners on this subscription's
              // signals) until a session came to each; the retire check below only runs after one.
              this.#parked += 1;
              if (this.#loops.size - this.#parked < this.endpoint.concurrency * this.endpoint.topics.length) this.#spawnSessionLoop(topic);
              await abortableSleep(parked.delayMs, signal);
              this.#parked -= 1;
              // Nothing later of the session is in hand: every receive asks for one message, so
              // the link has no credit left once it arrived and the broker sends nothing more.
              // (Asking for more here, to hand them back, cost a drain: a drain the SDK sees no
              // answer to within 200 ms closes the link, the session lock goes with it, and the
              // retried message came back after its lock at the old attempt, as a crash.)
              await onLiveClient(receiver.abandonMessage(message, { [P.attempt]: parked.attempt }), current.signal).catch(() => undefined);
            }
          }
        } catch (error) {
          // Session lock lost or connection gone: the broker hands the session on after the lock.
          const loss = both.aborted ? undefined : connectionLoss(error);
          if (loss) this.transport.source.lost(current.generation, loss);
        } finally {
          this.#receivers.delete(receiver);
          // A receiver of a given-up client closes with it; on its dead connection the close
          // can take the SDK's 60 s, which this loop (and the subscription's close) must not wait.
          const closing = receiver.close().catch(() => undefined);
          if (!current.signal.aborted) await closing;
        }
      } finally {
        linked.dispose();
      }
      // More loops than slots (after a parked retry ended): this one retires.
      if (this.#loops.size - this.#parked > this.endpoint.concurrency * this.endpoint.topics.length) return;
    }
  }

  async close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stop.abort();
      await Promise.allSettled([...this.#inFlight]);
      await Promise.allSettled([...this.#loops]);
      await Promise.all([...this.#receivers].map((receiver) => receiver.close().catch(() => undefined)));
      this.onClosed?.();
    })();
    return this.#closing;
  }
}
