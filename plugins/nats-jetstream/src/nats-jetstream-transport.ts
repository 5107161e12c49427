// The transport object: options, the connection it opens lazily and re-opens, and the
// entry checks of publish and subscribe. Each concern lives in a module of its own, as in
// the RabbitMQ plugin, so a transport author reading it finds each rule in one place:
// `topology.ts` (streams, consumers, names), `publish.ts`, `jetstream-subscription.ts`,
// `retries.ts`, `dead-letters.ts`, `ordered-lease.ts` and `nats-mapping.ts` (encoding).
import { randomUUID } from 'node:crypto';
import {
  ClosedError,
  ConfigError,
  TransportError,
  abortableSleep,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type PortLimits,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import { jetstream, jetstreamManager, type StreamConfig } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { consumerLag, jetStreamDeadLetters } from './dead-letters.js';
import { JetStreamSubscription } from './jetstream-subscription.js';
import { HEADER_ROOM, describe } from './nats-mapping.js';
import { envelopeProblems, publishEnvelopes } from './publish.js';
import { JetStreamNames, consumerConfig, declareStreams, type Connection } from './topology.js';

/** Options of {@link NatsJetStreamTransport}. */
export interface NatsJetStreamTransportOptions {
  /**
   * An async factory of a connected client (`() => connect({ servers, maxReconnectAttempts: -1 })`).
   * Called lazily, and again whenever the connection it returned has closed for good.
   */
  readonly connection: () => Promise<NatsConnection>;
  /** Prefix of every stream, subject and consumer name; letters, digits, `-` and `_`. Default `courier`. */
  readonly prefix?: string;
  /** JetStream `ack_wait` of the consumers: how long after a crash unsettled deliveries come back. Default 30 s. */
  readonly ackWaitMs?: number;
  /** Longest wait for a `PubAck` before a message is reported `PUBLISH_TIMEOUT`. Default 5 s. */
  readonly publishTimeoutMs?: number;
  /** Longest wait for a connection before `publish`/`subscribe` reject retriably. Default 5 s. */
  readonly connectTimeoutMs?: number;
  /** Server-side de-duplication window (`duplicate_window`) of the message stream. Default 2 min; 0 turns it off. */
  readonly duplicateWindowMs?: number;
  /** Lease of an ordered group's active instance; must exceed twice `ackWaitMs`. Default 2.5 × `ackWaitMs` + 1 s. */
  readonly orderedLeaseMs?: number;
  /** Stream settings merged into the message stream's (storage, replicas, limits). */
  readonly stream?: Partial<Pick<StreamConfig, 'storage' | 'num_replicas' | 'max_age' | 'max_bytes' | 'max_msg_size'>>;
  /** Extra NATS headers per message (e.g. `Nats-Expected-Stream`); a `Nats-Msg-Id` here replaces the messageId as de-duplication id. */
  readonly publishHeaders?: (envelope: Envelope) => Readonly<Record<string, string>> | undefined;
}

const PREFIX_PATTERN = /^[A-Za-z0-9_-]{1,32}$/;

/**
 * Courier transport on NATS JetStream: acknowledged publishes de-duplicated by messageId,
 * durable pull consumers, exact retry delays, dead letters in a stream of their own.
 *
 * Guarantees: `publish` resolves once every message has its `PubAck` (or a per-message
 * failure), in input order; deliveries are settled explicitly; a connection that dies
 * leaves its unsettled deliveries to come back after `ackWaitMs`; `attempt` is carried in
 * `Courier-Attempt`, so redeliveries after a crash do not count; an ordered endpoint has
 * one active instance per group, held by a lease in a stream of its own. The streams are
 * declared by `publish` and `subscribe`, never by `deadLetters`: listing, replaying or
 * purging the dead letters of a prefix without streams finds nothing and creates nothing.
 */
export class NatsJetStreamTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  /** Consumer names are hashed into broker names, so only the core's limits apply. */
  readonly limits: PortLimits = {};
  readonly deadLetters: TransportDeadLetters;

  /**
   * The consumer group's lag at the broker: `num_pending` summed over its durable consumers
   * (one per topic and one on its own subject), from their info — nothing delivered or
   * declared; null when it never subscribed under this prefix.
   */
  consumerLag(consumer: string): Promise<number | null> {
    return consumerLag({ connection: () => this.openConnection(), names: this.#names }, consumer);
  }
  readonly #options: Required<Omit<NatsJetStreamTransportOptions, 'stream' | 'publishHeaders'>> & Pick<NatsJetStreamTransportOptions, 'stream' | 'publishHeaders'>;
  readonly #names: JetStreamNames;
  readonly #instance = randomUUID();
  readonly #subscriptions = new Set<JetStreamSubscription>();
  readonly #declared = new Set<string>();
  #connection: Promise<Connection> | undefined;
  /** Per connection, the declaration of the prefix's streams on it (see `connection()`). */
  readonly #streamsDeclared = new WeakMap<Connection, Promise<void>>();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(options: NatsJetStreamTransportOptions) {
    const problems: string[] = [];
    if (typeof options?.connection !== 'function') problems.push("'connection' must be a function returning a connected NatsConnection");
    const prefix = options?.prefix ?? 'courier';
    if (!PREFIX_PATTERN.test(prefix)) problems.push(`'prefix' must be 1-32 letters, digits, '-' or '_', got ${JSON.stringify(prefix)}`);
    const ackWaitMs = options?.ackWaitMs ?? 30_000;
    const positive = (name: string, value: number) => {
      if (!Number.isSafeInteger(value) || value <= 0) problems.push(`'${name}' must be a positive integer of milliseconds, got ${value}`);
    };
    positive('ackWaitMs', ackWaitMs);
    const publishTimeoutMs = options?.publishTimeoutMs ?? 5_000;
    positive('publishTimeoutMs', publishTimeoutMs);
    const connectTimeoutMs = options?.connectTimeoutMs ?? 5_000;
    positive('connectTimeoutMs', connectTimeoutMs);
    const duplicateWindowMs = options?.duplicateWindowMs ?? 120_000;
    if (!Number.isSafeInteger(duplicateWindowMs) || duplicateWindowMs < 0) problems.push(`'duplicateWindowMs' must be 0 or more milliseconds, got ${duplicateWindowMs}`);
    const orderedLeaseMs = options?.orderedLeaseMs ?? Math.ceil(ackWaitMs * 2.5) + 1_000;
    if (orderedLeaseMs <= 2 * ackWaitMs) problems.push(`'orderedLeaseMs' (${orderedLeaseMs}) must exceed twice 'ackWaitMs' (${ackWaitMs}), so a dead holder's deliveries come back before the next holder starts`);
    if (problems.length > 0) throw new ConfigError(problems);
    this.#options = { ...options, prefix, ackWaitMs, publishTimeoutMs, connectTimeoutMs, duplicateWindowMs, orderedLeaseMs };
    this.#names = new JetStreamNames(prefix);
    this.capabilities = {
      orderingByKey: true,
      orderedPipelining: false,
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes: 1024 * 1024 - HEADER_ROOM,
      publishTimeoutMs,
    };
    // Operator reads and changes declare nothing: a prefix never published to stays without streams.
    this.deadLetters = jetStreamDeadLetters({ connection: () => this.openConnection(), names: this.#names });
  }

  // ------------------------------------------------------------- connection

  /**
   * @internal Resolves the open connection with the prefix's streams declared on it: what
   * publish and the subscriptions use. The streams are declared once per connection (again
   * on a new one, in case they were deleted meanwhile); a failed declaration is tried again
   * by the next call, on the same connection.
   */
  async connection(): Promise<Connection> {
    const connection = await this.openConnection();
    let declared = this.#streamsDeclared.get(connection);
    if (!declared) {
      const attempt = this.#declareStreams(connection);
      declared = attempt;
      this.#streamsDeclared.set(connection, attempt);
      attempt.catch(() => {
        if (this.#streamsDeclared.get(connection) === attempt) this.#streamsDeclared.delete(connection);
      });
    }
    await declared;
    return connection;
  }

  /**
   * @internal Resolves the open connection, connecting when there is none, and declares
   * nothing: the operator side (`deadLetters`) reads through it, so listing the dead
   * letters of a prefix creates no stream (a missing stream lists nothing).
   */
  async openConnection(): Promise<Connection> {
    if (this.#closed) throw new ClosedError('nats-jetstream transport is closed');
    if (!this.#connection) {
      const attempt = this.#connect();
      this.#connection = attempt;
      attempt.catch(() => {
        if (this.#connection === attempt) this.#connection = undefined;
      });
    }
    const connection = await this.#connection;
    if (!connection.connected) throw new TransportError('nats connection is down; the client is reconnecting', { retriable: true });
    return connection;
  }

  async #declareStreams(connection: Connection): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new TransportError(`could not declare the streams of prefix '${this.#names.prefix}' within ${this.#options.connectTimeoutMs} ms`, { retriable: true })),
        this.#options.connectTimeoutMs,
      );
    });
    try {
      await Promise.race([declareStreams(connection, this.#names, this.#options), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  async #connect(): Promise<Connection> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TransportError(`could not connect to nats within ${this.#options.connectTimeoutMs} ms`)), this.#options.connectTimeoutMs);
    });
    try {
      const nc = await Promise.race([
        this.#options.connection().catch((error: unknown) => {
          throw new TransportError(`could not connect to nats: ${describe(error)}`, { cause: error });
        }),
        timeout,
      ]);
      const jsm = await Promise.race([jetstreamManager(nc, { timeout: this.#options.connectTimeoutMs }), timeout]).catch(async (error: unknown) => {
        await nc.close().catch(() => undefined);
        throw new TransportError(`nats has no jetstream here (start nats-server with -js): ${describe(error)}`, { cause: error });
      });
      const connection: Connection = { nc, js: jetstream(nc, { timeout: this.#options.publishTimeoutMs }), jsm, connected: true };
      void this.#watch(connection);
      return connection;
    } finally {
      clearTimeout(timer);
    }
  }

  async #watch(connection: Connection): Promise<void> {
    void connection.nc.closed().then(() => {
      connection.connected = false;
      if (this.#connection) void this.#connection.then((current) => {
        if (current === connection) this.#connection = undefined;
      }, () => undefined);
    });
    for await (const status of connection.nc.status()) {
      if (status.type === 'disconnect') connection.connected = false;
      else if (status.type === 'reconnect') connection.connected = true;
    }
  }

  /** @internal Declares the durable pull consumer of `consumer` over `subject`, once per connection. */
  async ensureConsumer(connection: Connection, consumer: string, source: string, subject: string): Promise<string> {
    const durable = this.#names.durable(consumer, source);
    const key = `${durable}`;
    if (this.#declared.has(key)) return durable;
    try {
      await connection.jsm.consumers.add(this.#names.stream, consumerConfig(this.#names, this.#options.ackWaitMs, consumer, source, subject, 0));
    } catch (error) {
      const info = await connection.jsm.consumers.info(this.#names.stream, durable).catch(() => undefined);
      if (!info) throw new TransportError(`could not declare consumer '${consumer}' on '${source}': ${describe(error)}`, { cause: error, retriable: true });
      if (info.config.ack_wait !== this.#options.ackWaitMs * 1_000_000) {
        await connection.jsm.consumers.update(this.#names.stream, durable, { ack_wait: this.#options.ackWaitMs * 1_000_000 }).catch(() => undefined);
      }
    }
    this.#declared.add(key);
    return durable;
  }

  /**
   * @internal Re-creates an ordered group's durable consumer to start right after its ack floor, so
   * that a new holder of the group receives everything not yet acknowledged in stream
   * order. Without it, deliveries a dead holder left unacknowledged come back only when
   * the server's AckWait timer finds them — possibly after later messages of their key
   * were handed to the new holder (seen with nats-server 2.9). Messages acknowledged past
   * the floor come again; the inbox drops them.
   *
   * Returns the last stream sequence the old consumer had handed out when it was
   * re-created, else 0: the new consumer's delivery counts start again at 1, so the
   * subscription flags messages up to there `redelivered` itself (a previous holder may
   * have died with them in hand).
   */
  async rewindConsumer(connection: Connection, consumer: string, source: string, subject: string): Promise<number> {
    const durable = this.#names.durable(consumer, source);
    const info = await connection.jsm.consumers.info(this.#names.stream, durable).catch((error: unknown) => {
      if (/consumer not found/i.test(describe(error))) return undefined;
      throw error;
    });
    if (info && info.num_ack_pending === 0 && info.num_redelivered === 0) return 0;
    const floor = info?.ack_floor.stream_seq ?? 0;
    if (info) await connection.jsm.consumers.delete(this.#names.stream, durable);
    await connection.jsm.consumers.add(this.#names.stream, consumerConfig(this.#names, this.#options.ackWaitMs, consumer, source, subject, floor + 1));
    return info?.delivered.stream_seq ?? 0;
  }

  // ---------------------------------------------------------------- publish

  // ---------------------------------------------------------------- publish

  /**
   * Lists what makes NATS refuse `envelope` whatever its state (see `envelopeProblems` in
   * `publish.ts`): a topic with an empty subject token, and envelope fields whose encoded
   * headers leave too little of JetStream's 64 KiB header bound for a retry copy's or dead
   * letter's own.
   */
  validate(envelope: Envelope): readonly string[] {
    return envelopeProblems(envelope);
  }

  /**
   * Publishes `messages` in order (see `publishEnvelopes`): one result per message once each
   * has its PubAck. Rejects with a `ClosedError` after `close`, a retriable `TransportError`
   * of code `ABORTED` when `signal` is already aborted (nothing sent), and a retriable one
   * when no connection can be had or nothing could be sent.
   */
  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    if (this.#closed) throw new ClosedError('nats-jetstream transport is closed');
    if (options.signal?.aborted) throw new TransportError('publish aborted before sending', { code: 'ABORTED', retriable: true });
    if (messages.length === 0) return [];
    const connection = await this.connection();
    return publishEnvelopes(connection, messages, options.signal, {
      names: this.#names,
      maxMessageBytes: this.capabilities.maxMessageBytes,
      publishTimeoutMs: this.#options.publishTimeoutMs,
      publishHeaders: this.#options.publishHeaders,
    });
  }

  // -------------------------------------------------------------- subscribe

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    const problems: string[] = [];
    if (typeof endpoint?.consumer !== 'string' || endpoint.consumer === '') problems.push("'consumer' must be a non-empty string");
    if (!Array.isArray(endpoint?.topics) || endpoint.topics.length === 0) problems.push("'topics' must list at least one topic");
    for (const topic of endpoint?.topics ?? []) {
      if (topic.split('.').some((token) => token === '' || /[\s*>]/.test(token))) problems.push(`topic '${topic}' is not a valid NATS subject`);
    }
    if (!Number.isSafeInteger(endpoint?.concurrency) || endpoint.concurrency < 1) problems.push("'concurrency' must be a positive integer");
    if (problems.length > 0) throw new ConfigError(problems);
    if (this.#closed) throw new ClosedError('nats-jetstream transport is closed');
    const sources = [...endpoint.topics.map((topic) => ({ source: `t:${topic}`, subject: this.#names.topicSubject(topic) })), { source: 'c', subject: this.#names.consumerSubject(endpoint.consumer) }];
    try {
      const connection = await this.connection();
      for (const { source, subject } of sources) await this.ensureConsumer(connection, endpoint.consumer, source, subject);
    } catch (error) {
      // A failure because close() began meanwhile is the close's doing: retrying it is pointless.
      if (this.#closed) throw new ClosedError('nats-jetstream transport is closed', { cause: error });
      throw error;
    }
    // close() began while the consumers were declared: it has stopped every subscription it
    // saw, and one started now would pull on after it.
    if (this.#closed) throw new ClosedError('nats-jetstream transport is closed');
    const subscription = new JetStreamSubscription(
      this,
      endpoint,
      handler,
      sources.map((s) => ({ ...s, durable: this.#names.durable(endpoint.consumer, s.source) })),
    );
    this.#subscriptions.add(subscription);
    subscription.start(() => this.#subscriptions.delete(subscription));
    return subscription;
  }

  /** @internal What the subscription needs (not part of the public API). */
  get internals() {
    return {
      names: this.#names,
      stream: this.#names.stream,
      options: this.#options,
      instance: this.#instance,
      closed: () => this.#closed,
      leaseStream: this.#names.leaseStream,
      leaseSubject: (consumer: string) => this.#names.leaseSubject(consumer),
      forget: () => this.#declared.clear(),
    };
  }

  // ------------------------------------------------------------------ close

  /** Stops every subscription (waiting for handlers in flight), then closes the connection. Idempotent. */
  async close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#closed = true;
      await Promise.all([...this.#subscriptions].map((subscription) => subscription.close()));
      const connection = await this.#connection?.catch(() => undefined);
      if (connection) await connection.nc.close().catch(() => undefined);
    })();
    await this.#closing;
  }

  /** @internal The open connection, for subscriptions; waits for one while the transport is open. */
  async awaitConnection(signal: AbortSignal): Promise<Connection | undefined> {
    let delay = 100;
    while (!signal.aborted && !this.#closed) {
      try {
        return await this.connection();
      } catch {
        await abortableSleep(delay, signal);
        delay = Math.min(delay * 2, 2_000);
      }
    }
    return undefined;
  }
}
