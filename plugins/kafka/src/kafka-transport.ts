import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  noopLogger,
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
import type { Admin, Kafka, Producer } from 'kafkajs';
import { encodeRecord, type OutgoingRecord } from './record-codec.js';
import { KafkaDeadLetters } from './kafka-dead-letters.js';
import { KafkaSubscription } from './kafka-subscription.js';
import { CONTENT_ERRORS, DLT_INFIX, LEADER_NOT_READY, NAME_PATTERN, RETRY_INFIX, TOPIC_MAX, Timeout, describe, protocolType, sleep, within } from './kafka-support.js';

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
 *   starts at the beginning of the topic's retention. `subscribe` resolves once the member
 *   has committed that start on each partition it was assigned without a committed offset
 *   (so the group's offsets name every topic it consumes: `consumerLag` reads them).
 * - Offsets are committed only up to the lowest record whose delivery has not been
 *   settled, per partition: a crash or rebalance redelivers every unfinished record and
 *   never skips one. Unordered endpoints run up to `concurrency` records at once, from any
 *   partition; ordered ones run one record per (topic, key) at a time, in offset order.
 * - A record is delivered flagged `redelivered` when a member of the group may have handed it
 *   to its handler before: every commit carries an in-hand mark that a member commits past a
 *   record before handing it over, and a member joining with the partition flags the records
 *   below the mark it finds (see `IN_HAND` in kafka-subscription.ts; offsets of earlier releases, which carry
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
    this.deadLetters = new KafkaDeadLetters({
      client: this.#client,
      prefix,
      connectTimeoutMs: this.#connectTimeoutMs,
      consumerRoom: room,
      knownTopics: this.#knownTopics,
      deadLetterTopic: (consumer) => this.deadLetterTopic(consumer),
      retryTopic: (consumer) => this.retryTopic(consumer),
      assertOpen: () => this.#assertOpen(),
      closedOr: (error) => this.#closedOr(error),
      connectedAdmin: () => this.#connectedAdmin(),
      topicOffsets: (topic) => this.#topicOffsets(topic),
      publishCopy: (topic, record) => this.#publishCopy(topic, record),
    });
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
      logStarts: async (topic) => {
        const ends = await this.#topicOffsets(topic);
        return new Map(ends.map((end) => [end.partition, Number(end.low)]));
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

  /**
   * See `Transport.consumerLag`: the consumer group's lag as Kafka counts it — per partition
   * of every topic the group has committed offsets on (its topics and its retry topic; a
   * subscription commits its start on each partition it is assigned, see
   * `KafkaSubscription#commitStarts`), the partition's end offset minus the group's committed
   * offset, summed. A partition without a committed offset counts from its log start (where
   * the group would start: new groups read from the beginning), and a committed offset below
   * the log start (records removed by retention) from the log start too. Delivered records not
   * yet committed still count: Kafka keeps no per-record delivery state, so this is at most a
   * subscription's in-hand records (`maxBuffered`) above "waiting, not delivered".
   *
   * Null when the broker has no such group (it never subscribed, or it expired:
   * `offsets.retention.minutes` after its last member left). Passive: admin reads only
   * (DescribeGroups, OffsetFetch, ListOffsets, Metadata with auto-creation off, as every
   * kafkajs admin client asks): it joins no group, commits nothing and creates no topic. A
   * topic deleted since the group committed on it counts 0.
   */
  async consumerLag(consumer: string): Promise<number | null> {
    this.#assertOpen();
    const groupId = this.groupId(consumer);
    try {
      const admin = await this.#connectedAdmin();
      const { groups } = await admin.describeGroups([groupId]);
      const group = groups.find((described) => described.groupId === groupId);
      if (!group || group.state === 'Dead') return null;
      const committed = await admin.fetchOffsets({ groupId });
      let lag = 0;
      for (const { topic, partitions } of committed) {
        let ends: Awaited<ReturnType<Admin['fetchTopicOffsets']>>;
        try {
          ends = await this.#topicOffsets(topic);
        } catch (error) {
          if (protocolType(error) === 'UNKNOWN_TOPIC_OR_PARTITION') continue;
          throw error;
        }
        const at = new Map(partitions.map(({ partition, offset }) => [partition, Number(offset)]));
        for (const end of ends) {
          const start = Math.max(at.get(end.partition) ?? -1, Number(end.low));
          lag += Math.max(0, Number(end.high) - start);
        }
      }
      return lag;
    } catch (error) {
      if (error instanceof CourierError) throw this.#closedOr(error);
      throw this.#closedOr(new TransportError(`could not read the lag of consumer group '${groupId}': ${describe(error)}`, { cause: error, retriable: true }));
    }
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
}
