import {
  ClosedError,
  ConfigError,
  SerializationError,
  TransportError,
  payloadBytes,
  type CourierError,
  type Endpoint,
  type DeliveryHandler,
  type Envelope,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import { readConsumerLag } from './consumer-lag.js';
import { encodeFields } from './stream-codec.js';
import { RedisConnections, isServerReply, type RedisClientFactory } from './redis-connections.js';
import { StreamKeys } from './stream-keys.js';
import { RedisStreamsDeadLetters } from './redis-streams-dead-letters.js';
import { StreamSubscription, type SubscriptionSettings } from './stream-subscription.js';

/** Configuration of a {@link RedisStreamsTransport}. */
export interface RedisStreamsTransportConfig {
  /**
   * Makes an ioredis client. Called lazily: once for the shared command client and once per
   * subscription (a blocking `XREADGROUP` holds its connection). The transport owns what it
   * returns and disconnects it at `close`. Standalone Redis 6.2 or later (`XAUTOCLAIM`).
   */
  readonly connection: RedisClientFactory;
  /** Prefix of every key the transport uses (default `courier`); a hash tag (`{courier}`) keeps them on one Redis Cluster slot. */
  readonly prefix?: string;
  /**
   * How long a delivery may stay unsettled and unrenewed before another instance of its
   * group claims it (`XAUTOCLAIM` min-idle), in ms; default 30 000. Deliveries in hand are
   * renewed every third of it, so only a dead (or stalled) instance's deliveries come back.
   */
  readonly claimIdleMs?: number;
  /** Lease of an ordered group's active instance, in ms (default 10 000), renewed every third of it; a dead holder's group moves on after it. */
  readonly orderedLeaseMs?: number;
  /** Longest a blocking read waits before looking again (default 1 000 ms); bounds how long `close` waits for the read to end. */
  readonly blockMs?: number;
  /** Longest a command waits for a connection before rejecting retriably (default 5 000 ms). */
  readonly connectTimeoutMs?: number;
  /** Longest `publish` waits for Redis's replies before reporting `PUBLISH_TIMEOUT` (default 10 000 ms). */
  readonly publishTimeoutMs?: number;
  /** How often a subscription moves its due retries back into its stream (default 100 ms); the retry delay's granularity. */
  readonly delayPollMs?: number;
  /**
   * Trims each topic stream to about this many entries at every publish (`XADD MAXLEN ~`);
   * absent: no trimming. Trimming ignores consumer groups: an entry trimmed before every
   * group read it is lost to those that did not (see the README).
   */
  readonly maxLen?: number;
  /** Largest payload in UTF-8 bytes (default 1 MiB; Redis itself takes up to its `proto-max-bulk-len`, 512 MB by default). */
  readonly maxMessageBytes?: number;
}

const DEFAULTS = {
  prefix: 'courier',
  claimIdleMs: 30_000,
  orderedLeaseMs: 10_000,
  blockMs: 1_000,
  connectTimeoutMs: 5_000,
  publishTimeoutMs: 10_000,
  delayPollMs: 100,
  maxMessageBytes: 1024 * 1024,
} as const;

function configProblems(config: RedisStreamsTransportConfig): string[] {
  const problems: string[] = [];
  if (typeof config.connection !== 'function') problems.push(`'connection' must be a function returning an ioredis client`);
  if (config.prefix !== undefined && (typeof config.prefix !== 'string' || config.prefix.length === 0 || /\s/.test(config.prefix))) {
    problems.push(`'prefix' must be a non-empty string without whitespace, got ${JSON.stringify(config.prefix)}`);
  }
  const positive: (keyof RedisStreamsTransportConfig)[] = ['claimIdleMs', 'orderedLeaseMs', 'blockMs', 'connectTimeoutMs', 'publishTimeoutMs', 'delayPollMs', 'maxLen', 'maxMessageBytes'];
  for (const name of positive) {
    const value = config[name];
    if (value !== undefined && !(typeof value === 'number' && Number.isSafeInteger(value) && value > 0)) problems.push(`'${name}' must be a positive integer, got ${JSON.stringify(value)}`);
  }
  if (typeof config.claimIdleMs === 'number' && config.claimIdleMs < 300) problems.push(`'claimIdleMs' must be at least 300 ms (it is renewed every third of it), got ${config.claimIdleMs}`);
  if (typeof config.orderedLeaseMs === 'number' && config.orderedLeaseMs < 300) problems.push(`'orderedLeaseMs' must be at least 300 ms (it is renewed every third of it), got ${config.orderedLeaseMs}`);
  return problems;
}

/**
 * Courier transport on Redis Streams: a stream per topic, a consumer group per Courier
 * consumer, `XADD` to publish, `XREADGROUP` to consume, `XAUTOCLAIM` to redeliver what a
 * dead instance held.
 *
 * Guarantees:
 * - `publish` resolves once Redis replied to each `XADD`: the entry is in the server's
 *   memory, and on disk only as the server's persistence settings make it (AOF with
 *   `appendfsync always` for every reply; see the README). One result per message.
 * - Every consumer group of a topic gets every message; instances of one group share them.
 * - Settles are atomic server-side scripts: a retry copy or a dead letter is written in the
 *   same step that acknowledges the original, so neither is lost nor left behind.
 * - Ordered endpoints: one instance per group holds a lease and receives; each (topic, key)
 *   is handled one at a time in stream order, retries in place; a new holder first takes
 *   every delivery the group left pending, in stream order, flagged redelivered.
 * - `close` is idempotent, stops every background loop, waits for handlers in flight and
 *   disconnects the clients it made.
 */
export class RedisStreamsTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  readonly deadLetters: TransportDeadLetters;
  readonly #connections: RedisConnections;
  readonly #keys: StreamKeys;
  readonly #settings: SubscriptionSettings;
  readonly #publishTimeoutMs: number;
  readonly #maxLen: number | undefined;
  readonly #subscriptions = new Set<StreamSubscription>();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(config: RedisStreamsTransportConfig) {
    const problems = configProblems(config ?? ({} as RedisStreamsTransportConfig));
    if (problems.length > 0) throw new ConfigError(problems.map((problem) => `redis-streams: ${problem}`));
    const settings = { ...DEFAULTS, ...config };
    this.#connections = new RedisConnections(config.connection, settings.connectTimeoutMs);
    this.#keys = new StreamKeys(settings.prefix);
    this.#publishTimeoutMs = settings.publishTimeoutMs;
    this.#maxLen = config.maxLen;
    this.#settings = {
      claimIdleMs: settings.claimIdleMs,
      leaseMs: settings.orderedLeaseMs,
      blockMs: settings.blockMs,
      delayPollMs: settings.delayPollMs,
    };
    this.capabilities = {
      orderingByKey: true,
      // A pipeline of XADDs is applied in order, but a refused one does not stop the later
      // ones of its key: pipelining would let them overtake it.
      orderedPipelining: false,
      fanOut: true,
      // Due retries are moved back by a loop polling every `delayPollMs`: the delay is kept
      // to within that, not rounded to a tier.
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes: settings.maxMessageBytes,
      publishTimeoutMs: settings.publishTimeoutMs + settings.connectTimeoutMs,
    };
    this.deadLetters = new RedisStreamsDeadLetters(this.#connections, this.#keys, () => this.#checkOpen());
  }

  /** See `Transport.publish`: one `XADD` per message, pipelined, answered in input order. */
  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    this.#checkOpen();
    const { signal } = options;
    if (signal?.aborted) throw new TransportError('redis-streams: publish aborted before sending', { code: 'ABORTED', retriable: true });
    const results: (PublishResult | undefined)[] = messages.map((envelope) =>
      payloadBytes(envelope) > this.capabilities.maxMessageBytes
        ? { messageId: envelope.messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of '${envelope.messageId}' is ${payloadBytes(envelope)} bytes, over maxMessageBytes ${this.capabilities.maxMessageBytes}`) }
        : undefined,
    );
    const sending = messages.map((envelope, index) => ({ envelope, index })).filter(({ index }) => results[index] === undefined);
    if (sending.length === 0) return results as PublishResult[];
    const client = await this.#connections.commands(signal);
    this.#checkOpen();
    if (signal?.aborted) throw new TransportError('redis-streams: publish aborted before sending', { code: 'ABORTED', retriable: true });
    const pipeline = client.pipeline();
    for (const { envelope } of sending) {
      const trim = this.#maxLen === undefined ? [] : ['MAXLEN', '~', String(this.#maxLen)];
      pipeline.call('XADD', this.#keys.topic(envelope.topic), ...trim, '*', ...encodeFields(envelope, 1, false));
    }
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), this.#publishTimeoutMs);
    });
    const replies = await Promise.race([pipeline.exec().catch((error: unknown) => error as Error), timedOut]).finally(() => clearTimeout(timer));
    let connectivityOnly = true;
    sending.forEach(({ envelope }, position) => {
      const messageId = envelope.messageId;
      let error: CourierError | undefined;
      if (replies === 'timeout') error = new TransportError(`redis-streams: no reply to XADD of '${messageId}' within ${this.#publishTimeoutMs} ms`, { code: 'PUBLISH_TIMEOUT', retriable: true });
      else if (replies instanceof Error || replies === null) error = new TransportError(`redis-streams: XADD of '${messageId}' failed: ${replies?.message ?? 'no reply'}`, { cause: replies, retriable: true });
      else {
        const failure = replies[position]?.[0];
        if (failure && isServerReply(failure)) {
          connectivityOnly = false;
          error = new TransportError(`redis-streams: redis refused XADD of '${messageId}': ${failure.message}`, { code: 'PUBLISH_REJECTED', cause: failure, retriable: true });
        } else if (failure) error = new TransportError(`redis-streams: XADD of '${messageId}' failed: ${failure.message}`, { cause: failure, retriable: true });
      }
      if (error === undefined) connectivityOnly = false;
      results[sending[position]!.index] = error === undefined ? { messageId, ok: true } : { messageId, ok: false, error };
    });
    // Nothing answered and the connection is gone: the transport as a whole is unavailable.
    if (connectivityOnly && client.status !== 'ready') throw new TransportError('redis-streams: the connection was lost before redis answered any XADD', { retriable: true });
    return results as PublishResult[];
  }

  /** See `Transport.subscribe`: a consumer group per endpoint on each topic stream and on the consumer's retry stream. */
  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    this.#checkOpen();
    const subscription = new StreamSubscription(endpoint, handler, this.#connections, this.#keys, this.#settings, (closed) => this.#subscriptions.delete(closed));
    this.#subscriptions.add(subscription);
    try {
      await subscription.start(() => this.#closed);
    } catch (error) {
      await subscription.close();
      if (this.#closed) throw new ClosedError('redis-streams transport', { cause: error });
      throw error;
    }
    if (this.#closed) {
      await subscription.close();
      throw new ClosedError('redis-streams transport');
    }
    return subscription;
  }

  /**
   * See `Transport.consumerLag`: the consumer group's `lag` from `XINFO GROUPS` (Redis 7.0 or
   * later), summed over the topic streams under the prefix that have the group and over the
   * consumer's retry stream — entries not yet delivered to the group; its pending
   * (delivered, unacknowledged) entries and retries waiting for their time are not counted.
   * Null when no stream has the group (it never subscribed under this prefix). Read-only
   * commands (`SCAN`, `XINFO`): nothing is created or moved. Rejects with a `TransportError`
   * on Redis before 7.0, or when Redis reports a group's lag as unknown (see the README).
   */
  async consumerLag(consumer: string): Promise<number | null> {
    this.#checkOpen();
    const client = await this.#connections.commands();
    try {
      return await readConsumerLag(client, this.#keys, consumer);
    } catch (error) {
      if (error instanceof TransportError) throw error;
      throw new TransportError(`redis-streams: reading the lag of consumer group '${consumer}' failed: ${error instanceof Error ? error.message : String(error)}`, {
        cause: error,
        retriable: !isServerReply(error),
      });
    }
  }

  /** Stops every subscription (waiting for handlers in flight), then disconnects; idempotent. */
  close(): Promise<void> {
    this.#closed = true;
    this.#closing ??= (async () => {
      await Promise.all([...this.#subscriptions].map((subscription) => subscription.close()));
      this.#connections.close();
    })();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #checkOpen(): void {
    if (this.#closed) throw new ClosedError('redis-streams transport');
  }
}
