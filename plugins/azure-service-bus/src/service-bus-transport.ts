import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  noopLogger,
  decodeEnvelope,
  payloadBytes,
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
  type ServiceBusAdministrationClient,
  type ServiceBusClient,
  type ServiceBusMessage,
  type ServiceBusReceivedMessage,
  type ServiceBusReceiver,
  type ServiceBusReceiverOptions,
  type ServiceBusSender,
  type ServiceBusSessionReceiverOptions,
  type ServiceBusSessionReceiver,
} from '@azure/service-bus';
import { ClientSource } from './client-source.js';
import { ServiceBusDeadLetters } from './service-bus-dead-letters.js';
import { NAME_PATTERN, P, codeOf, isConnectivity, toTransportError } from './service-bus-errors.js';
import { ServiceBusSubscription } from './service-bus-subscription.js';

export { toTransportError } from './service-bus-errors.js';

/** What the transport uses of `ServiceBusAdministrationClient` (reads only). */
export type ServiceBusAdministration = Pick<ServiceBusAdministrationClient, 'getSubscriptionRuntimeProperties'>;

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
   * is still running, from its receipt. Default 6 min: the default retry policy's longest
   * delay (5 min) plus a minute for the handler; after it the lock lapses and the broker
   * redelivers. Declared as the transport's `retryDelayLimit`, so `createBus` and
   * `subscribe` refuse a retry `maxDelayMs` above it.
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
   * The namespace's administration client (`new ServiceBusAdministrationClient(connectionString)`
   * or with a credential), used only to read: with it `deadLetters.exists` tells an operator
   * whether a consumer's subscription exists, by the management API's GET, which creates
   * nothing (topic mode only: in queue mode a consumer group is no entity of its own). Its connection needs the Manage claim (a Listen-only SAS
   * policy gets 401, reported as an error, never as "does not exist"). Without it
   * `deadLetters.exists` is absent and operator tools cannot tell a mistyped name from an
   * empty dead-letter queue.
   */
  readonly administration?: ServiceBusAdministration;
  /**
   * Where the transport reports what it does on its own: so far, a client given up after a
   * lost connection whose close it stopped waiting for in `close()` (warn). Default silent.
   */
  readonly logger?: Logger;
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
  /**
   * The consumer's lag at the broker: its subscriptions' active messages (those a receiver
   * holds locked included), summed over the known topics, read with `administration` (nothing
   * created); null when it has no subscription. Present only with `administration` and in
   * topic mode (a queue is shared by every group of queue mode).
   */
  readonly consumerLag?: (consumer: string) => Promise<number | null>;
  readonly #config: Required<Omit<ServiceBusTransportConfig, 'topics' | 'brokerMessageId' | 'logger' | 'administration'>> & Pick<ServiceBusTransportConfig, 'brokerMessageId' | 'topics'>;
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
    const maxLockRenewalMs = config?.maxLockRenewalMs ?? 360_000;
    positive('maxLockRenewalMs', maxLockRenewalMs);
    const maxMessageBytes = config?.maxMessageBytes ?? 240 * 1024;
    positive('maxMessageBytes', maxMessageBytes);
    const entities = config?.entities ?? 'topics';
    if (entities !== 'topics' && entities !== 'queues') problems.push(`'entities' must be 'topics' or 'queues', got ${JSON.stringify(entities)}`);
    const administration = config?.administration;
    if (administration !== undefined && typeof administration?.getSubscriptionRuntimeProperties !== 'function') {
      problems.push("'administration' must be a ServiceBusAdministrationClient");
    }
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
      // A retry waits with the message in hand (its lock renewed by the SDK, see #retryLater)
      // only within maxLockRenewalMs of the receive: a longer delay would let the lock lapse
      // and the message come back with its old attempt, so the bus refuses such a policy.
      retryDelayLimit: { maxMs: maxLockRenewalMs, setting: 'maxLockRenewalMs' },
    };
    // Service Bus: subscription names up to 50 characters (a queue's consumer is no entity
    // name: unbounded there); sessionId and messageId up to 128.
    this.limits = this.#queues ? { id: { bytes: 128 }, key: { bytes: 128 } } : { consumer: { bytes: 50 }, id: { bytes: 128 }, key: { bytes: 128 } };
    const deadLetters = new ServiceBusDeadLetters(this, {
      queues: this.#queues,
      topics: config.topics,
      subscribed: this.#topics,
      sender: (topic) => this.#sender(topic).sender,
      administration,
    });
    this.deadLetters = deadLetters;
    if (administration && !this.#queues) this.consumerLag = (consumer) => deadLetters.lag(administration, consumer);
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
