import { randomUUID } from 'node:crypto';
import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  backoffDelay,
  describeError,
  noopLogger,
  payloadBytes,
  retryPolicy,
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
import type { Admin, Consumer, Kafka, KafkaMessage, Producer } from 'kafkajs';
import { HEADERS, decodeRecord, encodeRecord, headerText, type OutgoingRecord } from './record-codec.js';

/** Constructor arguments of {@link KafkaTransport}. */
export interface KafkaTransportConfig {
  /** The user's kafkajs client (`new Kafka({ brokers, ... })`); the transport creates its producer, consumers and admin from it. */
  readonly client: Kafka;
  /** Prefix of every Kafka name the transport uses: topics, consumer groups, retry and dead-letter topics. Default none. */
  readonly prefix?: string;
  /** Partitions of each topic the transport creates (topics that exist keep theirs). Default 6. */
  readonly partitions?: number;
  /** Replication factor of the topics it creates. Default: the broker's `default.replication.factor`. */
  readonly replicationFactor?: number;
  /** Extra topic configs for message topics it creates (`retention.ms`, `max.message.bytes`, ...). */
  readonly topicConfig?: Readonly<Record<string, string>>;
  /** Largest payload in UTF-8 bytes. Default 700 KiB: the broker's 1 MiB `message.max.bytes` minus the largest envelope headers. */
  readonly maxMessageBytes?: number;
  /** Longest wait for the broker's acknowledgement of a `publish` call before its messages are `PUBLISH_TIMEOUT`. Default 10 s. */
  readonly publishTimeoutMs?: number;
  /** Longest wait for a connection (and a group join in `subscribe`) before rejecting retriably. Default 10 s. */
  readonly connectTimeoutMs?: number;
  /** Consumer group session timeout: how soon a crashed consumer's partitions move to another. Default 30 s (broker minimum 6 s). */
  readonly sessionTimeoutMs?: number;
  /** Consumer heartbeat interval. Default a third of `sessionTimeoutMs`, at most 3 s. */
  readonly heartbeatIntervalMs?: number;
  /** Longest a rebalance waits for members to rejoin. Default 60 s. */
  readonly rebalanceTimeoutMs?: number;
  /** Records a subscription holds in memory (queued behind their key or running) before it stops fetching. Default 1000. */
  readonly maxBuffered?: number;
  /** Retry copies waiting for their time in memory before the retry topic is paused. Default 1000. */
  readonly maxRetryWaiting?: number;
  /** Where the transport reports consumer crashes and restarts. Default silent. */
  readonly logger?: Logger;
}

const NAME_PATTERN = /^[A-Za-z0-9._-]*$/;
const TOPIC_MAX = 249;
const RETRY_INFIX = 'courier-retry.';
const DLT_INFIX = 'courier-dlt.';
/** Protocol errors that refuse a record for its content: retrying the same record never helps. */
const CONTENT_ERRORS = new Set(['MESSAGE_TOO_LARGE', 'RECORD_LIST_TOO_LARGE', 'INVALID_RECORD', 'CORRUPT_MESSAGE', 'POLICY_VIOLATION', 'INVALID_TIMESTAMP', 'INVALID_TOPIC_EXCEPTION']);
/**
 * Protocol errors a partition answers while its leader is being elected or loaded (a topic
 * created a moment ago; kafkajs names code 6 NOT_LEADER_FOR_PARTITION, Kafka NOT_LEADER_OR_FOLLOWER).
 */
const LEADER_NOT_READY = new Set(['NOT_LEADER_FOR_PARTITION', 'LEADER_NOT_AVAILABLE', 'UNKNOWN_TOPIC_OR_PARTITION', 'REPLICA_NOT_AVAILABLE']);

/**
 * Prefix of the in-hand mark, the metadata of every offset Courier commits:
 * `courier-in-hand:<N>` says no member of the group handed a record at or past offset N of
 * the partition to its handler. A member commits a mark past a record before it hands the
 * record over, so the next member of the group flags exactly the records below the mark it
 * finds as `redelivered` (they may have been in the hands of a member that died), and the
 * records past it as first deliveries.
 */
const IN_HAND = 'courier-in-hand:';

/** The offset of an in-hand mark; undefined for metadata that is not one (none, or an earlier release's commit). */
function parseMark(metadata: string | null): number | undefined {
  if (metadata === null || !metadata.startsWith(IN_HAND)) return undefined;
  const mark = Number(metadata.slice(IN_HAND.length));
  return Number.isSafeInteger(mark) && mark >= 0 ? mark : undefined;
}

const describe = (error: unknown): string => (error instanceof Error ? `${error.name}: ${error.message}` : String(error));

/** The Kafka protocol error type (`MESSAGE_TOO_LARGE`, ...) somewhere in a kafkajs error's causes. */
function protocolType(error: unknown, depth = 0): string | undefined {
  if (!error || typeof error !== 'object' || depth > 5) return undefined;
  const record = error as { type?: unknown; originalError?: unknown; cause?: unknown; errors?: unknown };
  if (typeof record.type === 'string') return record.type;
  for (const next of [record.originalError, record.cause, ...(Array.isArray(record.errors) ? record.errors : [])]) {
    const found = protocolType(next, depth + 1);
    if (found) return found;
  }
  return undefined;
}

class Timeout extends Error {}

function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Timeout(`${what} did not finish within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/**
 * Delays between the subscription's own restarts of a crashed kafkajs consumer: 0.5 s doubling
 * to 30 s, within 20 % below each step (so members crashed by one broker event do not rejoin
 * in lockstep). It never gives up while the subscription is open, hence no real attempt limit.
 */
const RESTART_BACKOFF = retryPolicy({ maxAttempts: Number.MAX_SAFE_INTEGER, initialDelayMs: 500, multiplier: 2, maxDelayMs: 30_000, jitter: 0.2 }, 'consumer restart');

/** Delays before a record whose run left it unsettled runs again: 1 s doubling to 30 s (see `KafkaSubscription#giveBack`). */
const GIVE_BACK_BACKOFF = retryPolicy({ maxAttempts: Number.MAX_SAFE_INTEGER, initialDelayMs: 1_000, multiplier: 2, maxDelayMs: 30_000, jitter: 0.2 }, 'give back');

/** Longest reason text, in UTF-8 bytes, of a dead letter written again after the broker refused it for its size. */
const DEAD_REASON_CUT_BYTES = 4_096;

/** `text` cut to at most `maxBytes` of UTF-8 without splitting a character, the cut marked with `…`. */
function cutUtf8(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text, 'utf8') <= maxBytes) return text;
  const bytes = Buffer.from(text, 'utf8').subarray(0, Math.max(0, maxBytes - 3));
  return `${bytes.toString('utf8').replace(/\uFFFD$/u, '')}…`;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Courier transport on Apache Kafka through kafkajs.
 *
 * Guarantees (the conformance suites check them against a real broker):
 * - `publish` uses an idempotent producer with `acks=all` and resolves once the broker
 *   acknowledged every message, one result per message in input order. The envelope key is
 *   the record key (order per key follows its partition); every other field travels in a
 *   `courier-` header, the payload is the value; decoding is lossless. A record the broker
 *   refuses for its content fails alone (`PUBLISH_REJECTED`); a broker that cannot be
 *   reached makes the call reject with a retriable `TransportError` (the relay pauses).
 * - Topics are created with `partitions` when they do not exist; a new consumer group
 *   starts at the beginning of the topic's retention.
 * - Offsets are committed only up to the lowest record whose delivery has not been
 *   settled, per partition: a crash or rebalance redelivers every unfinished record and
 *   never skips one. Unordered endpoints run up to `concurrency` records at once, from any
 *   partition; ordered ones run one record per (topic, key) at a time, in offset order.
 * - A record is delivered flagged `redelivered` when a member of the group may have handed it
 *   to its handler before: every commit carries an in-hand mark that a member commits past a
 *   record before handing it over, and a member joining with the partition flags the records
 *   below the mark it finds (see {@link IN_HAND}; offsets of earlier releases, which carry
 *   none, fall back to the log end at the join). First deliveries, a new group's backlog
 *   included, are not flagged.
 * - `retry` on an ordered endpoint waits in place (only that key waits; the handler slot
 *   is free); on an unordered one it publishes a copy to the group's retry topic with the
 *   attempt and due time in headers, and the original is settled. A crash redelivery keeps
 *   the attempt of the record (broker redeliveries never count).
 * - `deadLetter` writes the record to the group's dead-letter topic (compacted, keyed by
 *   the dead letter's id) with the reason, attempt and origin before settling the original;
 *   `deadLetters` lists, replays (through the retry topic, attempt 1) and purges them
 *   (purge writes a tombstone: gone from `list` at once, from disk after compaction).
 * - A subscription consumes for as long as it is open: its kafkajs consumer, when it
 *   crashes with an error kafkajs does not restart after, is started again (growing delay,
 *   at most 30 s; logged). A crash counts as every partition revoked: nothing is committed
 *   for the records then in hand, and they come again (the inbox drops the copies).
 */
export class KafkaTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  readonly limits: PortLimits;
  readonly deadLetters: TransportDeadLetters;

  readonly #client: Kafka;
  readonly #prefix: string;
  readonly #partitions: number;
  readonly #replicationFactor: number | undefined;
  readonly #topicConfig: Readonly<Record<string, string>>;
  readonly #publishTimeoutMs: number;
  readonly #connectTimeoutMs: number;
  readonly #sessionTimeoutMs: number;
  readonly #heartbeatIntervalMs: number;
  readonly #rebalanceTimeoutMs: number;
  readonly #maxBuffered: number;
  readonly #maxRetryWaiting: number;
  readonly #logger: Logger;
  #producer: Promise<Producer> | undefined;
  /** Settles when the last send started has finished or been abandoned: see `#exclusiveSend`. */
  #sendTurn: Promise<void> = Promise.resolve();
  #admin: Promise<Admin> | undefined;
  readonly #knownTopics = new Set<string>();
  readonly #subscriptions = new Set<KafkaSubscription>();
  #closing: Promise<void> | undefined;

  constructor(config: KafkaTransportConfig) {
    const problems: string[] = [];
    const prefix = config.prefix ?? '';
    if (!NAME_PATTERN.test(prefix) || prefix.length > 100) problems.push(`prefix must be at most 100 of A-Z a-z 0-9 . _ -, got '${prefix}'`);
    const positive = (name: string, value: number | undefined): void => {
      if (value !== undefined && (!Number.isInteger(value) || value < 1)) problems.push(`${name} must be a positive integer, got ${value}`);
    };
    positive('partitions', config.partitions);
    positive('replicationFactor', config.replicationFactor);
    positive('maxMessageBytes', config.maxMessageBytes);
    positive('publishTimeoutMs', config.publishTimeoutMs);
    positive('connectTimeoutMs', config.connectTimeoutMs);
    positive('sessionTimeoutMs', config.sessionTimeoutMs);
    positive('heartbeatIntervalMs', config.heartbeatIntervalMs);
    positive('rebalanceTimeoutMs', config.rebalanceTimeoutMs);
    positive('maxBuffered', config.maxBuffered);
    positive('maxRetryWaiting', config.maxRetryWaiting);
    if (problems.length > 0) throw new ConfigError(problems);
    this.#client = config.client;
    this.#prefix = prefix;
    this.#partitions = config.partitions ?? 6;
    this.#replicationFactor = config.replicationFactor;
    this.#topicConfig = config.topicConfig ?? {};
    this.#publishTimeoutMs = config.publishTimeoutMs ?? 10_000;
    this.#connectTimeoutMs = config.connectTimeoutMs ?? 10_000;
    this.#sessionTimeoutMs = config.sessionTimeoutMs ?? 30_000;
    this.#heartbeatIntervalMs = config.heartbeatIntervalMs ?? Math.min(3_000, Math.floor(this.#sessionTimeoutMs / 3));
    this.#rebalanceTimeoutMs = config.rebalanceTimeoutMs ?? 60_000;
    this.#maxBuffered = config.maxBuffered ?? 1_000;
    this.#maxRetryWaiting = config.maxRetryWaiting ?? 1_000;
    this.#logger = config.logger ?? noopLogger;
    this.capabilities = {
      orderingByKey: true,
      // A call's records of one partition are appended atomically and in order, and a key stops
      // at its first failure in a call (README "Ordered pipelining").
      orderedPipelining: true,
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes: config.maxMessageBytes ?? 700 * 1024,
      publishTimeoutMs: this.#publishTimeoutMs,
    };
    // Consumer names become parts of topic names: `<prefix>courier-retry.<consumer>` must fit in 249.
    const room = TOPIC_MAX - prefix.length - RETRY_INFIX.length;
    this.limits = { consumer: { bytes: room }, topic: { bytes: TOPIC_MAX - prefix.length } };
    this.deadLetters = {
      list: (consumer, options) => this.#listDead(consumer, options?.limit),
      replay: (consumer, ids) => this.#replayDead(consumer, ids),
      purge: (consumer, ids) => this.#purgeDead(consumer, ids),
    };
  }

  /** Kafka topic names take only A-Z a-z 0-9 . _ - (the bus refuses other topics at `publish()`). */
  validate(envelope: Envelope): readonly string[] {
    return NAME_PATTERN.test(envelope.topic) ? [] : [`topic '${envelope.topic}' has characters Kafka topic names cannot hold (only A-Z a-z 0-9 . _ -)`];
  }

  /** The Kafka topic of a Courier topic. */
  topicName(topic: string): string {
    return `${this.#prefix}${topic}`;
  }

  /** The consumer group of a Courier consumer. */
  groupId(consumer: string): string {
    return `${this.#prefix}${consumer}`;
  }

  retryTopic(consumer: string): string {
    return `${this.#prefix}${RETRY_INFIX}${consumer}`;
  }

  deadLetterTopic(consumer: string): string {
    return `${this.#prefix}${DLT_INFIX}${consumer}`;
  }

  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    this.#assertOpen();
    if (options.signal?.aborted) throw new TransportError('publish was aborted before sending', { code: 'ABORTED', retriable: true });
    if (messages.length === 0) return [];
    // Ordered pipelining: once a message of a (topic, key) fails, none after it of that key
    // in this call is sent; they come back ABORTED (released by the relay without an attempt).
    const stopped = new Set<string>();
    const keyOf = (envelope: Envelope): string | undefined => (envelope.key === null ? undefined : `${envelope.topic}\0${envelope.key}`);
    const held = (envelope: Envelope): PublishResult => ({
      messageId: envelope.messageId,
      ok: false,
      error: new TransportError('not sent: an earlier message of its key in this call failed', { code: 'ABORTED', retriable: true }),
    });
    const failed = (envelope: Envelope, result: PublishResult): PublishResult => {
      const key = keyOf(envelope);
      if (!result.ok && key !== undefined) stopped.add(key);
      return result;
    };
    const results: (PublishResult | undefined)[] = messages.map((envelope) => {
      const key = keyOf(envelope);
      if (key !== undefined && stopped.has(key)) return held(envelope);
      const problems = this.validate(envelope);
      if (problems.length > 0) return failed(envelope, { messageId: envelope.messageId, ok: false, error: new ConfigError(problems) });
      if (payloadBytes(envelope) > this.capabilities.maxMessageBytes) {
        return failed(envelope, {
          messageId: envelope.messageId,
          ok: false,
          error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of ${payloadBytes(envelope)} bytes is over maxMessageBytes ${this.capabilities.maxMessageBytes}`),
        });
      }
      return undefined;
    });
    const sendable = messages.map((envelope, index) => ({ envelope, index })).filter(({ index }) => results[index] === undefined);
    if (sendable.length > 0) {
      // The whole call, waiting for its turn included, fits in publishTimeoutMs: the relay plans its lease with it.
      const deadline = Date.now() + this.#publishTimeoutMs;
      // Nothing is sent yet: a broker that cannot be reached rejects the call as a whole.
      await this.#ensureTopics([...new Set(sendable.map(({ envelope }) => this.topicName(envelope.topic)))]);
      try {
        // One request: Kafka appends each partition's records atomically and in order (a key's
        // records share a partition), so a refused partition batch writes none of them.
        await this.#exclusiveSend(sendable.map(({ envelope }) => ({ topic: this.topicName(envelope.topic), record: encodeRecord(envelope) })), deadline);
        for (const { envelope, index } of sendable) results[index] = { messageId: envelope.messageId, ok: true };
      } catch (error) {
        if (error instanceof Timeout) {
          const failure = new TransportError(`no acknowledgement within ${this.#publishTimeoutMs} ms (the broker may still have the messages)`, { code: 'PUBLISH_TIMEOUT', retriable: true });
          for (const { envelope, index } of sendable) results[index] = { messageId: envelope.messageId, ok: false, error: failure };
        } else if (error instanceof CourierError || !CONTENT_ERRORS.has(protocolType(error) ?? '')) {
          // No producer (the broker cannot be reached), or the whole batch failed for
          // connectivity (kafkajs retried, then gave up): the broker is away.
          throw error instanceof CourierError ? error : new TransportError(`Kafka did not take the batch: ${describe(error)}`, { cause: error, retriable: true });
        } else {
          // One record (or more) was refused for its content: send one by one, in order, so each
          // gets its own answer; a key stops at its first failure.
          for (const { envelope, index } of sendable) {
            const key = keyOf(envelope);
            if (key !== undefined && stopped.has(key)) {
              results[index] = held(envelope);
            } else if (options.signal?.aborted) {
              results[index] = failed(envelope, { messageId: envelope.messageId, ok: false, error: new TransportError('publish was aborted', { code: 'ABORTED', retriable: true }) });
            } else {
              results[index] = failed(envelope, await this.#sendOne(envelope, deadline));
            }
          }
        }
      }
    }
    return results.map((result) => result!);
  }

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    this.#assertOpen();
    const problems = [...endpoint.topics.filter((topic) => !NAME_PATTERN.test(topic)).map((topic) => `topic '${topic}' is not a Kafka topic name`)];
    if (!NAME_PATTERN.test(endpoint.consumer) || endpoint.consumer.length === 0) problems.push(`consumer '${endpoint.consumer}' must be A-Z a-z 0-9 . _ - only (it names Kafka topics and the group)`);
    if (problems.length > 0) throw new ConfigError(problems);
    const topics = endpoint.topics.map((topic) => this.topicName(topic));
    try {
      await this.#ensureTopics([...topics, this.retryTopic(endpoint.consumer)]);
      await this.#ensureTopics([this.deadLetterTopic(endpoint.consumer)], { 'cleanup.policy': 'compact' });
    } catch (error) {
      throw this.#closedOr(error);
    }
    // close() began while the topics were made: it has stopped every subscription it saw,
    // and a consumer started now would join the group after it.
    this.#assertOpen();
    const subscription = new KafkaSubscription(endpoint, handler, {
      consumer: this.#client.consumer({
        groupId: this.groupId(endpoint.consumer),
        sessionTimeout: this.#sessionTimeoutMs,
        heartbeatInterval: this.#heartbeatIntervalMs,
        rebalanceTimeout: this.#rebalanceTimeoutMs,
        maxWaitTimeInMs: 250,
        allowAutoTopicCreation: false,
        // kafkajs consults this only for retriable errors: it can veto a restart, never force
        // one. A consumer crashed by an error kafkajs deems not retriable is started again by
        // the subscription itself (see `KafkaSubscription#onCrash`).
        retry: { retries: 5, restartOnFailure: async () => true },
      }),
      topics: [...topics, this.retryTopic(endpoint.consumer)],
      retryTopic: this.retryTopic(endpoint.consumer),
      maxBuffered: Math.max(this.#maxBuffered, endpoint.concurrency),
      maxRetryWaiting: this.#maxRetryWaiting,
      connectTimeoutMs: this.#connectTimeoutMs,
      logger: this.#logger,
      publishCopy: (topic, record) => this.#publishCopy(topic, record),
      highWatermarks: async (topic) => {
        const ends = await this.#topicOffsets(topic);
        return new Map(ends.map((end) => [end.partition, Number(end.high)]));
      },
      committedOffsets: async (topics) => {
        const admin = await this.#connectedAdmin();
        const committed = await admin.fetchOffsets({ groupId: this.groupId(endpoint.consumer), topics: [...topics] });
        const found = new Map<string, { offset: number; metadata: string | null }>();
        for (const { topic, partitions } of committed) {
          for (const { partition, offset, metadata } of partitions) found.set(`${topic}\0${partition}`, { offset: Number(offset), metadata });
        }
        return found;
      },
      deadLetterTopic: this.deadLetterTopic(endpoint.consumer),
      forget: (s) => this.#subscriptions.delete(s),
    });
    this.#subscriptions.add(subscription);
    try {
      await subscription.start();
    } catch (error) {
      this.#subscriptions.delete(subscription);
      await subscription.close().catch(() => undefined);
      throw this.#closedOr(error instanceof CourierError ? error : new TransportError(`could not subscribe '${endpoint.consumer}': ${describe(error)}`, { cause: error, retriable: true }));
    }
    // close() overtook the start (and stopped this subscription): say so rather than hand
    // back a subscription that never receives.
    this.#assertOpen();
    return subscription;
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.all([...this.#subscriptions].map((subscription) => subscription.close().catch(() => undefined)));
      const producer = this.#producer;
      const admin = this.#admin;
      await Promise.all([
        producer?.then((p) => p.disconnect()).catch(() => undefined),
        admin?.then((a) => a.disconnect()).catch(() => undefined),
      ]);
    })();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** `error`, or a `ClosedError` (caused by it) when close() began meanwhile: the failure is the close's doing, and retrying it is pointless. */
  #closedOr(error: unknown): unknown {
    return this.#closing ? new ClosedError('KafkaTransport', { cause: error }) : error;
  }

  #assertOpen(): void {
    if (this.#closing) throw new ClosedError('KafkaTransport');
  }

  async #connectedProducer(): Promise<Producer> {
    const pending = (this.#producer ??= (async () => {
      // maxInFlightRequests 1: with retries, a later batch can never overtake an earlier one.
      const producer = this.#client.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false, retry: { retries: 5 } });
      await producer.connect();
      return producer;
    })());
    try {
      return await within(pending, this.#connectTimeoutMs, 'connecting the producer');
    } catch (error) {
      if (this.#producer === pending) this.#producer = undefined;
      void pending.then((p) => p.disconnect()).catch(() => undefined);
      throw new TransportError(`cannot reach Kafka: ${describe(error)}`, { cause: error, retriable: true });
    }
  }

  /** Drops the producer (disconnecting it in the background); the next send connects a new one. */
  #resetProducer(): void {
    const old = this.#producer;
    this.#producer = undefined;
    void old?.then((p) => p.disconnect()).catch(() => undefined);
  }

  /**
   * Sends records through the producer, one send at a time, and resolves once the broker
   * acknowledged them; rejects with `Timeout` when `deadline` passes first (waiting for the
   * turn included), with a `TransportError` when no producer connects, else with kafkajs's error.
   *
   * Why one at a time, and a new producer after any failure: when a request fails, kafkajs
   * rolls the idempotent producer's sequence numbers back, though the broker may have
   * appended it (a broker killed between appending and answering). A send queued behind it
   * on the same producer then goes out with those numbers, and when it has as many records
   * per partition the broker takes it for a retry of the appended batch: it answers
   * "written" and appends nothing, so a message the relay marks sent is lost. kafkajs's own
   * retries resend the very same records and are safe. So no second send ever waits inside
   * kafkajs behind a first, and a failed or abandoned send takes its producer (its sequence
   * numbers) with it: the next send gets a new producer id.
   */
  async #exclusiveSend(records: readonly { topic: string; record: OutgoingRecord }[], deadline: number): Promise<void> {
    const previous = this.#sendTurn;
    let release!: () => void;
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    // The next send waits for this one and for every one before it, even if this one gives up waiting.
    this.#sendTurn = Promise.all([previous, mine]).then(() => undefined);
    try {
      await within(previous, Math.max(0, deadline - Date.now()), 'waiting for the previous send');
      const producer = await this.#connectedProducer();
      try {
        await within(this.#send(producer, records), Math.max(0, deadline - Date.now()), 'the broker acknowledgement');
      } catch (error) {
        // kafkajs may still be retrying this request (after a Timeout), and this producer's
        // sequence numbers may now be reused for other records: nothing else uses it.
        this.#resetProducer();
        throw error;
      }
    } finally {
      release();
    }
  }

  async #connectedAdmin(): Promise<Admin> {
    this.#admin ??= (async () => {
      const admin = this.#client.admin();
      await admin.connect();
      return admin;
    })();
    try {
      return await within(this.#admin, this.#connectTimeoutMs, 'connecting the admin client');
    } catch (error) {
      const failed = this.#admin;
      this.#admin = undefined;
      void failed.then((a) => a.disconnect()).catch(() => undefined);
      throw new TransportError(`cannot reach Kafka: ${describe(error)}`, { cause: error, retriable: true });
    }
  }

  /**
   * A topic's partition ends (low and high offsets), asked again while the broker says a
   * partition's leader is not ready: a topic created a moment ago — by this transport, or by
   * another process, when the create here came back TOPIC_ALREADY_EXISTS without waiting for
   * leaders — answers ListOffsets with NOT_LEADER_OR_FOLLOWER until the broker has loaded its
   * partitions, and kafkajs's `fetchTopicOffsets` asks again only on UNKNOWN_TOPIC_OR_PARTITION
   * (it gives up on every other error at once). From the third try on the lookup goes through a
   * new admin client: the shared one keeps the partition leaders it read first, which on a
   * cluster of several brokers may be the ones that moved.
   */
  async #topicOffsets(topic: string): Promise<Awaited<ReturnType<Admin['fetchTopicOffsets']>>> {
    const began = Date.now();
    for (let attempt = 1; ; attempt += 1) {
      try {
        if (attempt < 3) return await (await this.#connectedAdmin()).fetchTopicOffsets(topic);
        const fresh = this.#client.admin();
        try {
          await within(fresh.connect(), this.#connectTimeoutMs, 'connecting an admin client');
          return await fresh.fetchTopicOffsets(topic);
        } finally {
          await fresh.disconnect().catch(() => undefined);
        }
      } catch (error) {
        if (!LEADER_NOT_READY.has(protocolType(error) ?? '') || Date.now() - began >= this.#connectTimeoutMs || this.#closing) throw error;
        await sleep(Math.min(100 * attempt, 1_000));
      }
    }
  }

  /** Creates the topics that do not exist yet, with `partitions`; remembered once seen. */
  async #ensureTopics(topics: readonly string[], extraConfig: Record<string, string> = {}): Promise<void> {
    const missing = topics.filter((topic) => !this.#knownTopics.has(topic));
    if (missing.length === 0) return;
    const admin = await this.#connectedAdmin();
    const configs = { ...this.#topicConfig, ...extraConfig };
    const began = Date.now();
    for (;;) {
      try {
        await within(
          admin.createTopics({
            waitForLeaders: true,
            topics: missing.map((topic) => ({
              topic,
              numPartitions: this.#partitions,
              ...(this.#replicationFactor === undefined ? {} : { replicationFactor: this.#replicationFactor }),
              configEntries: Object.entries(configs).map(([name, value]) => ({ name, value })),
            })),
          }),
          this.#connectTimeoutMs,
          'creating topics',
        );
        break;
      } catch (error) {
        const type = protocolType(error);
        if (type === 'TOPIC_ALREADY_EXISTS') break;
        // Created, but the metadata has not reached every listener yet: ask again (it then exists).
        if ((type === 'UNKNOWN_TOPIC_OR_PARTITION' || type === 'LEADER_NOT_AVAILABLE') && Date.now() - began < this.#connectTimeoutMs) {
          await sleep(100);
          continue;
        }
        throw new TransportError(`could not create topics ${missing.join(', ')}: ${describe(error)}`, { cause: error, retriable: true });
      }
    }
    for (const topic of missing) this.#knownTopics.add(topic);
  }

  async #send(producer: Producer, records: readonly { topic: string; record: OutgoingRecord }[]): Promise<void> {
    const byTopic = new Map<string, OutgoingRecord[]>();
    for (const { topic, record } of records) {
      const list = byTopic.get(topic);
      if (list) list.push(record);
      else byTopic.set(topic, [record]);
    }
    await producer.sendBatch({ acks: -1, topicMessages: [...byTopic].map(([topic, messages]) => ({ topic, messages: messages.map((m) => ({ ...m })) })) });
  }

  async #sendOne(envelope: Envelope, deadline: number): Promise<PublishResult> {
    try {
      await this.#exclusiveSend([{ topic: this.topicName(envelope.topic), record: encodeRecord(envelope) }], deadline);
      return { messageId: envelope.messageId, ok: true };
    } catch (error) {
      if (error instanceof Timeout) return { messageId: envelope.messageId, ok: false, error: new TransportError(error.message, { code: 'PUBLISH_TIMEOUT', retriable: true }) };
      if (error instanceof CourierError) return { messageId: envelope.messageId, ok: false, error };
      const type = protocolType(error);
      if (type && CONTENT_ERRORS.has(type)) {
        return { messageId: envelope.messageId, ok: false, error: new TransportError(`Kafka refused the record: ${type}`, { code: 'PUBLISH_REJECTED', retriable: true, cause: error }) };
      }
      return { messageId: envelope.messageId, ok: false, error: new TransportError(`Kafka did not take the record: ${describe(error)}`, { cause: error, retriable: true }) };
    }
  }

  /** Publishes a copy (retry, dead letter, replay) and resolves once the broker acknowledged it. */
  async #publishCopy(topic: string, record: OutgoingRecord): Promise<void> {
    this.#assertOpen();
    try {
      await this.#exclusiveSend([{ topic, record }], Date.now() + this.#publishTimeoutMs);
    } catch (error) {
      if (error instanceof CourierError) throw error;
      throw new TransportError(`could not write to ${topic}: ${describe(error)}`, { cause: error, retriable: true });
    }
  }

  /**
   * Reads a dead-letter topic from its start to its current end (a throwaway group that is
   * deleted afterwards). An operator's read creates nothing: a consumer whose dead-letter
   * topic does not exist (a name never subscribed, an operator's typo) has no dead letters,
   * and a name no Kafka topic can hold is refused with a `ConfigError`, not retriable.
   */
  async #readDead(consumer: string): Promise<Map<string, { record: KafkaMessage; headers: Record<string, string> }>> {
    this.#assertOpen();
    this.#assertConsumerName(consumer);
    const topic = this.deadLetterTopic(consumer);
    const latest = new Map<string, { record: KafkaMessage; headers: Record<string, string> }>();
    if (!(await this.#topicExists(topic, consumer))) return latest;
    let ends: Awaited<ReturnType<Admin['fetchTopicOffsets']>>;
    try {
      ends = await this.#topicOffsets(topic);
    } catch (error) {
      throw this.#closedOr(new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true }));
    }
    const admin = await this.#connectedAdmin();
    const remaining = new Map(ends.filter((end) => BigInt(end.high) > BigInt(end.low)).map((end) => [end.partition, BigInt(end.high)]));
    if (remaining.size === 0) return latest;
    const groupId = `${this.#prefix}courier-dlt-reader.${randomUUID()}`;
    const reader = this.#client.consumer({ groupId, sessionTimeout: 10_000, maxWaitTimeInMs: 100 });
    try {
      await reader.connect();
      await reader.subscribe({ topics: [topic], fromBeginning: true });
      const done = new Promise<void>((resolve) => {
        void reader.run({
          autoCommit: false,
          eachMessage: async ({ partition, message }) => {
            const key = message.key?.toString('utf8');
            if (key !== undefined) {
              if (message.value === null) latest.delete(key);
              else latest.set(key, { record: message, headers: headerText(message.headers) });
            }
            const high = remaining.get(partition);
            if (high !== undefined && BigInt(message.offset) + 1n >= high) remaining.delete(partition);
            if (remaining.size === 0) resolve();
          },
        });
      });
      await within(done, Math.max(this.#connectTimeoutMs, 15_000), `reading ${topic}`);
    } catch (error) {
      throw new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true });
    } finally {
      await reader.disconnect().catch(() => undefined);
      await admin.deleteGroups([groupId]).catch(() => undefined);
    }
    return latest;
  }

  /** Refuses (`ConfigError`, not retriable) a consumer name that cannot name this transport's topics: nothing of it can exist. */
  #assertConsumerName(consumer: string): void {
    const room = this.limits.consumer?.bytes ?? TOPIC_MAX;
    if (consumer.length === 0 || !NAME_PATTERN.test(consumer) || Buffer.byteLength(consumer, 'utf8') > room) {
      throw new ConfigError(`consumer '${consumer}' cannot be a Kafka consumer of this transport: it must be 1 to ${room} of A-Z a-z 0-9 . _ - (it names the group's topics)`);
    }
  }

  /** Whether `topic` exists on the broker (asked once it is not known to); a broker that cannot be asked is a retriable `TransportError`. */
  async #topicExists(topic: string, consumer: string): Promise<boolean> {
    if (this.#knownTopics.has(topic)) return true;
    try {
      const admin = await this.#connectedAdmin();
      const topics = await within(admin.listTopics(), this.#connectTimeoutMs, 'listing topics');
      return topics.includes(topic);
    } catch (error) {
      throw this.#closedOr(error instanceof CourierError ? error : new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true }));
    }
  }

  async #listDead(consumer: string, limit = 100): Promise<readonly DeadLetter[]> {
    const entries = await this.#readDead(consumer);
    const letters: DeadLetter[] = [];
    for (const [id, { record, headers }] of entries) {
      let envelope: Envelope;
      try {
        const key = headers['courier-dead-key-null'] === '1' ? null : Buffer.from(headers['courier-dead-key'] ?? '', 'base64');
        envelope = decodeRecord(key, record.value, headers);
      } catch {
        continue; // a record that never was a Courier message (ENVELOPE_INVALID): visible with Kafka's tools only
      }
      letters.push({
        id,
        consumer,
        envelope,
        reason: { code: headers[HEADERS.deadCode] ?? 'UNKNOWN', message: headers[HEADERS.deadMessage] ?? '' },
        attempt: Number(headers[HEADERS.attempt] ?? '1'),
        deadAt: new Date(Number(headers[HEADERS.deadAt] ?? '0')),
      });
    }
    letters.sort((a, b) => a.deadAt.getTime() - b.deadAt.getTime());
    return letters.slice(0, limit);
  }

  async #replayDead(consumer: string, ids: readonly string[]): Promise<number> {
    const letters = await this.#listDead(consumer, Number.MAX_SAFE_INTEGER);
    let replayed = 0;
    for (const letter of letters.filter((item) => ids.includes(item.id))) {
      // Into the group's own retry topic: other groups of the origin topic never see the replay.
      await this.#publishCopy(this.retryTopic(consumer), encodeRecord(letter.envelope, { [HEADERS.replayed]: '1', [HEADERS.attempt]: '1' }));
      await this.#publishCopy(this.deadLetterTopic(consumer), { key: letter.id, value: null, headers: {} });
      replayed += 1;
    }
    return replayed;
  }

  async #purgeDead(consumer: string, ids: readonly string[]): Promise<number> {
    const entries = await this.#readDead(consumer);
    let purged = 0;
    for (const id of ids) {
      if (!entries.has(id)) continue;
      await this.#publishCopy(this.deadLetterTopic(consumer), { key: id, value: null, headers: {} });
      purged += 1;
    }
    return purged;
  }
}

interface SubscriptionParts {
  readonly consumer: Consumer;
  readonly topics: readonly string[];
  readonly retryTopic: string;
  readonly deadLetterTopic: string;
  readonly maxBuffered: number;
  readonly maxRetryWaiting: number;
  readonly connectTimeoutMs: number;
  readonly logger: Logger;
  publishCopy(topic: string, record: OutgoingRecord): Promise<void>;
  /** Each partition's high watermark now (`partition → offset`). */
  highWatermarks(topic: string): Promise<Map<number, number>>;
  /** The group's committed offset (-1: none) and its metadata for every partition of `topics` (`topic\0partition →`). */
  committedOffsets(topics: readonly string[]): Promise<Map<string, { offset: number; metadata: string | null }>>;
  forget(subscription: KafkaSubscription): void;
}

/** Where one partition's records stand in this member. */
interface PartitionState {
  readonly topic: string;
  readonly partition: number;
  /** Offsets handed over (queued, waiting or running) and not settled yet. */
  readonly unfinished: Set<number>;
  /** Next offset after the highest record taken. */
  next: number;
  /** Offset last committed by this member. */
  committed: number;
  /**
   * The in-hand mark every commit of this partition carries (see {@link IN_HAND}): no member
   * of the group has handed over a record at or past it. It only grows, and it starts at
   * `suspectBelow`, so a member never lowers a mark it inherited.
   */
  mark: number;
  /** The highest mark the broker has acknowledged from this member (0: none yet). */
  markCommitted: number;
  revoked: boolean;
  commits: Promise<void>;
  /**
   * Records below it may have been in a previous member's hands when it died (a log keeps
   * no per-record delivery state), so they are delivered flagged `redelivered`: the in-hand
   * mark committed by the group's members when this member joined with the partition (0
   * when nothing was ever committed), or, when the group's offsets carry no mark (an
   * earlier release committed them) or could not be read, the partition's log end then.
   */
  readonly suspectBelow: number;
}

/** One consumed record on its way through the subscription. */
interface Item {
  readonly state: PartitionState;
  readonly offset: number;
  readonly message: KafkaMessage;
  readonly headers: Record<string, string>;
  attempt: number;
  /** `topic\0key` on ordered endpoints (keyed records only). */
  readonly orderKey: string | undefined;
  timer?: NodeJS.Timeout;
  dropped?: boolean;
  /**
   * Times the record was handed back after a run that left it unsettled (its retry or dead
   * letter failed, or its handler settled nothing): it is delivered again flagged
   * `redelivered`, after a delay that grows with this count.
   */
  givenBack?: number;
  /** Waiting to be handed back (in `#waiting`, but not a retry copy counted in `#retryWaiting`). */
  handingBack?: boolean;
}

class KafkaSubscription implements Subscription {
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #parts: SubscriptionParts;
  readonly #states = new Map<string, PartitionState>();
  /** Ordered endpoints: per (topic, key), the records behind the one in front. */
  readonly #keys = new Map<string, Item[]>();
  readonly #ready: Item[] = [];
  readonly #running = new Set<Promise<void>>();
  readonly #waiting = new Set<Item>();
  readonly #roomWaiters: (() => void)[] = [];
  #buffered = 0;
  #active = 0;
  #retryWaiting = 0;
  #retryPaused = false;
  #stopped = false;
  #closing: Promise<void> | undefined;
  #joined: (() => void) | undefined;
  /** Restarts of the kafkajs consumer since it last joined its group (the backoff grows with them). */
  #restarts = 0;
  #restartTimer: NodeJS.Timeout | undefined;
  #restarting: Promise<void> | undefined;

  constructor(endpoint: Endpoint, handler: DeliveryHandler, parts: SubscriptionParts) {
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#parts = parts;
  }

  async start(): Promise<void> {
    const { consumer } = this.#parts;
    const joined = new Promise<void>((resolve) => {
      this.#joined = resolve;
    });
    consumer.on(consumer.events.GROUP_JOIN, (event) => {
      this.#restarts = 0;
      this.#suspects = this.#suspectBounds(event.payload.memberAssignment);
      this.#onAssignment(event.payload.memberAssignment);
      this.#joined?.();
    });
    consumer.on(consumer.events.CRASH, (event) => this.#onCrash(event.payload.error, event.payload.restart));
    await within(
      (async () => {
        await consumer.connect();
        await consumer.subscribe({ topics: [...this.#parts.topics], fromBeginning: true });
        await this.#runConsumer();
        await joined;
      })(),
      Math.max(this.#parts.connectTimeoutMs, 30_000),
      'joining the consumer group',
    ).catch((error: unknown) => {
      throw new TransportError(`cannot subscribe '${this.#endpoint.consumer}' (Kafka unreachable or the group did not form): ${describe(error)}`, { cause: error, retriable: true });
    });
  }

  /** Starts the kafkajs consumer's fetch loop; it resolves once joined, or once a failed join was reported as a `CRASH`. */
  #runConsumer(): Promise<void> {
    return this.#parts.consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: 4,
      eachBatch: (payload) => this.#onBatch(payload),
    });
  }

  /**
   * The kafkajs consumer crashed: it has left its group (its member is gone), so everything
   * it held is treated as revoked: nothing more of it starts, and nothing is committed for
   * it by this member; in-hand records come again to whoever joins with their partitions
   * (the inbox drops the copies). This also covers `commitOffsets` doing nothing while the
   * consumer is down: no commit is owed across a crash.
   *
   * kafkajs restarts the consumer itself only after errors it deems retriable; after any
   * other (a failed coordinator lookup during a broker restart, a fenced generation) it
   * stays down for good and the subscription would silently stop. Then it is started again
   * here, with a growing delay (0.5 s doubling to 30 s) and for as long as the subscription
   * is open, each attempt logged.
   */
  #onCrash(error: Error, restarting: boolean): void {
    this.#onAssignment({});
    if (this.#stopped) return;
    if (restarting) {
      this.#parts.logger.warn('kafka consumer crashed; kafkajs restarts it', { consumer: this.#endpoint.consumer, error: describeError(error) });
      return;
    }
    this.#parts.logger.error('kafka consumer crashed with an error kafkajs does not restart after; starting it again', {
      consumer: this.#endpoint.consumer,
      error: describeError(error),
      restarts: this.#restarts,
    });
    this.#scheduleRestart();
  }

  #scheduleRestart(): void {
    if (this.#stopped || this.#restartTimer !== undefined) return;
    this.#restarts += 1;
    const delay = backoffDelay(RESTART_BACKOFF, this.#restarts);
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      this.#restarting = this.#restart().finally(() => {
        this.#restarting = undefined;
      });
    }, delay);
  }

  async #restart(): Promise<void> {
    if (this.#stopped) return;
    const { consumer } = this.#parts;
    try {
      // The crash disconnected it; its subscription to the topics survives a disconnect.
      await consumer.connect();
      if (this.#stopped) return;
      await this.#runConsumer();
      this.#parts.logger.info('kafka consumer started again after a crash', { consumer: this.#endpoint.consumer, restarts: this.#restarts });
    } catch (error) {
      // Not even connected (a failed join is reported through CRASH, which schedules the next try).
      this.#parts.logger.error('kafka consumer could not be started again; retrying', { consumer: this.#endpoint.consumer, error: describeError(error), restarts: this.#restarts });
      await consumer.disconnect().catch(() => undefined);
      this.#scheduleRestart();
    }
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stopped = true;
      clearTimeout(this.#restartTimer);
      this.#restartTimer = undefined;
      await this.#restarting;
      for (const wake of this.#roomWaiters.splice(0)) wake();
      // Not started yet: dropped (uncommitted, so the group gets them again).
      this.#ready.length = 0;
      this.#keys.clear();
      for (const item of this.#waiting) clearTimeout(item.timer);
      this.#waiting.clear();
      while (this.#running.size > 0) await Promise.allSettled([...this.#running]);
      await Promise.all([...this.#states.values()].map((state) => state.commits));
      await this.#parts.consumer.disconnect().catch(() => undefined);
      this.#parts.forget(this);
    })();
    return this.#closing;
  }

  /**
   * Below which offset each assigned partition's records may have been in another member's
   * hands when this member joined: the in-hand mark of the group's committed offset (see
   * {@link IN_HAND}); 0 when the partition has no committed offset and no partition of the
   * group's topics has one without a mark (no member ever handed a record over). A committed
   * offset without a mark was written by an earlier release (or a tool): then, for every
   * partition without a mark, the log end at the join stands in, as it did in those releases.
   * A partition whose lookups failed gets no entry: its first fetched batch's high watermark
   * stands in (see `#onBatch`), which lies at or above the end at the join, so it still flags
   * every record that may have been in another member's hands (the safe side of
   * `Delivery.redelivered`), but not the records produced after that fetch: flagging those
   * too would make the core run them one at a time.
   */
  async #suspectBounds(assignment: Record<string, number[]>): Promise<Map<string, number>> {
    const bounds = new Map<string, number>();
    const topics = Object.keys(assignment);
    const failed = (what: string, error: unknown): void => {
      this.#parts.logger.warn(`kafka ${what} lookup failed; the first fetch bounds the redelivered records instead`, {
        consumer: this.#endpoint.consumer,
        topics,
        error: describeError(error),
      });
    };
    let committed: Map<string, { offset: number; metadata: string | null }>;
    try {
      committed = await this.#parts.committedOffsets(topics);
    } catch (error) {
      failed('committed-offset', error);
      return bounds;
    }
    const unmarked = [...committed.values()].some((entry) => entry.offset >= 0 && parseMark(entry.metadata) === undefined);
    const needEnds = new Set<string>();
    for (const topic of topics) {
      for (const partition of assignment[topic] ?? []) {
        const id = `${topic}\0${partition}`;
        const entry = committed.get(id);
        const mark = parseMark(entry?.metadata ?? null);
        if (mark !== undefined) bounds.set(id, mark);
        else if (unmarked) needEnds.add(topic);
        else bounds.set(id, 0);
      }
    }
    await Promise.all(
      [...needEnds].map(async (topic) => {
        const ends = await this.#parts.highWatermarks(topic).catch((error: unknown) => {
          failed('high-watermark', error);
          return new Map<number, number>();
        });
        for (const partition of assignment[topic] ?? []) {
          const id = `${topic}\0${partition}`;
          const end = ends.get(partition);
          if (!bounds.has(id) && end !== undefined) bounds.set(id, end);
        }
      }),
    );
    return bounds;
  }

  #suspects: Promise<Map<string, number>> | undefined;

  #onAssignment(assignment: Record<string, number[]>): void {
    const kept = new Set(Object.entries(assignment).flatMap(([topic, partitions]) => partitions.map((partition) => `${topic}\0${partition}`)));
    for (const [id, state] of this.#states) {
      if (kept.has(id)) continue;
      // Revoked: nothing more of it starts, and nothing is committed for it by this member.
      state.revoked = true;
      this.#states.delete(id);
    }
    this.#dropRevoked();
  }

  /** Records of revoked partitions that have not started are dropped (uncommitted: the new owner gets them). */
  #dropRevoked(): void {
    for (let index = this.#ready.length - 1; index >= 0; index -= 1) {
      if (this.#drop(this.#ready[index]!)) this.#ready.splice(index, 1);
    }
    for (const [key, queue] of this.#keys) {
      const kept = queue.filter((item, index) => (index === 0 && this.#isRunning(item)) || !this.#drop(item));
      if (kept.length === 0) this.#keys.delete(key);
      else {
        this.#keys.set(key, kept);
        // The front was dropped and the one now in front (of a partition kept or assigned
        // again) never started: start it, or the key waits forever.
        if (kept[0] !== queue[0]) this.#enqueue(kept[0]!);
      }
    }
    for (const item of [...this.#waiting]) {
      if (this.#drop(item)) {
        clearTimeout(item.timer);
        this.#waiting.delete(item);
        if (item.orderKey === undefined && !item.handingBack) {
          this.#retryWaiting -= 1;
          this.#resumeRetries();
        }
      }
    }
  }

  /** Drops a revoked, not running record once; true when it is (or was) dropped. */
  #drop(item: Item): boolean {
    if (!item.state.revoked || this.#isRunning(item)) return false;
    if (!item.dropped) {
      item.dropped = true;
      this.#release();
    }
    return true;
  }

  readonly #runningItems = new Set<Item>();
  #isRunning(item: Item): boolean {
    return this.#runningItems.has(item);
  }

  async #onBatch(payload: import('kafkajs').EachBatchPayload): Promise<void> {
    const { batch } = payload;
    const id = `${batch.topic}\0${batch.partition}`;
    for (const message of batch.messages) {
      if (this.#stopped || !payload.isRunning() || payload.isStale()) return;
      let state = this.#states.get(id);
      if (!state) {
        const suspectBelow = (await this.#suspects)?.get(id) ?? Number(batch.highWatermark);
        if (this.#stopped || !payload.isRunning() || payload.isStale()) return;
        const first = Number(message.offset);
        state = { topic: batch.topic, partition: batch.partition, unfinished: new Set(), next: first, committed: first, mark: suspectBelow, markCommitted: 0, revoked: false, commits: Promise.resolve(), suspectBelow };
        this.#states.set(id, state);
      }
      const offset = Number(message.offset);
      if (state.unfinished.has(offset)) {
        // Fetched again after a rebalance while still in hand here: not twice.
        payload.resolveOffset(message.offset);
        continue;
      }
      if (!(await this.#room(payload))) return;
      if (state.revoked || this.#stopped) return;
      if (offset >= state.markCommitted && !(await this.#markInHand(state, payload, offset))) return;
      state.unfinished.add(offset);
      state.next = Math.max(state.next, offset + 1);
      this.#buffered += 1;
      this.#take(state, offset, message);
      payload.resolveOffset(message.offset);
    }
    await payload.heartbeat().catch(() => undefined);
  }

  /**
   * Commits the partition's in-hand mark past `offset` before the record is handed over, so
   * that a member joining after this one dies flags it `redelivered`. One commit covers the
   * rest of the fetched batch, at most `maxBuffered` records (a crash flags at most that many
   * records this member never took). False when the batch must end: the commit failed, or
   * the partition or the consumer went away meanwhile (kafkajs resolves a commit of a
   * consumer that stopped running without sending it); its records are fetched again.
   */
  async #markInHand(state: PartitionState, payload: import('kafkajs').EachBatchPayload, offset: number): Promise<boolean> {
    const { messages } = payload.batch;
    const batchEnd = Number(messages[messages.length - 1]?.offset ?? offset) + 1;
    state.mark = Math.max(state.mark, offset + 1, Math.min(batchEnd, offset + this.#parts.maxBuffered));
    try {
      await this.#commit(state);
    } catch (error) {
      this.#parts.logger.warn('kafka in-hand mark could not be committed; the records are fetched again', { consumer: this.#endpoint.consumer, error: describeError(error) });
      return false;
    }
    return !(this.#stopped || state.revoked || !payload.isRunning() || payload.isStale()) && offset < state.markCommitted;
  }

  /** Waits until fewer than `maxBuffered` records are in hand; heartbeats meanwhile. False when the batch must end. */
  async #room(payload: import('kafkajs').EachBatchPayload): Promise<boolean> {
    while (this.#buffered >= this.#parts.maxBuffered) {
      await Promise.race([new Promise<void>((resolve) => this.#roomWaiters.push(resolve)), sleep(1_000)]);
      if (this.#stopped || !payload.isRunning() || payload.isStale()) return false;
      await payload.heartbeat().catch(() => undefined);
    }
    return true;
  }

  #release(): void {
    this.#buffered -= 1;
    this.#roomWaiters.shift()?.();
  }

  #take(state: PartitionState, offset: number, message: KafkaMessage): void {
    const headers = headerText(message.headers);
    const attempt = Number(headers[HEADERS.attempt] ?? '1');
    const key = message.key === null ? null : message.key.toString('utf8');
    const ordered = this.#endpoint.ordered && key !== null && state.topic !== this.#parts.retryTopic;
    const item: Item = { state, offset, message, headers, attempt: Number.isInteger(attempt) && attempt > 0 ? attempt : 1, orderKey: ordered ? `${state.topic}\0${key}` : undefined };
    const due = Number(headers[HEADERS.retryAt] ?? '0');
    if (state.topic === this.#parts.retryTopic && due > Date.now()) {
      // A retry copy waits in memory for its time, holding no handler slot and blocking nothing.
      this.#retryWaiting += 1;
      this.#waiting.add(item);
      item.timer = setTimeout(() => {
        this.#waiting.delete(item);
        this.#retryWaiting -= 1;
        this.#resumeRetries();
        this.#enqueue(item);
      }, due - Date.now());
      if (this.#retryWaiting >= this.#parts.maxRetryWaiting && !this.#retryPaused) {
        this.#retryPaused = true;
        this.#parts.consumer.pause([{ topic: this.#parts.retryTopic }]);
      }
      return;
    }
    if (item.orderKey !== undefined) {
      const queue = this.#keys.get(item.orderKey);
      if (queue) {
        queue.push(item);
        return;
      }
      this.#keys.set(item.orderKey, [item]);
    }
    this.#enqueue(item);
  }

  #resumeRetries(): void {
    if (this.#retryPaused && this.#retryWaiting < this.#parts.maxRetryWaiting / 2) {
      this.#retryPaused = false;
      this.#parts.consumer.resume([{ topic: this.#parts.retryTopic }]);
    }
  }

  #enqueue(item: Item): void {
    if (this.#stopped) return;
    this.#ready.push(item);
    this.#pump();
  }

  #pump(): void {
    while (this.#active < this.#endpoint.concurrency && this.#ready.length > 0 && !this.#stopped) {
      const item = this.#ready.shift()!;
      if (item.dropped || this.#drop(item)) continue;
      this.#active += 1;
      this.#runningItems.add(item);
      const run = this.#run(item).finally(() => {
        this.#active -= 1;
        this.#runningItems.delete(item);
        this.#running.delete(run);
        this.#pump();
      });
      this.#running.add(run);
    }
  }

  async #run(item: Item): Promise<void> {
    let envelope: Envelope;
    try {
      envelope = decodeRecord(item.message.key, item.message.value, item.headers);
    } catch (error) {
      try {
        await this.#deadLetter(item, { code: 'ENVELOPE_INVALID', message: describe(error) });
      } catch (failed) {
        this.#giveBack(item, failed);
      }
      return;
    }
    let settled = false;
    // A retry or dead letter whose copy the broker did not take has settled nothing: the
    // record is still in hand, and a later settle of it is taken (the Delivery contract).
    // An ack has finished the record here even when its commit failed (the next commit
    // carries it), so it stays settled.
    const once = async (action: () => Promise<void>, undoOnFailure: boolean): Promise<void> => {
      if (settled) return;
      settled = true;
      try {
        await action();
      } catch (error) {
        if (undoOnFailure) settled = false;
        throw error;
      }
    };
    const delivery: Delivery = {
      envelope,
      attempt: item.attempt,
      redelivered: item.offset < item.state.suspectBelow || (item.givenBack ?? 0) > 0,
      ...(item.headers[HEADERS.replayed] === '1' ? { replayed: true } : {}),
      ack: () => once(() => this.#finish(item), false),
      retry: (delayMs, reason) => once(() => this.#retry(item, delayMs, reason), true),
      deadLetter: (reason) => once(() => this.#deadLetter(item, reason), true),
    };
    let failure: unknown;
    await this.#handler(delivery).catch((error: unknown) => {
      failure = error;
    });
    // Nothing settled it: a record left in hand would stop its key and the partition's
    // commit point until a rebalance, so it is handed back to run again.
    if (!settled) this.#giveBack(item, failure ?? new Error('the handler returned without settling the delivery'));
  }

  /**
   * Hands a record whose run left it unsettled back to run again, after 1 s doubling to 30 s
   * per time it was handed back, flagged `redelivered`; it keeps its place in its key (ordered)
   * and holds the partition's commit point meanwhile. Logged as an error each time.
   */
  #giveBack(item: Item, cause: unknown): void {
    if (this.#stopped) return;
    item.givenBack = (item.givenBack ?? 0) + 1;
    const delayMs = backoffDelay(GIVE_BACK_BACKOFF, item.givenBack);
    this.#parts.logger.error('kafka record left unsettled by its run (its retry or dead letter failed, or nothing settled it); handed back to run again', {
      consumer: this.#endpoint.consumer,
      record: `${item.state.topic}[${item.state.partition}]@${item.offset}`,
      delayMs,
      times: item.givenBack,
      error: describeError(cause),
    });
    item.handingBack = true;
    this.#waiting.add(item);
    item.timer = setTimeout(() => {
      this.#waiting.delete(item);
      item.handingBack = false;
      if (this.#stopped) return;
      if (item.state.revoked) {
        // Its partition went to another member, which has it: leave the front of its key.
        if (!item.dropped) {
          item.dropped = true;
          this.#release();
        }
        this.#nextOfKey(item);
        return;
      }
      this.#enqueue(item);
    }, delayMs);
  }

  /** The record is done: the next of its key may run, and the partition's commit point may move. */
  async #finish(item: Item): Promise<void> {
    const { state } = item;
    state.unfinished.delete(item.offset);
    this.#release();
    this.#nextOfKey(item);
    await this.#commit(state);
  }

  /** Takes `item` from the front of its key's queue (ordered endpoints) and starts the record behind it. */
  #nextOfKey(item: Item): void {
    if (item.orderKey === undefined) return;
    const queue = this.#keys.get(item.orderKey);
    if (!queue || queue[0] !== item) return;
    queue.shift();
    if (queue.length > 0) this.#enqueue(queue[0]!);
    else this.#keys.delete(item.orderKey);
  }

  /**
   * Commits the partition up to its lowest unfinished record (never past work in hand), with
   * its in-hand mark as the commit's metadata (every commit replaces the metadata, so every
   * one carries the mark); nothing when neither moved.
   */
  #commit(state: PartitionState): Promise<void> {
    state.commits = state.commits.then(async () => {
      if (state.revoked) return;
      const point = Math.max(state.committed, state.unfinished.size === 0 ? state.next : Math.min(...state.unfinished));
      const mark = state.mark;
      if (point === state.committed && mark <= state.markCommitted) return;
      try {
        await this.#parts.consumer.commitOffsets([{ topic: state.topic, partition: state.partition, offset: String(point), metadata: `${IN_HAND}${mark}` }]);
        state.committed = point;
        state.markCommitted = Math.max(state.markCommitted, mark);
      } catch (error) {
        // Lost the partition or the broker: uncommitted work comes again and the inbox drops the copies.
        throw new TransportError(`could not commit ${state.topic}[${state.partition}]@${point}: ${describe(error)}`, { cause: error, retriable: true });
      }
    });
    const done = state.commits;
    state.commits = state.commits.catch(() => undefined);
    return done;
  }

  async #retry(item: Item, delayMs: number, reason: DeadLetterReason): Promise<void> {
    void reason;
    if (item.orderKey !== undefined) {
      // In place: the key waits (its queue keeps this record in front); the slot is free.
      this.#waiting.add(item);
      item.timer = setTimeout(() => {
        this.#waiting.delete(item);
        if (this.#stopped) return;
        if (item.state.revoked) {
          // Its partition was taken away while it was running (so it stayed in front of its
          // key then): the new owner has it. It leaves the front now, or the records of its
          // key that come again, should the partition come back here, would wait behind it forever.
          if (!item.dropped) {
            item.dropped = true;
            this.#release();
          }
          this.#nextOfKey(item);
          return;
        }
        item.attempt += 1;
        this.#enqueue(item);
      }, Math.max(0, delayMs));
      return;
    }
    const envelope = decodeRecord(item.message.key, item.message.value, item.headers);
    await this.#parts.publishCopy(
      this.#parts.retryTopic,
      encodeRecord(envelope, {
        [HEADERS.attempt]: String(item.attempt + 1),
        [HEADERS.retryAt]: String(Date.now() + Math.max(0, delayMs)),
        ...(item.headers[HEADERS.replayed] === '1' ? { [HEADERS.replayed]: '1' } : {}),
      }),
    );
    await this.#finishCopied(item);
  }

  /**
   * Finishes a record whose copy (retry, dead letter) the broker has acknowledged. A commit
   * that fails now fails nothing: the record is done here and the next commit carries it
   * (a crash first redelivers it, and the inbox drops the copy). Rejecting would have the
   * core ask for a second copy.
   */
  async #finishCopied(item: Item): Promise<void> {
    await this.#finish(item).catch((error: unknown) => {
      this.#parts.logger.warn('kafka commit after a settled copy failed; the next commit carries it', { consumer: this.#endpoint.consumer, error: describeError(error) });
    });
  }

  async #deadLetter(item: Item, reason: DeadLetterReason): Promise<void> {
    const id = `${item.state.topic}:${item.state.partition}:${item.offset}`;
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(item.headers)) {
      if (name !== HEADERS.retryAt && name !== HEADERS.replayed) headers[name] = value;
    }
    headers[HEADERS.attempt] = String(item.attempt);
    headers[HEADERS.deadCode] = reason.code;
    headers[HEADERS.deadMessage] = reason.message;
    headers[HEADERS.deadAt] = String(Date.now());
    headers[HEADERS.origin] = id;
    // The dead-letter record's key is its id (compaction keeps the latest per id); the original key travels in a header.
    if (item.message.key === null) headers['courier-dead-key-null'] = '1';
    else headers['courier-dead-key'] = item.message.key.toString('base64');
    const value = item.message.value === null ? '' : item.message.value.toString('utf8');
    try {
      await this.#parts.publishCopy(this.#parts.deadLetterTopic, { key: id, value, headers });
    } catch (error) {
      const type = protocolType(error);
      if (type === undefined || !CONTENT_ERRORS.has(type) || Buffer.byteLength(reason.message, 'utf8') <= DEAD_REASON_CUT_BYTES) throw error;
      // Refused for its size: the reason text is what a dead letter adds to a record the
      // broker took, so a copy with the reason cut still carries the whole message. Should
      // that be refused too (a dead-letter topic configured smaller), the settle fails and
      // the core asks the record back, to be dead-lettered again later (logged, counted).
      headers[HEADERS.deadMessage] = cutUtf8(reason.message, DEAD_REASON_CUT_BYTES);
      headers[HEADERS.deadMessageBytes] = String(Buffer.byteLength(reason.message, 'utf8'));
      this.#parts.logger.warn('kafka refused a dead letter for its size; writing it with the reason cut', {
        consumer: this.#endpoint.consumer,
        record: id,
        error: describeError(error),
      });
      await this.#parts.publishCopy(this.#parts.deadLetterTopic, { key: id, value, headers });
    }
    await this.#finishCopied(item);
  }
}
