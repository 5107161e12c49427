import { createHash, randomUUID } from 'node:crypto';
import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  abortableSleep,
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
  type PortLimits,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  jetstream,
  jetstreamManager,
  type ConsumerMessages,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  type StreamConfig,
} from '@nats-io/jetstream';
import { headers as natsHeaders, type MsgHdrs, type NatsConnection } from '@nats-io/transport-node';

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

const ENVELOPE_HEADER = 'Courier-Envelope';
const ATTEMPT_HEADER = 'Courier-Attempt';
const NOT_BEFORE_HEADER = 'Courier-Not-Before';
const REPLAYED_HEADER = 'Courier-Replayed';
const DEAD_HEADER = 'Courier-Dead';
const MSG_ID_HEADER = 'Nats-Msg-Id';
/**
 * Room kept for the encoded headers inside the server's 1 MiB `max_payload`; far more than
 * JetStream stores ({@link MAX_HEADER_BYTES}), so a payload of `maxMessageBytes` always fits
 * with its headers, those a retry copy or dead letter adds included. `publish` still checks
 * each message against the server's actual `max_payload` (a server may lower it).
 */
const HEADER_ROOM = 512 * 1024;
/** nats-server stores no message whose header block is over 64 KiB ("header size exceeds maximum allowed of 64k"). */
const MAX_HEADER_BYTES = 64 * 1024 - 1;
/**
 * Of {@link MAX_HEADER_BYTES}, what a message's own headers must leave for those its retry
 * copy or dead letter adds: `validate` refuses an envelope that leaves less. A dead letter's
 * reason is cut to what is left (`deadLetterHeader`), so a message that was published can
 * always be dead-lettered.
 */
const COPY_HEADER_RESERVE = 4 * 1024;
/**
 * Bytes `publish` leaves free under `max_payload` beyond a message's own headers: room for
 * what a retry copy adds (`Courier-Attempt`, `Courier-Not-Before`, `Courier-Replayed`), so a
 * message that was published can always be retried; kept again when a dead letter is sized.
 */
const PAYLOAD_MARGIN = 512;
const PREFIX_PATTERN = /^[A-Za-z0-9_-]{1,32}$/;

interface Connection {
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  connected: boolean;
}

const hash = (value: string): string => createHash('sha256').update(value).digest('hex').slice(0, 20);
const describe = (error: unknown): string => (error instanceof Error ? error.message : String(error));
const isConnectivity = (error: unknown): boolean => {
  const text = `${(error as { code?: unknown })?.code ?? ''} ${describe(error)}`.toLowerCase();
  return /timeout|disconnect|closed|connection|no responders|503|econn|reconnect/.test(text);
};

/**
 * Courier transport on NATS JetStream: acknowledged publishes de-duplicated by messageId,
 * durable pull consumers, exact retry delays, dead letters in a stream of their own.
 *
 * Guarantees: `publish` resolves once every message has its `PubAck` (or a per-message
 * failure), in input order; deliveries are settled explicitly; a connection that dies
 * leaves its unsettled deliveries to come back after `ackWaitMs`; `attempt` is carried in
 * `Courier-Attempt`, so redeliveries after a crash do not count; an ordered endpoint has
 * one active instance per group, held by a lease in a stream of its own.
 */
export class NatsJetStreamTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  /** Consumer names are hashed into broker names, so only the core's limits apply. */
  readonly limits: PortLimits = {};
  readonly deadLetters: TransportDeadLetters;
  readonly #options: Required<Omit<NatsJetStreamTransportOptions, 'stream' | 'publishHeaders'>> & Pick<NatsJetStreamTransportOptions, 'stream' | 'publishHeaders'>;
  readonly #instance = randomUUID();
  readonly #subscriptions = new Set<JetStreamSubscription>();
  readonly #declared = new Set<string>();
  #connection: Promise<Connection> | undefined;
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
    this.capabilities = {
      orderingByKey: true,
      orderedPipelining: false,
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes: 1024 * 1024 - HEADER_ROOM,
      publishTimeoutMs,
    };
    this.deadLetters = {
      list: (consumer, listOptions) => this.#listDead(consumer, listOptions?.limit ?? 100),
      replay: (consumer, ids) => this.#replayDead(consumer, ids),
      purge: (consumer, ids) => this.#purgeDead(consumer, ids),
    };
  }

  // ------------------------------------------------------------------ names

  get #stream(): string {
    return `${this.#options.prefix}_MSG`;
  }
  get #deadStream(): string {
    return `${this.#options.prefix}_DLQ`;
  }
  get #leaseStream(): string {
    return `${this.#options.prefix}_LEASE`;
  }
  #topicSubject(topic: string): string {
    return `${this.#options.prefix}.t.${topic}`;
  }
  #consumerSubject(consumer: string): string {
    return `${this.#options.prefix}.c.${hash(consumer)}`;
  }
  #deadSubject(consumer: string): string {
    return `${this.#options.prefix}.dlq.${hash(consumer)}`;
  }
  #leaseSubject(consumer: string): string {
    return `${this.#options.prefix}.lease.${hash(consumer)}`;
  }
  #durable(consumer: string, source: string): string {
    return `${this.#options.prefix}_${hash(`${consumer}\u0000${source}`)}`;
  }

  // ------------------------------------------------------------- connection

  /** @internal Resolves the open connection, connecting (and declaring the streams) when there is none. */
  async connection(): Promise<Connection> {
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
      await Promise.race([this.#declareStreams(connection), timeout]);
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

  async #declareStreams(connection: Connection): Promise<void> {
    const prefix = this.#options.prefix;
    await this.#ensureStream(connection, {
      name: this.#stream,
      subjects: [`${prefix}.t.>`, `${prefix}.c.>`],
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      discard: DiscardPolicy.Old,
      duplicate_window: this.#options.duplicateWindowMs * 1_000_000,
      ...this.#options.stream,
    });
    await this.#ensureStream(connection, {
      name: this.#deadStream,
      subjects: [`${prefix}.dlq.>`],
      storage: this.#options.stream?.storage ?? StorageType.File,
      duplicate_window: 120_000_000_000,
    });
    await this.#ensureStream(connection, {
      name: this.#leaseStream,
      subjects: [`${prefix}.lease.>`],
      storage: StorageType.File,
      max_msgs_per_subject: 1,
    });
  }

  async #ensureStream(connection: Connection, config: Partial<StreamConfig> & { name: string }): Promise<void> {
    try {
      await connection.jsm.streams.add(config);
    } catch (error) {
      // The stream exists with other settings (or another client's): keep it if its subjects cover ours.
      const info = await connection.jsm.streams.info(config.name).catch(() => undefined);
      if (!info) throw new TransportError(`could not declare stream '${config.name}': ${describe(error)}`, { cause: error, retriable: isConnectivity(error) });
      const missing = (config.subjects ?? []).filter((subject) => !info.config.subjects?.includes(subject));
      if (missing.length > 0) {
        throw new TransportError(`stream '${config.name}' exists without the subjects ${missing.map((s) => `'${s}'`).join(', ')}`, { cause: error, retriable: false });
      }
    }
  }

  #consumerConfig(consumer: string, source: string, subject: string, startSeq: number) {
    return {
      durable_name: this.#durable(consumer, source),
      description: `courier consumer '${consumer}' on '${source}'`.slice(0, 4000),
      filter_subject: subject,
      ack_policy: AckPolicy.Explicit,
      ...(startSeq > 1 ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: startSeq } : { deliver_policy: DeliverPolicy.All }),
      ack_wait: this.#options.ackWaitMs * 1_000_000,
      max_deliver: -1,
      max_ack_pending: 1_000,
    };
  }

  /** @internal Declares the durable pull consumer of `consumer` over `subject`, once per connection. */
  async ensureConsumer(connection: Connection, consumer: string, source: string, subject: string): Promise<string> {
    const durable = this.#durable(consumer, source);
    const key = `${durable}`;
    if (this.#declared.has(key)) return durable;
    try {
      await connection.jsm.consumers.add(this.#stream, this.#consumerConfig(consumer, source, subject, 0));
    } catch (error) {
      const info = await connection.jsm.consumers.info(this.#stream, durable).catch(() => undefined);
      if (!info) throw new TransportError(`could not declare consumer '${consumer}' on '${source}': ${describe(error)}`, { cause: error, retriable: true });
      if (info.config.ack_wait !== this.#options.ackWaitMs * 1_000_000) {
        await connection.jsm.consumers.update(this.#stream, durable, { ack_wait: this.#options.ackWaitMs * 1_000_000 }).catch(() => undefined);
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
    const durable = this.#durable(consumer, source);
    const info = await connection.jsm.consumers.info(this.#stream, durable).catch((error: unknown) => {
      if (/consumer not found/i.test(describe(error))) return undefined;
      throw error;
    });
    if (info && info.num_ack_pending === 0 && info.num_redelivered === 0) return 0;
    const floor = info?.ack_floor.stream_seq ?? 0;
    if (info) await connection.jsm.consumers.delete(this.#stream, durable);
    await connection.jsm.consumers.add(this.#stream, this.#consumerConfig(consumer, source, subject, floor + 1));
    return info?.delivered.stream_seq ?? 0;
  }

  // ---------------------------------------------------------------- publish

  /**
   * Lists what makes NATS refuse `envelope` whatever its state: a topic with an empty subject
   * token, and envelope fields whose encoded headers leave JetStream's 64 KiB header bound
   * too little room for a retry copy's or dead letter's own (so it could be published but
   * never retried or dead-lettered).
   */
  validate(envelope: Envelope): readonly string[] {
    const problems: string[] = [];
    if (envelope.topic.split('.').some((token) => token === '')) {
      problems.push(`topic '${envelope.topic}' has an empty token ('..', or a leading or trailing '.'), which a NATS subject cannot hold`);
    }
    const { payload: _payload, ...meta } = envelope;
    const bytes = 12 + Buffer.byteLength(ENVELOPE_HEADER) + 4 + Buffer.byteLength(JSON.stringify(meta));
    if (bytes > MAX_HEADER_BYTES - COPY_HEADER_RESERVE) {
      problems.push(
        `envelope '${envelope.messageId}' encodes to ${bytes} bytes of NATS headers; JetStream stores at most ${MAX_HEADER_BYTES}, of which ${COPY_HEADER_RESERVE} are kept for a retry copy's or dead letter's own (shorten its headers)`,
      );
    }
    return problems;
  }

  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    if (this.#closed) throw new ClosedError('nats-jetstream transport is closed');
    if (options.signal?.aborted) throw new TransportError('publish aborted before sending', { code: 'ABORTED', retriable: true });
    if (messages.length === 0) return [];
    const connection = await this.connection();
    const maxPayload = connection.nc.info?.max_payload ?? 1024 * 1024;
    const results: Promise<PublishResult>[] = [];
    const window: Promise<unknown>[] = [];
    for (const envelope of messages) {
      const { messageId } = envelope;
      if (options.signal?.aborted) {
        results.push(Promise.resolve({ messageId, ok: false, error: new TransportError('publish aborted', { code: 'ABORTED', retriable: true }) }));
        continue;
      }
      if (!connection.connected) {
        results.push(Promise.resolve({ messageId, ok: false, error: new TransportError('nats connection lost before this message was sent', { retriable: true }) }));
        continue;
      }
      const problems = this.validate(envelope);
      if (problems.length > 0) {
        results.push(Promise.resolve({ messageId, ok: false, error: new SerializationError('MESSAGE_INVALID', problems.join('; ')) }));
        continue;
      }
      if (payloadBytes(envelope) > this.capabilities.maxMessageBytes) {
        results.push(
          Promise.resolve({ messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of '${messageId}' is over ${this.capabilities.maxMessageBytes} bytes`) }),
        );
        continue;
      }
      const extra = this.#options.publishHeaders?.(envelope);
      const { headers, data } = encode(envelope, {});
      let msgID = messageId;
      for (const [name, value] of Object.entries(extra ?? {})) {
        if (name === MSG_ID_HEADER) msgID = value;
        else headers.set(name, value);
      }
      if (data.byteLength + headerBytes(headers) + PAYLOAD_MARGIN > maxPayload) {
        results.push(
          Promise.resolve({ messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `message '${messageId}' with its headers is over the server's max_payload of ${maxPayload} bytes`) }),
        );
        continue;
      }
      const sent = connection.js.publish(this.#topicSubject(envelope.topic), data, { msgID, headers, timeout: this.#options.publishTimeoutMs }).then(
        (): PublishResult => ({ messageId, ok: true }),
        (error: unknown): PublishResult => ({ messageId, ok: false, error: publishError(error, messageId) }),
      );
      results.push(sent);
      window.push(sent);
      // Bound the PubAcks in flight; the signal is checked again after each wait.
      if (window.length >= 256) await window.shift();
    }
    const settled = await Promise.all(results);
    // Messages written while the client was reconnecting never reached the server: when
    // nothing was answered and every message failed for connectivity, the transport as a
    // whole was unavailable, and the call rejects (the relay pauses without an attempt).
    const sent = settled.filter((result) => result.ok || !['ABORTED', 'PAYLOAD_TOO_LARGE', 'MESSAGE_INVALID'].includes(result.error.code));
    if (sent.length > 0 && sent.every((result) => !result.ok && (result.error.code === 'TRANSPORT' || result.error.code === 'PUBLISH_TIMEOUT')) && !connection.connected) {
      throw new TransportError('nats connection is down; nothing was acknowledged', { retriable: true, cause: (sent[0] as { error?: unknown }).error });
    }
    return settled;
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
    const sources = [...endpoint.topics.map((topic) => ({ source: `t:${topic}`, subject: this.#topicSubject(topic) })), { source: 'c', subject: this.#consumerSubject(endpoint.consumer) }];
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
      sources.map((s) => ({ ...s, durable: this.#durable(endpoint.consumer, s.source) })),
    );
    this.#subscriptions.add(subscription);
    subscription.start(() => this.#subscriptions.delete(subscription));
    return subscription;
  }

  /** @internal What the subscription needs (not part of the public API). */
  get internals() {
    return {
      stream: this.#stream,
      options: this.#options,
      instance: this.#instance,
      closed: () => this.#closed,
      retrySubject: (consumer: string) => this.#consumerSubject(consumer),
      deadSubject: (consumer: string) => this.#deadSubject(consumer),
      leaseStream: this.#leaseStream,
      leaseSubject: (consumer: string) => this.#leaseSubject(consumer),
      forget: () => this.#declared.clear(),
    };
  }

  // ----------------------------------------------------------- dead letters

  async #listDead(consumer: string, limit: number): Promise<readonly DeadLetter[]> {
    const connection = await this.connection();
    const subject = this.#deadSubject(consumer);
    const found: DeadLetter[] = [];
    let seq = 1;
    while (found.length < limit) {
      const stored = await connection.jsm.streams.getMessage(this.#deadStream, { seq, next_by_subj: subject } as never).catch((error: unknown) => {
        if (/no message found|not found/i.test(describe(error))) return null;
        throw new TransportError(`could not list dead letters of '${consumer}': ${describe(error)}`, { cause: error });
      });
      if (!stored) break;
      seq = stored.seq + 1;
      try {
        const dead = JSON.parse(stored.header.get(DEAD_HEADER)) as { reason: DeadLetterReason; attempt: number; deadAt: string };
        found.push({ id: String(stored.seq), consumer, envelope: decode(stored.header, stored.data), reason: dead.reason, attempt: dead.attempt, deadAt: new Date(dead.deadAt) });
      } catch {
        // An undecodable message dead-lettered as ENVELOPE_INVALID has no envelope to show; operators see it with the nats CLI.
      }
    }
    return found;
  }

  async #replayDead(consumer: string, ids: readonly string[]): Promise<number> {
    const connection = await this.connection();
    let count = 0;
    for (const id of ids) {
      const stored = await connection.jsm.streams.getMessage(this.#deadStream, { seq: Number(id) }).catch(() => null);
      if (!stored || stored.subject !== this.#deadSubject(consumer)) continue;
      const envelope = decode(stored.header, stored.data);
      const { headers, data } = encode(envelope, { [REPLAYED_HEADER]: '1' });
      await connection.js.publish(this.#consumerSubject(consumer), data, { msgID: `${envelope.messageId}~replay~${hash(consumer)}~${id}`, headers });
      await connection.jsm.streams.deleteMessage(this.#deadStream, stored.seq, false).catch(() => false);
      count += 1;
    }
    return count;
  }

  async #purgeDead(consumer: string, ids: readonly string[]): Promise<number> {
    const connection = await this.connection();
    let count = 0;
    for (const id of ids) {
      const stored = await connection.jsm.streams.getMessage(this.#deadStream, { seq: Number(id) }).catch(() => null);
      if (!stored || stored.subject !== this.#deadSubject(consumer)) continue;
      if (await connection.jsm.streams.deleteMessage(this.#deadStream, stored.seq, false).catch(() => false)) count += 1;
    }
    return count;
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

// ------------------------------------------------------------------ encoding

function encode(envelope: Envelope, extra: Record<string, string>): { headers: MsgHdrs; data: Uint8Array } {
  const headers = natsHeaders();
  const { payload, ...meta } = envelope;
  headers.set(ENVELOPE_HEADER, JSON.stringify(meta));
  for (const [name, value] of Object.entries(extra)) headers.set(name, value);
  return { headers, data: new TextEncoder().encode(payload) };
}

function decode(headers: MsgHdrs | undefined, data: Uint8Array): Envelope {
  const meta = headers?.get(ENVELOPE_HEADER);
  if (!meta) throw new SerializationError('ENVELOPE_INVALID', `message has no '${ENVELOPE_HEADER}' header`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(meta);
  } catch (error) {
    throw new SerializationError('ENVELOPE_INVALID', `'${ENVELOPE_HEADER}' is not JSON`, { cause: error });
  }
  const payload = new TextDecoder('utf-8', { fatal: true }).decode(data);
  return decodeEnvelope({ ...(parsed as object), payload });
}

/**
 * The `Courier-Dead` header value of a dead letter: its reason, attempt, time and consumer as
 * JSON, in at most `room` bytes. A reason whose message does not fit (a handler's error can
 * quote a whole payload) is cut at a character boundary and says how long it was; the code
 * and the other fields are kept whole. Past them nothing is cut: the publish then fails,
 * and the message comes back.
 */
function deadLetterHeader(dead: { reason: DeadLetterReason; attempt: number; deadAt: string; consumer: string }, room: number): string {
  const render = (message: string) => JSON.stringify({ reason: { code: dead.reason.code, message }, attempt: dead.attempt, deadAt: dead.deadAt, consumer: dead.consumer });
  const whole = render(dead.reason.message);
  if (Buffer.byteLength(whole) <= room) return whole;
  const { message } = dead.reason;
  const cut = (length: number) => {
    // Never between the two halves of a surrogate pair.
    const end = length > 0 && /[\uD800-\uDBFF]/.test(message[length - 1]!) ? length - 1 : length;
    return `${message.slice(0, end)}… (cut; ${Buffer.byteLength(message)} bytes in all)`;
  };
  // The longest prefix that fits: JSON escapes make a character cost 1 to 6 bytes, so search.
  let low = 0;
  let high = message.length;
  while (low < high) {
    const middle = Math.ceil((low + high) / 2);
    if (Buffer.byteLength(render(cut(middle))) <= room) low = middle;
    else high = middle - 1;
  }
  return render(cut(low));
}

function headerBytes(headers: MsgHdrs): number {
  let total = 12;
  for (const [name, values] of headers) for (const value of values) total += Buffer.byteLength(name) + Buffer.byteLength(value) + 4;
  return total;
}

function publishError(error: unknown, messageId: string): CourierError {
  const text = describe(error);
  if (/timeout/i.test(text)) return new TransportError(`no PubAck for '${messageId}' in time: ${text}`, { code: 'PUBLISH_TIMEOUT', cause: error, retriable: true });
  if (/disconnect|closed|connection|reconnect/i.test(text)) return new TransportError(`connection lost after sending '${messageId}': ${text}`, { cause: error, retriable: true });
  return new TransportError(`nats refused '${messageId}': ${text}`, { code: 'PUBLISH_REJECTED', cause: error, retriable: true });
}

// ------------------------------------------------------------- subscription

interface InHand {
  readonly msg: JsMsg;
  readonly key: string | null;
  /**
   * An ack was sent for this delivery. The client then drops every later nak and in-progress
   * signal of it (nats.js `didAck`), and the server may have taken the ack even if its answer
   * never came: such a delivery can only come back through AckWait, and perhaps never.
   */
  ackSent: boolean;
}

/** A pulled delivery on its way to the handler. */
interface Pulled {
  readonly msg: JsMsg;
  readonly envelope: Envelope;
  readonly attempt: number;
  readonly replayed: boolean;
  readonly redelivered: boolean;
}

/** How many deliveries this subscription put back (nak) a subscription remembers (see `redelivered`, `#putBack`). */
const PUT_BACK_REMEMBERED = 10_000;

/**
 * How long a delivery waits before it comes again after its settle failed or never came,
 * unless the core asked for a delay (a `retry` after the failed settle). Short next to
 * AckWait, but not zero: a handler that never settles would otherwise spin.
 */
const GIVE_BACK_DELAY_MS = 1_000;

/** One live subscription: pull loops over the endpoint's durables, a lease when ordered. */
class JetStreamSubscription implements Subscription {
  readonly #transport: NatsJetStreamTransport;
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #durables: readonly { readonly durable: string; readonly source: string; readonly subject: string }[];
  readonly #stop = new AbortController();
  readonly #inHand = new Map<number, InHand>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #keyQueues = new Map<string, Pulled[]>();
  readonly #ready: Pulled[] = [];
  #running = 0;
  /** Ordered only: when our hold of the group's lease ends unless renewed (epoch ms). */
  #leaseUntil = 0;
  /**
   * Deliveries this subscription put back (nak): retry copies until their not-before, and
   * deliveries whose settle failed or never came. Stream sequence → delivery count at the nak,
   * and the attempt it comes back with when the header's is behind (a failed retry copy).
   */
  readonly #putBack = new Map<number, { readonly deliveries: number; readonly attempt?: number }>();
  /** Ordered only, per source: the last stream sequence a rewound consumer had handed out (see `rewindConsumer`). */
  readonly #handedOutThrough = new Map<string, number>();
  #slotWaiters: (() => void)[] = [];
  #iterators = new Set<ConsumerMessages>();
  #closing: Promise<void> | undefined;
  #done: Promise<void> = Promise.resolve();

  constructor(transport: NatsJetStreamTransport, endpoint: Endpoint, handler: DeliveryHandler, durables: readonly { readonly durable: string; readonly source: string; readonly subject: string }[]) {
    this.#transport = transport;
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#durables = durables;
  }

  start(onDone: () => void): void {
    const heartbeat = setInterval(() => this.#heartbeat(), Math.max(200, Math.floor(this.#transport.internals.options.ackWaitMs / 3)));
    this.#done = (this.#endpoint.ordered ? this.#runOrdered() : this.#runPulls(this.#stop.signal))
      .catch(() => undefined)
      .finally(() => {
        clearInterval(heartbeat);
        onDone();
      });
  }

  /**
   * Keeps every delivery in hand alive (running, queued behind its key, or waiting to run
   * again in place), so AckWait redelivers only after a crash. A delivery whose settle failed
   * or never came leaves the hand (`#comeBack`): kept alive, it would never come back.
   */
  #heartbeat(): void {
    for (const item of this.#inHand.values()) {
      try {
        item.msg.working();
      } catch {
        // The connection is gone; the broker redelivers after AckWait.
      }
    }
  }

  async #runPulls(signal: AbortSignal): Promise<void> {
    await Promise.all(this.#durables.map((durable) => this.#pull(durable, signal)));
  }

  async #pull({ durable, source, subject }: { durable: string; source: string; subject: string }, signal: AbortSignal): Promise<void> {
    const { stream } = this.#transport.internals;
    let delay = 100;
    while (!signal.aborted) {
      const connection = await this.#transport.awaitConnection(signal);
      if (!connection) return;
      try {
        const consumer = await connection.js.consumers.get(stream, durable);
        const messages = await consumer.consume({ max_messages: Math.max(this.#endpoint.concurrency, this.#endpoint.ordered ? 256 : 1), expires: 5_000 });
        this.#iterators.add(messages);
        // Closed while `consumers.get`/`consume` were in flight: `onAbort` stops at once, so
        // `close`, which could not see this iterator, does not leave it pulling forever.
        const cancelStopper = onAbort(signal, () => void messages.stop());
        try {
          for await (const msg of messages) {
            delay = 100;
            await this.#accept(msg, source);
            if (signal.aborted) break;
          }
        } finally {
          cancelStopper();
          this.#iterators.delete(messages);
        }
      } catch (error) {
        if (/consumer not found|stream not found/i.test(describe(error))) {
          // Deleted under us (or the server lost it): declare it again.
          this.#transport.internals.forget();
          await this.#transport.ensureConsumer(connection, this.#endpoint.consumer, source, subject).catch(() => undefined);
        }
      }
      await abortableSleep(delay, signal);
      delay = Math.min(delay * 2, 2_000);
    }
  }

  /** Takes one pulled message: decodes it, holds it, and hands it on (waiting for a slot when unordered). */
  async #accept(msg: JsMsg, source: string): Promise<void> {
    if (this.#inHand.has(msg.seq)) return;
    let envelope: Envelope;
    try {
      envelope = decode(msg.headers, msg.data);
    } catch (error) {
      // Never in hand: if the dead letter fails, AckWait brings the message back to try again.
      await this.#deadLetter(msg, undefined, 1, { code: 'ENVELOPE_INVALID', message: describe(error) }).catch(() => undefined);
      return;
    }
    // A delivery this subscription put back comes again with one more delivery: that nak
    // is no crash. Anything else JetStream counts is flagged.
    const putBack = this.#putBack.get(msg.seq);
    this.#putBack.delete(msg.seq);
    const onlyWaited = putBack !== undefined && msg.info.deliveryCount === putBack.deliveries + 1;
    // A retry whose copy the broker failed came back as the original: the attempt it asked for is remembered here.
    const attempt = Math.max(Number(msg.headers?.get(ATTEMPT_HEADER) || '1') || 1, (onlyWaited && putBack.attempt) || 0);
    const notBefore = Number(msg.headers?.get(NOT_BEFORE_HEADER) || '0');
    if (notBefore > Date.now()) {
      this.#rememberPutBack(msg, onlyWaited ? putBack.attempt : undefined);
      msg.nak(notBefore - Date.now());
      return;
    }
    const replayed = msg.headers?.get(REPLAYED_HEADER) === '1';
    this.#inHand.set(msg.seq, { msg, key: envelope.key, ackSent: false });
    // JetStream counts every delivery, the naks that hold a retry copy until its
    // not-before included. Only those this subscription made and saw come back are told
    // apart (above): a false "not redelivered" would hide a crash loop, a false
    // "redelivered" only costs a run alone. A rewound ordered consumer counts deliveries
    // afresh: what the old one had handed out may have been in a dead holder's hand, so it
    // is flagged here.
    const redelivered = (msg.info.redelivered && !onlyWaited) || msg.seq <= (this.#handedOutThrough.get(source) ?? 0);
    const item = { msg, envelope, attempt, replayed, redelivered };
    if (this.#endpoint.ordered && envelope.key !== null) {
      const queueKey = `${envelope.topic}\u0000${envelope.key}`;
      const queue = this.#keyQueues.get(queueKey);
      if (queue) {
        queue.push(item);
        return;
      }
      this.#keyQueues.set(queueKey, [item]);
    }
    this.#ready.push(item);
    this.#pump();
    if (!this.#endpoint.ordered) {
      while (this.#running + this.#ready.length >= this.#endpoint.concurrency && !this.#stop.signal.aborted) {
        await new Promise<void>((resolve) => this.#slotWaiters.push(resolve));
      }
    }
  }

  #pump(): void {
    // An ordered instance whose lease ran out (a stalled process that woke up, say) starts
    // nothing more: another instance may hold the group by now.
    if (this.#endpoint.ordered && Date.now() >= this.#leaseUntil - 250) return;
    while (this.#running < this.#endpoint.concurrency && this.#ready.length > 0 && !this.#stop.signal.aborted) {
      const item = this.#ready.shift()!;
      this.#running += 1;
      const run = this.#run(item).finally(() => {
        this.#running -= 1;
        this.#handlers.delete(run);
        this.#pump();
        for (const wake of this.#slotWaiters.splice(0)) wake();
      });
      this.#handlers.add(run);
    }
  }

  /**
   * Hands one delivery to the handler; settling decides what the key does next. A settle
   * counts once the broker answered it: one that fails, and a handler that ends without
   * settling (or throws), leave the delivery to {@link #comeBack}, never in hand. Only the
   * first settle call counts, except a `retry` after a failed one — the core asks for that
   * (`ConsumerRunner.#handle`) — which sets the delay the message comes back after.
   */
  async #run(item: Pulled): Promise<void> {
    const { msg, envelope, attempt } = item;
    const ordered = this.#endpoint.ordered && envelope.key !== null;
    // In an object: TypeScript does not follow a `let` the settle callbacks change.
    const status: { state: 'open' | 'settling' | 'done' | 'failed' } = { state: 'open' };
    let settling: Promise<void> | undefined;
    // What the delivery comes back with if no settle goes through: the attempt the failed
    // settle meant (a retry's is one more), after the delay a later retry asks for.
    let comeBack = { delayMs: GIVE_BACK_DELAY_MS, attempt };
    const settle = (attemptAfter: number, work: () => Promise<void>): Promise<void> => {
      if (status.state !== 'open') return Promise.resolve();
      status.state = 'settling';
      settling = work().then(
        () => {
          status.state = 'done';
        },
        (error: unknown) => {
          status.state = 'failed';
          comeBack = { ...comeBack, attempt: attemptAfter };
          throw error;
        },
      );
      return settling;
    };
    const delivery: Delivery = {
      envelope,
      attempt,
      ...(item.replayed ? { replayed: true } : {}),
      redelivered: item.redelivered,
      ack: () =>
        settle(attempt, async () => {
          await this.#ack(msg, envelope);
          this.#release(msg, envelope);
        }),
      retry: (delayMs: number, reason: DeadLetterReason) => {
        if (status.state === 'failed') {
          comeBack = { ...comeBack, delayMs: Math.max(0, delayMs) };
          return Promise.resolve();
        }
        return settle(attempt + 1, async () => {
          if (ordered) {
            // In place: the message stays at the head of its key; the slot is freed during the delay.
            this.#reHand(item, delayMs, attempt + 1);
            return;
          }
          void reason;
          await this.#retryCopy(msg, envelope, attempt + 1, delayMs);
          this.#release(msg, envelope);
        });
      },
      deadLetter: (reason: DeadLetterReason) =>
        settle(attempt, async () => {
          await this.#deadLetter(msg, envelope, attempt, reason);
          this.#release(msg, envelope);
        }),
    };
    try {
      await this.#handler(delivery);
    } catch {
      // The core settles a handler's failures itself; a handler that throws anyway has not
      // settled, and its delivery comes back below like any unsettled one.
    }
    // A settle the handler started without awaiting it (against the contract) decides first.
    await settling?.catch(() => undefined);
    if (status.state === 'done') return;
    // From here on the delivery is given back: settles that come later are ignored.
    status.state = 'done';
    this.#comeBack(item, comeBack.delayMs, comeBack.attempt);
  }

  /**
   * Makes a delivery whose settle failed, or whose handler ended without settling, come
   * back instead of staying in hand — where the in-progress heartbeat would keep the server
   * from ever redelivering it, and an ordered key would wait for it for ever.
   *
   * - An ack was sent (a plain ack, or the ack after a retry or dead-letter copy was
   *   written): the client ignores a nak now, and the server may have taken the ack. It
   *   leaves the hand and its key moves on; AckWait brings it back if the ack was lost. Its
   *   key may move on because the core acks only after the inbox recorded the message (that
   *   copy is then dropped as a duplicate), and a copy was written otherwise; waiting for it
   *   instead would hold the key for ever whenever the ack did go through.
   * - On an ordered key, nothing sent: it is handed out again in place after `delayMs`, as
   *   an ordered retry is, so the next message of its key still waits for it (a nak would let
   *   that one overtake it).
   * - Otherwise: put back with a nak delayed by `delayMs`, remembered with `attempt`, so it
   *   comes back to any instance and is not taken for a crash's redelivery here.
   */
  #comeBack(item: Pulled, delayMs: number, attempt: number): void {
    const { msg, envelope } = item;
    const held = this.#inHand.get(msg.seq);
    if (held?.msg !== msg) return; // given back already (the lease was lost, or the subscription closed)
    if (held.ackSent) {
      this.#release(msg, envelope);
      return;
    }
    if (this.#endpoint.ordered && envelope.key !== null) {
      this.#reHand(item, delayMs, attempt);
      return;
    }
    this.#rememberPutBack(msg, attempt > item.attempt ? attempt : undefined);
    this.#release(msg, envelope);
    try {
      msg.nak(delayMs);
    } catch {
      // The connection is gone: out of hand, AckWait brings it back.
    }
  }

  /** Ordered keys: hands `item` out again after `delayMs` with `attempt`, at the head of its key, unless it left the hand meanwhile. */
  #reHand(item: Pulled, delayMs: number, attempt: number): void {
    void abortableSleep(Math.max(0, delayMs), this.#stop.signal).then(() => {
      // Given back meanwhile (the lease was lost): the next holder has it, not this one.
      if (this.#stop.signal.aborted || this.#inHand.get(item.msg.seq)?.msg !== item.msg) return;
      this.#ready.unshift({ ...item, attempt, redelivered: false });
      this.#pump();
    });
  }

  /** Remembers that this subscription put `msg` back (see `#putBack`); bounded: one forgotten is flagged `redelivered` when it comes back (the safe side). */
  #rememberPutBack(msg: JsMsg, attempt: number | undefined): void {
    this.#putBack.set(msg.seq, attempt === undefined ? { deliveries: msg.info.deliveryCount } : { deliveries: msg.info.deliveryCount, attempt });
    if (this.#putBack.size > PUT_BACK_REMEMBERED) this.#putBack.delete(this.#putBack.keys().next().value!);
  }

  /** Forgets a settled message and lets the next of its key go. */
  #release(msg: JsMsg, envelope: Envelope): void {
    this.#inHand.delete(msg.seq);
    if (!this.#endpoint.ordered || envelope.key === null) return;
    const queueKey = `${envelope.topic}\u0000${envelope.key}`;
    const queue = this.#keyQueues.get(queueKey);
    if (!queue) return;
    queue.shift();
    if (queue.length === 0) this.#keyQueues.delete(queueKey);
    else this.#ready.push(queue[0]!);
    this.#pump();
  }

  /** Acknowledges `msg` and waits for the server's answer; rejects (retriably) when none comes in time. */
  async #ack(msg: JsMsg, envelope: Envelope | undefined): Promise<void> {
    const held = this.#inHand.get(msg.seq);
    if (held?.msg === msg) held.ackSent = true;
    try {
      await msg.ackAck({ timeout: this.#transport.internals.options.connectTimeoutMs });
    } catch (error) {
      throw new TransportError(`could not acknowledge '${envelope?.messageId ?? msg.seq}': ${describe(error)}`, { cause: error, retriable: true });
    }
  }

  async #retryCopy(msg: JsMsg, envelope: Envelope, attempt: number, delayMs: number): Promise<void> {
    const internals = this.#transport.internals;
    const connection = await this.#transport.connection();
    // A replay's retries are still the replay: the mark goes along (the consumer records a
    // replay's run under the replay's key; an unmarked copy would be taken for a relay duplicate).
    const replayed: Record<string, string> = msg.headers?.get(REPLAYED_HEADER) === '1' ? { [REPLAYED_HEADER]: '1' } : {};
    const { headers, data } = encode(envelope, { [ATTEMPT_HEADER]: String(attempt), [NOT_BEFORE_HEADER]: String(Date.now() + Math.max(0, delayMs)), ...replayed });
    try {
      await connection.js.publish(internals.retrySubject(this.#endpoint.consumer), data, { msgID: `${envelope.messageId}~${hash(this.#endpoint.consumer)}~${msg.seq}`, headers });
    } catch (error) {
      throw new TransportError(`could not publish the retry of '${envelope.messageId}': ${describe(error)}`, { cause: error, retriable: true });
    }
    await this.#ack(msg, envelope);
  }

  /**
   * Writes `msg` to the consumer's dead letters with its reason, then acknowledges it.
   * The copy always fits the server's `max_payload` and JetStream's header bound when the
   * message did: its `Nats-*`
   * headers (server directives for the original publish, such as `Nats-Expected-Stream`,
   * which the DLQ stream would refuse) are dropped and the reason's message is cut to the
   * room left (see `deadLetterHeader`).
   */
  async #deadLetter(msg: JsMsg, envelope: Envelope | undefined, attempt: number, reason: DeadLetterReason): Promise<void> {
    const internals = this.#transport.internals;
    const connection = await this.#transport.connection();
    const headers = natsHeaders();
    if (msg.headers) for (const [name, values] of msg.headers) if (!/^nats-/i.test(name)) for (const value of values) headers.append(name, value);
    const maxPayload = connection.nc.info?.max_payload ?? 1024 * 1024;
    // Two bounds: the whole message within the connection's max_payload, the headers within what JetStream stores.
    const room =
      Math.min(maxPayload - msg.data.byteLength - PAYLOAD_MARGIN, MAX_HEADER_BYTES - 64) - headerBytes(headers) - Buffer.byteLength(DEAD_HEADER) - 4;
    headers.set(DEAD_HEADER, deadLetterHeader({ reason, attempt, deadAt: new Date().toISOString(), consumer: this.#endpoint.consumer }, room));
    try {
      await connection.js.publish(internals.deadSubject(this.#endpoint.consumer), msg.data, { msgID: `${hash(this.#endpoint.consumer)}~${msg.seq}`, headers });
    } catch (error) {
      throw new TransportError(`could not dead-letter '${envelope?.messageId ?? msg.seq}': ${describe(error)}`, { cause: error, retriable: true });
    }
    await this.#ack(msg, envelope);
  }

  // ------------------------------------------------------------- ordered

  /** Holds the group's lease while receiving; stands by while another instance holds it. */
  async #runOrdered(): Promise<void> {
    const internals = this.#transport.internals;
    const leaseMs = internals.options.orderedLeaseMs;
    const subject = internals.leaseSubject(this.#endpoint.consumer);
    while (!this.#stop.signal.aborted) {
      const connection = await this.#transport.awaitConnection(this.#stop.signal);
      if (!connection) return;
      let held: { seq: number; until: number } | undefined;
      try {
        held = await this.#acquire(connection, subject, leaseMs);
      } catch {
        held = undefined;
      }
      if (!held) {
        await abortableSleep(Math.max(100, Math.floor(leaseMs / 5)), this.#stop.signal);
        continue;
      }
      try {
        // Deliveries a previous holder left unsettled come first, in stream order.
        for (const { source, subject } of this.#durables) {
          const handedOut = await this.#transport.rewindConsumer(connection, this.#endpoint.consumer, source, subject);
          this.#handedOutThrough.set(source, Math.max(this.#handedOutThrough.get(source) ?? 0, handedOut));
        }
      } catch {
        await abortableSleep(200, this.#stop.signal);
        continue;
      }
      this.#leaseUntil = held.until;
      const pulls = linkSignals([this.#stop.signal]);
      const receiving = this.#runPulls(pulls.signal);
      // Renew until the lease is lost (another holder, or our own deadline passed unrenewed).
      while (!this.#stop.signal.aborted) {
        await abortableSleep(Math.floor(leaseMs / 4), this.#stop.signal);
        if (this.#stop.signal.aborted) break;
        try {
          const renewed = await this.#renew(connection, subject, held.seq, leaseMs);
          if (!renewed) break;
          held = renewed;
          this.#leaseUntil = held.until;
        } catch {
          if (Date.now() > held.until - leaseMs / 4) break;
        }
      }
      this.#leaseUntil = 0;
      pulls.abort();
      await receiving;
      await Promise.all([...this.#handlers]);
      this.#giveBack();
      if (this.#stop.signal.aborted) {
        await this.#releaseLease(connection, subject, held.seq).catch(() => undefined);
        return;
      }
    }
  }

  async #acquire(connection: Connection, subject: string, leaseMs: number): Promise<{ seq: number; until: number } | undefined> {
    const internals = this.#transport.internals;
    const last = await connection.jsm.streams.getMessage(internals.leaseStream, { last_by_subj: subject }).catch((error: unknown) => {
      if (/no message found|not found/i.test(describe(error))) return null;
      throw error;
    });
    let lastSeq = 0;
    if (last) {
      lastSeq = last.seq;
      const record = JSON.parse(new TextDecoder().decode(last.data) || '{}') as { holder?: string; until?: number };
      if (record.holder && record.holder !== internals.instance && (record.until ?? 0) > Date.now()) return undefined;
    }
    return this.#write(connection, subject, lastSeq, leaseMs);
  }

  async #renew(connection: Connection, subject: string, seq: number, leaseMs: number): Promise<{ seq: number; until: number } | undefined> {
    return this.#write(connection, subject, seq, leaseMs);
  }

  async #write(connection: Connection, subject: string, expected: number, leaseMs: number): Promise<{ seq: number; until: number } | undefined> {
    const internals = this.#transport.internals;
    const until = Date.now() + leaseMs;
    try {
      const ack = await connection.js.publish(subject, new TextEncoder().encode(JSON.stringify({ holder: internals.instance, until })), { expect: { lastSubjectSequence: expected } });
      return { seq: ack.seq, until };
    } catch (error) {
      if (/wrong last sequence|10071/i.test(describe(error))) return undefined;
      throw error;
    }
  }

  async #releaseLease(connection: Connection, subject: string, seq: number): Promise<void> {
    await connection.js.publish(subject, new TextEncoder().encode('{}'), { expect: { lastSubjectSequence: seq } });
  }

  /** Hands every unsettled delivery back to the broker at once, so the next holder gets them in order. */
  #giveBack(): void {
    const items = [...this.#inHand.values()].sort((a, b) => a.msg.seq - b.msg.seq);
    for (const item of items) {
      try {
        item.msg.nak();
      } catch {
        // Gone with the connection: AckWait brings it back.
      }
    }
    this.#inHand.clear();
    this.#keyQueues.clear();
    this.#ready.length = 0;
  }

  async close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stop.abort();
      for (const messages of this.#iterators) messages.stop();
      for (const wake of this.#slotWaiters.splice(0)) wake();
      await this.#done;
      await Promise.all([...this.#handlers]);
      if (!this.#endpoint.ordered) this.#giveBack();
    })();
    await this.#closing;
  }
}
