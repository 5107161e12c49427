import { createHash } from 'node:crypto';
import {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SetQueueAttributesCommand,
  type Message,
  type MessageAttributeValue,
  type SendMessageBatchRequestEntry,
  type SQSClient,
} from '@aws-sdk/client-sqs';
import type { PublishBatchRequestEntry, SNSClient } from '@aws-sdk/client-sns';
import {
  ClosedError,
  ConfigError,
  CourierError,
  SerializationError,
  TransportError,
  abortableSleep,
  describeError,
  noopLogger,
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
  ATTRIBUTES,
  ATTRIBUTE_ROOM_BYTES,
  SQS_MESSAGE_BYTES,
  attributesOf,
  contentProblems,
  deadMarkOf,
  deadMarkValue,
  envelopeOf,
  messageBytes,
  queueNamePart,
} from './sqs-mapping.js';
import { SnsTopics, queuePolicy } from './sns-topics.js';

/** Configuration of {@link SqsTransport}. */
export interface SqsTransportConfig {
  /** The user's SQS client (AWS SDK v3); the transport never destroys it. */
  readonly client: SQSClient;
  /**
   * The user's SNS client (AWS SDK v3, `@aws-sdk/client-sns`): turns on the **SNS → SQS**
   * mode — a topic is an SNS topic, each consumer group one SQS queue subscribed to its
   * topics with raw message delivery, so every group gets every message (`fanOut: true`).
   * Without it, the SQS-only mode: a topic is a queue with one group. Never destroyed here.
   */
  readonly sns?: SNSClient;
  /** Prefix of every queue name (say, the service or environment). Default none. */
  readonly prefix?: string;
  /**
   * FIFO queues (`.fifo`): per-key order (MessageGroupId = key, or the messageId for a
   * message without one) and de-duplication by messageId within SQS's 5-minute window.
   * Default false (standard queues: no ordering declared).
   */
  readonly fifo?: boolean;
  /**
   * Create missing queues, dead-letter queues and redrive policies (default true). When
   * false, a missing queue makes `publish` and `subscribe` fail with a `ConfigError` naming it.
   */
  readonly provision?: boolean;
  /** The queues' visibility timeout in seconds, kept extended while a handler runs (default 30). */
  readonly visibilityTimeoutSeconds?: number;
  /** Long-polling wait of each receive, 0–20 seconds (default 20). */
  readonly waitTimeSeconds?: number;
  /**
   * The redrive policy's `maxReceiveCount` (default 1000, SQS's largest): receives after
   * which SQS itself moves a message to the dead-letter queue. A backstop only: Courier
   * dead-letters by its retry policy long before; retries count as receives.
   */
  readonly maxReceiveCount?: number;
  readonly logger?: Logger;
}

const MAX_BATCH_ENTRIES = 10;
/** ChangeMessageVisibility's ceiling: 12 hours from the message's first receive. */
const MAX_VISIBILITY_SECONDS = 12 * 60 * 60;
const QUEUE_NAME_MAX = 80;
/** SNS topic names: 1-256 characters. */
const TOPIC_NAME_MAX = 256;
/** SendMessage's longest DelaySeconds (15 minutes). */
const MAX_DELAY_SECONDS = 900;
const FIFO_SUFFIX = '.fifo';
const DLQ_SUFFIX = '-dlq';
/** 14 days, SQS's longest retention: dead letters and unconsumed messages are kept as long as SQS can. */
const RETENTION_SECONDS = '1209600';

/** Error names of the service's throttling answers: retriable, never a message's fault. */
const THROTTLING = new Set(['ThrottlingException', 'Throttling', 'RequestThrottled', 'RequestThrottledException', 'TooManyRequestsException', 'KmsThrottled']);

interface ServiceFault {
  readonly name?: string;
  readonly $fault?: 'client' | 'server';
}

/** A queue that does not exist (SQS answers `QueueDoesNotExist`, `AWS.SimpleQueueService.NonExistentQueue` in the query protocol). */
function isMissingQueue(error: unknown): boolean {
  const name = (error as ServiceFault | undefined)?.name ?? '';
  return name === 'QueueDoesNotExist' || name.includes('NonExistentQueue');
}

/** One message on its way to a batch call: `id` is its index in the publish call, the entry's Id. */
interface OutgoingEntry {
  readonly id: string;
  readonly index: number;
  readonly envelope: Envelope;
  readonly attributes: Record<string, MessageAttributeValue>;
  readonly bytes: number;
}

/** A batch call's answer, as SendMessageBatch and PublishBatch both give it. */
interface BatchAnswer {
  readonly Successful?: readonly { readonly Id?: string | undefined }[] | undefined;
  readonly Failed?: readonly { readonly Id?: string | undefined; readonly Code?: string | undefined; readonly Message?: string | undefined; readonly SenderFault?: boolean | undefined }[] | undefined;
}

/** How {@link SqsTransport} publishes to one kind of destination: SQS queues, or SNS topics. */
interface GroupedSend {
  readonly service: 'sqs' | 'sns';
  readonly kind: 'queue' | 'topic';
  /** The destination's name (queue or topic name) of an envelope. */
  readonly destinationOf: (envelope: Envelope) => string;
  /** The addresses (queue URL, topic ARN) by destination name of these envelopes' destinations; a `ConfigError` names every missing one. */
  readonly resolve: (envelopes: readonly Envelope[]) => Promise<Map<string, string>>;
  /** Forgets a remembered address, so `resolve` asks the service again. */
  readonly forget: (destination: string) => void;
  /** The service's answer for a destination that does not exist. */
  readonly isMissing: (error: unknown) => boolean;
  readonly send: (address: string, entries: readonly OutgoingEntry[], fifo: (envelope: Envelope) => { MessageGroupId?: string; MessageDeduplicationId?: string }) => Promise<BatchAnswer>;
}

/** An SDK error as a Courier error: throttling, server faults and network failures are retriable `TRANSPORT`; a client fault is not. */
function transportErrorOf(error: unknown, what: string): CourierError {
  if (error instanceof CourierError) return error;
  const fault = error as ServiceFault | undefined;
  const retriable = THROTTLING.has(fault?.name ?? '') || fault?.$fault !== 'client';
  return new TransportError(`${what}: ${describeError(error)}`, { retriable, cause: error, ...(retriable ? {} : { code: 'PUBLISH_REJECTED' }) });
}

/**
 * Courier transport on Amazon SQS, alone or behind Amazon SNS. SQS only: a topic is a queue
 * with one consumer group. With an `sns` client (SNS → SQS): a topic is an SNS topic and each
 * consumer group one SQS queue subscribed to its topics with raw message delivery, so every
 * group gets every message (`fanOut: true`); messages are published with `PublishBatch`
 * (at most 10 entries, an entry SNS refuses fails alone) and everything below about
 * consuming holds for the group's queue.
 *
 * Guarantees:
 * - `publish` sends in `SendMessageBatch` calls of at most 10 entries and 256 KiB, and
 *   resolves when SQS answered each; an entry SQS refuses fails alone (`PUBLISH_REJECTED`),
 *   a throttled or unreachable service is a retriable `TRANSPORT` failure (the relay pauses
 *   without counting attempts). The envelope travels as the `courier-envelope` attribute,
 *   the payload as the body; payloads over 240 KiB (`maxMessageBytes`) are refused.
 * - `subscribe` long-polls each topic's queue, keeps a message invisible while its handler
 *   runs (extending the visibility timeout), deletes it only on `ack` (after the inbox
 *   committed), retries by changing its visibility (whole seconds, at most 12 hours from its
 *   first receive) and dead-letters into the consumer's dead-letter queue with the reason.
 * - FIFO (`fifo: true`): MessageGroupId = key, MessageDeduplicationId = messageId, so a
 *   relay's duplicate within SQS's 5-minute de-duplication window is dropped by SQS (later
 *   ones by the inbox); keys are delivered in order, one at a time, across instances.
 * - `attempt` is SQS's `ApproximateReceiveCount`: SQS keeps no other state per message, so
 *   a receive after a crash counts as an attempt too, and every delivery after the first
 *   is reported `redelivered` (the transport cannot tell a retry from a crash).
 * - SQS only: a topic has one consumer group (`fanOut: false`): the bus refuses a second group.
 * - SNS → SQS: provisioning creates topics, queues, the queue policy letting the topics send,
 *   and raw subscriptions, idempotently; with provisioning off nothing is created and a
 *   `ConfigError` names every missing topic, queue and subscription. A replay goes to the
 *   group's own queue only.
 */
export class SqsTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  readonly limits: PortLimits;
  readonly deadLetters: TransportDeadLetters;
  /**
   * SNS → SQS mode: the consumer group's lag, its queue's `ApproximateNumberOfMessages` plus
   * `…Delayed` (waiting, not yet received; in flight not counted), read from the queue's
   * attributes without receiving — nothing hidden, nothing created; null without a queue.
   * Approximate, as SQS says (it may lag a minute on AWS). Absent in SQS-only mode, where a
   * consumer has no queue of its own (its topics' queues are shared).
   */
  readonly consumerLag?: (consumer: string) => Promise<number | null>;
  readonly #client: SQSClient;
  readonly #sns: SnsTopics | undefined;
  readonly #prefix: string;
  readonly #fifo: boolean;
  readonly #provision: boolean;
  readonly #visibility: number;
  readonly #wait: number;
  readonly #maxReceiveCount: number;
  readonly #logger: Logger;
  readonly #urls = new Map<string, Promise<string>>();
  readonly #topicArns = new Map<string, Promise<string>>();
  readonly #subscriptions = new Set<SqsSubscription>();
  readonly #retried = new RetryLedger();
  #closed = false;
  #closing: Promise<void> | undefined;

  constructor(config: SqsTransportConfig) {
    const problems: string[] = [];
    const visibility = config.visibilityTimeoutSeconds ?? 30;
    const wait = config.waitTimeSeconds ?? 20;
    const maxReceiveCount = config.maxReceiveCount ?? 1000;
    if (!Number.isInteger(visibility) || visibility < 3 || visibility > MAX_VISIBILITY_SECONDS) problems.push(`'visibilityTimeoutSeconds' must be an integer from 3 to 43200, got ${visibility}`);
    if (!Number.isInteger(wait) || wait < 0 || wait > 20) problems.push(`'waitTimeSeconds' must be an integer from 0 to 20, got ${wait}`);
    if (!Number.isInteger(maxReceiveCount) || maxReceiveCount < 1 || maxReceiveCount > 1000) problems.push(`'maxReceiveCount' must be an integer from 1 to 1000, got ${maxReceiveCount}`);
    const prefix = config.prefix ?? '';
    if (!/^[A-Za-z0-9_-]*$/.test(prefix)) problems.push(`'prefix' '${prefix}' may hold only A-Z a-z 0-9 - _ (SQS queue names)`);
    if (prefix.length > 40) problems.push(`'prefix' '${prefix}' is longer than 40 characters`);
    if (problems.length > 0) throw new ConfigError(problems);
    this.#client = config.client;
    this.#sns = config.sns === undefined ? undefined : new SnsTopics(config.sns);
    this.#prefix = prefix;
    this.#fifo = config.fifo ?? false;
    this.#provision = config.provision ?? true;
    this.#visibility = visibility;
    this.#wait = wait;
    this.#maxReceiveCount = maxReceiveCount;
    this.#logger = config.logger ?? noopLogger;
    this.capabilities = {
      orderingByKey: this.#fifo,
      orderedPipelining: false,
      fanOut: this.#sns !== undefined,
      nativeDelay: false,
      nativeDeadLetter: true,
      maxMessageBytes: SQS_MESSAGE_BYTES - ATTRIBUTE_ROOM_BYTES,
    };
    const room = QUEUE_NAME_MAX - prefix.length - (this.#fifo ? FIFO_SUFFIX.length : 0);
    this.limits =
      this.#sns === undefined
        ? { topic: { chars: room }, consumer: { chars: room - DLQ_SUFFIX.length } }
        : { topic: { chars: TOPIC_NAME_MAX - prefix.length - (this.#fifo ? FIFO_SUFFIX.length : 0) }, consumer: { chars: room - DLQ_SUFFIX.length } };
    this.deadLetters = {
      // The consumer's dead-letter queue, looked up without creating it (subscribe creates it
      // where it provisions): a mistyped prefix or consumer name is "no such queue".
      exists: async (consumer) => (await this.#deadLetterUrl(consumer)) !== undefined,
      count: (consumer) => this.#countDead(consumer),
      list: (consumer, options) => this.#listDead(consumer, options?.limit ?? 100),
      replay: (consumer, ids) => this.#replayDead(consumer, ids),
      purge: (consumer, ids) => this.#purgeDead(consumer, ids),
    };
    if (this.#sns !== undefined) this.consumerLag = (consumer) => this.#lag(consumer);
  }

  async #lag(consumer: string): Promise<number | null> {
    let url: string | undefined;
    try {
      url = (await this.#client.send(new GetQueueUrlCommand({ QueueName: this.consumerQueueName(consumer) }))).QueueUrl;
    } catch (error) {
      if (isMissingQueue(error)) return null;
      throw transportErrorOf(error, `reading the lag of consumer '${consumer}' failed`);
    }
    try {
      const names = ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesDelayed'] as const;
      const attributes = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: [...names] }))).Attributes ?? {};
      return names.reduce((sum, name) => sum + Number(attributes[name] ?? 0), 0);
    } catch (error) {
      if (isMissingQueue(error)) return null;
      throw transportErrorOf(error, `reading the lag of consumer '${consumer}' failed`);
    }
  }

  /** Refuses what SQS would refuse for its content (characters outside its set, an empty body). */
  validate(envelope: Envelope): readonly string[] {
    return contentProblems(envelope);
  }

  /** SQS-only mode: the queue of a topic. */
  queueName(topic: string): string {
    return `${this.#prefix}${queueNamePart(topic)}${this.#fifo ? FIFO_SUFFIX : ''}`;
  }

  /** SNS → SQS mode: the SNS topic of a Courier topic (`.` becomes `_`, as in queue names). */
  topicName(topic: string): string {
    return `${this.#prefix}${queueNamePart(topic)}${this.#fifo ? FIFO_SUFFIX : ''}`;
  }

  /** SNS → SQS mode: the queue of a consumer group, subscribed to each of its topics. */
  consumerQueueName(consumer: string): string {
    return `${this.#prefix}${queueNamePart(consumer)}${this.#fifo ? FIFO_SUFFIX : ''}`;
  }

  /** The queues an endpoint reads: its topics' queues (SQS only), or its group's queue (SNS → SQS). */
  queuesOf(endpoint: { readonly consumer: string; readonly topics: readonly string[] }): readonly string[] {
    return this.#sns === undefined ? endpoint.topics.map((topic) => this.queueName(topic)) : [this.consumerQueueName(endpoint.consumer)];
  }

  /** The dead-letter queue of a consumer (group). */
  deadLetterQueueName(consumer: string): string {
    return `${this.#prefix}${queueNamePart(consumer)}${DLQ_SUFFIX}${this.#fifo ? FIFO_SUFFIX : ''}`;
  }

  /**
   * SQS only: creates what is missing for `topics` (their queues) and `consumers` (their
   * dead-letter queues), idempotently; redrive policies are set at `subscribe`, which knows
   * which consumer reads which queue. SNS → SQS: creates the SNS topics of `topics`, the
   * queues of `consumers`, and for each `subscriptions` entry (consumer → its topics) the
   * group's queue, dead-letter queue, redrive policy, queue policy and raw subscriptions.
   * With `provision: false` it only checks, and rejects with a `ConfigError` naming every
   * missing queue (and topic and subscription).
   */
  async provision(options: { topics?: readonly string[]; consumers?: readonly string[]; subscriptions?: Readonly<Record<string, readonly string[]>> } = {}): Promise<void> {
    if (this.#sns !== undefined) {
      const subscriptions = Object.entries(options.subscriptions ?? {});
      const topics = [...new Set([...(options.topics ?? []), ...subscriptions.flatMap(([, list]) => list)])];
      const consumers = [...new Set([...(options.consumers ?? []), ...subscriptions.map(([consumer]) => consumer)])];
      await this.#snsTopology(topics, consumers, subscriptions);
      return;
    }
    const names = [...(options.topics ?? []).map((topic) => this.queueName(topic)), ...(options.consumers ?? []).map((consumer) => this.deadLetterQueueName(consumer))];
    await this.#urlsOf(names);
  }

  /**
   * SNS → SQS: makes sure the topics exist, each consumer's queue and dead-letter queue
   * exist, and each queue is subscribed (raw delivery) to its topics with a queue policy
   * letting them send. Provisioning on: creates what is missing, idempotently. Off: creates
   * nothing and rejects with one `ConfigError` naming every missing topic, queue and
   * subscription. Answers the topics' ARNs and the queues' URLs.
   */
  async #snsTopology(
    topics: readonly string[],
    consumers: readonly string[],
    subscriptions: readonly (readonly [string, readonly string[]])[],
  ): Promise<{ arns: Map<string, string>; urls: Map<string, string> }> {
    const sns = this.#sns!;
    const problems: string[] = [];
    const queues = consumers.flatMap((consumer) => [this.consumerQueueName(consumer), this.deadLetterQueueName(consumer)]);
    const [arns, urls] = await Promise.all([
      this.#topicArnsOf(topics).catch((error: unknown) => {
        if (!(error instanceof ConfigError)) throw error;
        problems.push(...error.problems);
        return undefined;
      }),
      this.#urlsOf(queues).catch((error: unknown) => {
        if (!(error instanceof ConfigError)) throw error;
        problems.push(...error.problems);
        return undefined;
      }),
    ]);
    for (const [consumer, list] of subscriptions) {
      const queue = this.consumerQueueName(consumer);
      const url = urls?.get(queue);
      const topicArns = list.map((topic) => arns?.get(this.topicName(topic)));
      if (url === undefined || topicArns.some((arn) => arn === undefined)) {
        if (!this.#provision) for (const topic of list) problems.push(`sns subscription of queue '${queue}' to topic '${this.topicName(topic)}' does not exist (provisioning is off: subscribe it with RawMessageDelivery, or set provision: true)`);
        continue;
      }
      if (this.#provision) await this.#redrive([url], urls!.get(this.deadLetterQueueName(consumer))!);
      const queueArn = await this.#queueArn(url);
      if (this.#provision) {
        // AWS delivers only what the queue policy lets the topic send (the stand-in in the tests does not check it).
        const current = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['Policy'] }))).Attributes?.['Policy'];
        const policy = queuePolicy(current, queueArn, topicArns as string[]);
        if (policy !== current) await this.#client.send(new SetQueueAttributesCommand({ QueueUrl: url, Attributes: { Policy: policy } }));
      }
      for (const [index, topicArn] of (topicArns as string[]).entries()) {
        const topic = this.topicName(list[index]!);
        const subscription = this.#provision ? await sns.subscribe(topicArn, queueArn) : await sns.subscriptionOf(topicArn, queueArn);
        if (subscription === undefined) {
          problems.push(`sns subscription of queue '${queue}' to topic '${topic}' does not exist (provisioning is off: subscribe it with RawMessageDelivery, or set provision: true)`);
        } else if (!(await sns.isRaw(subscription))) {
          problems.push(`sns subscription '${subscription}' of queue '${queue}' to topic '${topic}' does not use raw message delivery: set RawMessageDelivery to true`);
        }
      }
    }
    if (problems.length > 0) throw new ConfigError(problems);
    return { arns: arns!, urls: urls! };
  }

  async #queueArn(url: string): Promise<string> {
    const arn = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] }))).Attributes?.['QueueArn'];
    if (arn === undefined) throw new TransportError(`sqs gave no QueueArn for '${url}'`);
    return arn;
  }

  /** The ARNs of `topics`' SNS topics, created when missing (provisioning on), else a `ConfigError` naming every missing one. */
  async #topicArnsOf(topics: readonly string[]): Promise<Map<string, string>> {
    const names = [...new Set(topics.map((topic) => this.topicName(topic)))];
    const settled = await Promise.allSettled(names.map((name) => this.#topicArnOf(name)));
    const missing = names.filter((_, index) => {
      const result = settled[index]!;
      return result.status === 'fulfilled' && result.value === undefined;
    });
    const failed = settled.find((result) => result.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    if (missing.length > 0) throw new ConfigError(missing.map((name) => `sns topic '${name}' does not exist (provisioning is off: create it, or set provision: true)`));
    return new Map(names.map((name, index) => [name, (settled[index] as PromiseFulfilledResult<string>).value]));
  }

  #topicArnOf(name: string): Promise<string | undefined> {
    let arn = this.#topicArns.get(name);
    if (arn === undefined) {
      arn = this.#provision ? this.#sns!.create(name, this.#fifo) : this.#sns!.find(name).then((found) => found ?? Promise.reject(new MissingTopic()));
      this.#topicArns.set(name, arn);
      // A failure (a missing topic too) is not remembered: the next call asks again.
      arn.catch(() => this.#topicArns.delete(name));
    }
    return arn.catch((error: unknown) => {
      if (error instanceof MissingTopic) return undefined;
      throw error;
    });
  }

  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    if (this.#closed) throw new ClosedError('sqs transport is closed');
    if (this.#sns !== undefined) {
      const sns = this.#sns;
      return this.#sendGrouped(messages, options, {
        service: 'sns',
        kind: 'topic',
        destinationOf: (envelope) => this.topicName(envelope.topic),
        resolve: (envelopes) => this.#topicArnsOf(envelopes.map((envelope) => envelope.topic)),
        forget: (topic) => this.#topicArns.delete(topic),
        isMissing: (error) => (error as ServiceFault | undefined)?.name === 'NotFoundException',
        send: (arn, entries, fifo) =>
          sns.publishBatch(
            arn,
            entries.map(({ id, envelope, attributes }): PublishBatchRequestEntry => ({ Id: id, Message: envelope.payload, MessageAttributes: attributes, ...fifo(envelope) })),
          ),
      });
    }
    return this.#sendGrouped(messages, options, {
      service: 'sqs',
      kind: 'queue',
      destinationOf: (envelope) => this.queueName(envelope.topic),
      resolve: (envelopes) => this.#urlsOf(envelopes.map((envelope) => this.queueName(envelope.topic))),
      forget: (queue) => this.#urls.delete(queue),
      isMissing: isMissingQueue,
      send: (url, entries, fifo) =>
        this.#client.send(
          new SendMessageBatchCommand({
            QueueUrl: url,
            Entries: entries.map(({ id, envelope, attributes }): SendMessageBatchRequestEntry => ({ Id: id, MessageBody: envelope.payload, MessageAttributes: attributes, ...fifo(envelope) })),
          }),
        ),
    });
  }

  /**
   * Publishes `messages` in batch calls per destination (SQS queue or SNS topic), at most 10
   * entries and 256 KiB a call, for both modes. An entry the service refuses fails alone
   * (`PUBLISH_REJECTED` for a sender fault, retriable for a server fault or throttling); a
   * message SQS would refuse whatever the destination is refused before sending, alone; a
   * destination deleted since its address was remembered is looked up again, once (created
   * again with provisioning on, a `ConfigError` naming it otherwise); a throttled or
   * unreachable service before anything was sent fails the call, so the relay pauses
   * without burning attempts.
   */
  async #sendGrouped(messages: readonly Envelope[], options: { signal?: AbortSignal }, via: GroupedSend): Promise<readonly PublishResult[]> {
    if (options.signal?.aborted) throw new TransportError('publish was aborted before sending', { code: 'ABORTED', retriable: true });
    const results: (PublishResult | undefined)[] = messages.map((envelope) => this.#refusal(envelope));
    const byDestination = new Map<string, OutgoingEntry[]>();
    messages.forEach((envelope, index) => {
      if (results[index] !== undefined) return;
      const attributes = attributesOf(envelope);
      const bytes = messageBytes(envelope.payload, attributes);
      if (bytes > SQS_MESSAGE_BYTES) {
        results[index] = { messageId: envelope.messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `message '${envelope.messageId}' is ${bytes} bytes with its attributes, over ${via.service.toUpperCase()}'s ${SQS_MESSAGE_BYTES}`) };
        return;
      }
      const destination = via.destinationOf(envelope);
      const list = byDestination.get(destination) ?? [];
      list.push({ id: String(index), index, envelope, attributes, bytes });
      byDestination.set(destination, list);
    });
    if (byDestination.size === 0) return results as PublishResult[];
    const fifo = (envelope: Envelope): { MessageGroupId?: string; MessageDeduplicationId?: string } =>
      this.#fifo ? { MessageGroupId: groupIdOf(envelope), MessageDeduplicationId: dedupIdOf(envelope.messageId) } : {};
    let addresses: Map<string, string>;
    try {
      addresses = await via.resolve([...byDestination.values()].map((list) => list[0]!.envelope));
    } catch (error) {
      if (error instanceof ConfigError) {
        for (const list of byDestination.values()) for (const { envelope, index } of list) results[index] = { messageId: envelope.messageId, ok: false, error };
        return results as PublishResult[];
      }
      throw transportErrorOf(error, `${via.service} is unreachable`);
    }
    let sent = false;
    for (const [destination, list] of byDestination) {
      for (const batch of batches(list)) {
        if (options.signal?.aborted || this.#closed) {
          const error = this.#closed ? new ClosedError('sqs transport closed while publishing') : new TransportError('publish was aborted', { code: 'ABORTED', retriable: true });
          for (const { envelope, index } of batch) results[index] = { messageId: envelope.messageId, ok: false, error };
          continue;
        }
        try {
          let answer;
          try {
            answer = await via.send(addresses.get(destination)!, batch, fifo);
          } catch (error) {
            if (!via.isMissing(error)) throw error;
            // The destination was deleted since its address was remembered: look it up again
            // (created again with provisioning on, a ConfigError naming it with provisioning off), once.
            via.forget(destination);
            addresses.set(destination, (await via.resolve([list[0]!.envelope])).get(destination)!);
            answer = await via.send(addresses.get(destination)!, batch, fifo);
          }
          sent = true;
          for (const ok of answer.Successful ?? []) results[Number(ok.Id)] = { messageId: messages[Number(ok.Id)]!.messageId, ok: true };
          for (const failure of answer.Failed ?? []) {
            const envelope = messages[Number(failure.Id)]!;
            const what = `${via.service} refused message '${envelope.messageId}' on ${via.kind} '${destination}': ${failure.Code ?? 'error'}${failure.Message ? ` (${failure.Message})` : ''}`;
            const error = failure.SenderFault === false || THROTTLING.has(failure.Code ?? '')
              ? new TransportError(what, { retriable: true })
              : new TransportError(what, { code: 'PUBLISH_REJECTED', retriable: false });
            results[Number(failure.Id)] = { messageId: envelope.messageId, ok: false, error };
          }
          for (const { envelope, index } of batch) {
            results[index] ??= { messageId: envelope.messageId, ok: false, error: new TransportError(`${via.service} answered nothing for message '${envelope.messageId}'`, { retriable: true }) };
          }
        } catch (error) {
          const failure = transportErrorOf(error, `${via.kind === 'queue' ? 'sending to' : 'publishing to'} ${via.kind} '${destination}' failed`);
          // Nothing sent yet and the service (not a message) failed: the call fails as a whole, so the relay pauses.
          if (!sent && failure.retriable) throw failure;
          for (const { envelope, index } of batch) results[index] = { messageId: envelope.messageId, ok: false, error: failure };
        }
      }
    }
    return results as PublishResult[];
  }

  /** A message refused before sending, or undefined. */
  #refusal(envelope: Envelope): PublishResult | undefined {
    const problems = this.validate(envelope);
    if (problems.length > 0) return { messageId: envelope.messageId, ok: false, error: new TransportError(problems.join('; '), { code: 'PUBLISH_REJECTED', retriable: false }) };
    const bytes = payloadBytes(envelope);
    if (bytes > this.capabilities.maxMessageBytes) {
      return { messageId: envelope.messageId, ok: false, error: new SerializationError('PAYLOAD_TOO_LARGE', `payload of message '${envelope.messageId}' is ${bytes} bytes, over maxMessageBytes ${this.capabilities.maxMessageBytes}`) };
    }
    return undefined;
  }

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    if (this.#closed) throw new ClosedError('sqs transport is closed');
    if (endpoint.ordered && !this.#fifo) throw new ConfigError(`consumer '${endpoint.consumer}' is ordered, but standard SQS queues keep no order: use fifo: true`);
    const queues = this.queuesOf(endpoint);
    const dlq = this.deadLetterQueueName(endpoint.consumer);
    let urls: Map<string, string>;
    try {
      if (this.#sns !== undefined) {
        urls = (await this.#snsTopology(endpoint.topics, [endpoint.consumer], [[endpoint.consumer, endpoint.topics]])).urls;
      } else {
        urls = await this.#urlsOf([...queues, dlq]);
        if (this.#provision) await this.#redrive(queues.map((queue) => urls.get(queue)!), urls.get(dlq)!);
      }
    } catch (error) {
      throw transportErrorOf(error, `subscribing consumer '${endpoint.consumer}' failed`);
    }
    if (this.#closed) throw new ClosedError('sqs transport closed while subscribing');
    const subscription = new SqsSubscription({
      client: this.#client,
      endpoint,
      handler,
      queues: queues.map((queue) => ({ name: queue, url: urls.get(queue)! })),
      deadLetterUrl: urls.get(dlq)!,
      fifo: this.#fifo,
      visibility: this.#visibility,
      wait: this.#wait,
      logger: this.#logger,
      retried: this.#retried,
      onClosed: () => this.#subscriptions.delete(subscription),
    });
    this.#subscriptions.add(subscription);
    subscription.start();
    return subscription;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#closing ??= Promise.all([...this.#subscriptions].map((subscription) => subscription.close())).then(() => undefined);
    await this.#closing;
  }

  /**
   * Puts a copy of a received message into `consumer`'s dead-letter queue with the reason
   * (the queue is created if missing and provisioning is on). Used by {@link SqsEventSource},
   * whose deliveries come from Lambda events rather than this transport's receives; the
   * caller deletes the original (the event source does, for a record not reported failed).
   */
  async deadLetterCopy(
    consumer: string,
    message: { readonly id: string; readonly body: string; readonly attributes: Readonly<Record<string, MessageAttributeValue>>; readonly groupId?: string | undefined },
    reason: DeadLetterReason,
    attempt: number,
  ): Promise<void> {
    const [url] = (await this.#urlsOf([this.deadLetterQueueName(consumer)])).values();
    await this.#client.send(
      new SendMessageCommand({
        QueueUrl: url!,
        MessageBody: message.body === '' ? ' ' : message.body,
        MessageAttributes: deadAttributes(message.attributes, reason, attempt),
        ...(this.#fifo ? { MessageGroupId: message.groupId ?? message.id, MessageDeduplicationId: dedupIdOf(`dead-${message.id}-${attempt}`) } : {}),
      }),
    );
  }

  /** Sets each queue's redrive policy to `deadLetterUrl` (skipped where it already points there). */
  async #redrive(queueUrls: readonly string[], deadLetterUrl: string): Promise<void> {
    const arn = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: deadLetterUrl, AttributeNames: ['QueueArn'] }))).Attributes?.['QueueArn'];
    if (arn === undefined) throw new TransportError(`sqs gave no QueueArn for '${deadLetterUrl}'`);
    const policy = JSON.stringify({ deadLetterTargetArn: arn, maxReceiveCount: this.#maxReceiveCount });
    for (const url of queueUrls) {
      const current = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['RedrivePolicy'] }))).Attributes?.['RedrivePolicy'];
      if (current !== undefined && (JSON.parse(current) as { deadLetterTargetArn?: string }).deadLetterTargetArn === arn) continue;
      await this.#client.send(new SetQueueAttributesCommand({ QueueUrl: url, Attributes: { RedrivePolicy: policy } }));
    }
  }

  /** The URLs of `names`, created when missing (provisioning on), else a `ConfigError` naming every missing one. */
  async #urlsOf(names: readonly string[]): Promise<Map<string, string>> {
    const settled = await Promise.allSettled(names.map((name) => this.#urlOf(name)));
    const missing = names.filter((_, index) => {
      const result = settled[index]!;
      return result.status === 'rejected' && isMissingQueue(result.reason);
    });
    if (missing.length > 0) throw new ConfigError(missing.map((name) => `sqs queue '${name}' does not exist (provisioning is off: create it, or set provision: true)`));
    const failed = settled.find((result) => result.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    return new Map(names.map((name, index) => [name, (settled[index] as PromiseFulfilledResult<string>).value]));
  }

  #urlOf(name: string): Promise<string> {
    let url = this.#urls.get(name);
    if (url === undefined) {
      url = this.#fetchUrl(name);
      this.#urls.set(name, url);
      // A failure is not remembered: the next call asks again.
      url.catch(() => this.#urls.delete(name));
    }
    return url;
  }

  async #fetchUrl(name: string): Promise<string> {
    if (!this.#provision) return (await this.#client.send(new GetQueueUrlCommand({ QueueName: name }))).QueueUrl!;
    const attributes: Record<string, string> = { MessageRetentionPeriod: RETENTION_SECONDS };
    if (!name.endsWith(`${DLQ_SUFFIX}${this.#fifo ? FIFO_SUFFIX : ''}`)) attributes['VisibilityTimeout'] = String(this.#visibility);
    if (this.#fifo) attributes['FifoQueue'] = 'true';
    // CreateQueue is idempotent for the same attributes; a queue created elsewhere with other ones is used as it is.
    try {
      return (await this.#client.send(new CreateQueueCommand({ QueueName: name, Attributes: attributes }))).QueueUrl!;
    } catch (error) {
      const code = (error as ServiceFault).name ?? '';
      if (code === 'QueueAlreadyExists' || code === 'QueueNameExists') return (await this.#client.send(new GetQueueUrlCommand({ QueueName: name }))).QueueUrl!;
      throw error;
    }
  }

  /** The dead-letter queue's URL without creating it: a read creates nothing. */
  async #deadLetterUrl(consumer: string): Promise<string | undefined> {
    try {
      return (await this.#client.send(new GetQueueUrlCommand({ QueueName: this.deadLetterQueueName(consumer) }))).QueueUrl;
    } catch (error) {
      if (isMissingQueue(error)) return undefined;
      throw transportErrorOf(error, `reading the dead letters of consumer '${consumer}' failed`);
    }
  }

  /**
   * Browses a dead-letter queue. SQS has no peek: a receive hides what it returns for its
   * visibility timeout, so this receives with a visibility timeout of 0 (nothing is hidden
   * from any other reader or consumer) and de-duplicates by message id, until `until` says
   * so, nothing new came for 3 receives in a row, or 100 receives were made. On a large
   * standard queue a receive samples servers, so a listing is complete only up to what
   * those receives saw; on a FIFO queue it sees the first messages of each group.
   */
  async #browse(url: string, until: (seen: ReadonlyMap<string, Message>) => boolean): Promise<Map<string, Message>> {
    const seen = new Map<string, Message>();
    let quiet = 0;
    for (let round = 0; round < 100 && quiet < 3 && !until(seen); round += 1) {
      const answer = await this.#client.send(
        new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, VisibilityTimeout: 0, WaitTimeSeconds: 0, MessageAttributeNames: ['All'], MessageSystemAttributeNames: ['All'] }),
      );
      let fresh = 0;
      for (const message of answer.Messages ?? []) {
        if (message.MessageId === undefined) continue;
        if (!seen.has(message.MessageId)) fresh += 1;
        seen.set(message.MessageId, message);
      }
      quiet = fresh === 0 ? quiet + 1 : 0;
    }
    return seen;
  }

  #deadLetterOf(consumer: string, message: Message): DeadLetter | undefined {
    let envelope: Envelope;
    try {
      envelope = envelopeOf(message.Body, message.MessageAttributes);
    } catch {
      return undefined;
    }
    const mark = deadMarkOf(message.MessageAttributes);
    const sent = Number(message.Attributes?.['SentTimestamp'] ?? 0);
    return {
      id: message.MessageId!,
      consumer,
      envelope,
      reason: mark?.reason ?? { code: 'MAX_RECEIVES', message: `moved by the queue's redrive policy after ${this.#maxReceiveCount} receives` },
      attempt: mark?.attempt ?? Number(message.Attributes?.['ApproximateReceiveCount'] ?? this.#maxReceiveCount),
      deadAt: new Date(mark?.deadAt ?? sent),
    };
  }

  /**
   * The dead-letter queue's depth from its attributes (visible, in flight and delayed): read
   * without receiving, so nothing is hidden; 0 without a queue. SQS's counts are approximate
   * (they may lag a minute on AWS).
   */
  async #countDead(consumer: string): Promise<number> {
    const url = await this.#deadLetterUrl(consumer);
    if (url === undefined) return 0;
    try {
      const names = ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible', 'ApproximateNumberOfMessagesDelayed'] as const;
      const attributes = (await this.#client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: [...names] }))).Attributes ?? {};
      return names.reduce((sum, name) => sum + Number(attributes[name] ?? 0), 0);
    } catch (error) {
      throw transportErrorOf(error, `counting the dead letters of consumer '${consumer}' failed`);
    }
  }

  /**
   * The dead letters a browse saw, oldest first, at most `limit`: possibly only part of the
   * queue (a FIFO queue shows the first messages of its groups; see {@link #browse}), never
   * hiding or taking any. `count` tells how many there are, so a caller can say "N of M".
   */
  async #listDead(consumer: string, limit: number): Promise<readonly DeadLetter[]> {
    const url = await this.#deadLetterUrl(consumer);
    if (url === undefined) return [];
    const seen = await this.#browse(url, (found) => found.size >= limit).catch((error: unknown) => {
      throw transportErrorOf(error, `reading the dead letters of consumer '${consumer}' failed`);
    });
    const letters = [...seen.values()].map((message) => this.#deadLetterOf(consumer, message)).filter((letter): letter is DeadLetter => letter !== undefined);
    return letters.sort((a, b) => a.deadAt.getTime() - b.deadAt.getTime() || a.id.localeCompare(b.id)).slice(0, limit);
  }

  /** Finds `ids` in the dead-letter queue and runs `act` on each found; counts those acted on. */
  async #eachDead(consumer: string, ids: readonly string[], act: (message: Message, url: string) => Promise<void>): Promise<number> {
    const url = await this.#deadLetterUrl(consumer);
    if (url === undefined) return 0;
    const wanted = new Set(ids);
    let done = 0;
    try {
      const seen = await this.#browse(url, (found) => [...wanted].every((id) => found.has(id)));
      for (const id of wanted) {
        const message = seen.get(id);
        if (message === undefined) continue;
        await act(message, url);
        done += 1;
      }
    } catch (error) {
      throw transportErrorOf(error, `changing the dead letters of consumer '${consumer}' failed`);
    }
    return done;
  }

  #replayDead(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#eachDead(consumer, ids, async (message, deadUrl) => {
      const envelope = envelopeOf(message.Body, message.MessageAttributes);
      // SNS → SQS: straight to this group's queue, never through the topic (the other groups must not get it again).
      const [url] = (await this.#urlsOf([this.#sns === undefined ? this.queueName(envelope.topic) : this.consumerQueueName(consumer)])).values();
      // A fresh message: attempt (receive count) 1, marked with the dead letter it came from.
      await this.#client.send(
        new SendMessageCommand({
          QueueUrl: url!,
          MessageBody: envelope.payload,
          MessageAttributes: attributesOf(envelope, { [ATTRIBUTES.replay]: message.MessageId! }),
          ...(this.#fifo ? { MessageGroupId: groupIdOf(envelope), MessageDeduplicationId: dedupIdOf(`replay-${message.MessageId!}`) } : {}),
        }),
      );
      await this.#client.send(new DeleteMessageCommand({ QueueUrl: deadUrl, ReceiptHandle: message.ReceiptHandle! }));
    });
  }

  #purgeDead(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#eachDead(consumer, ids, async (message, url) => {
      await this.#client.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: message.ReceiptHandle! }));
    });
  }
}

/**
 * The FIFO group of an envelope: its key (a message without one has no order to keep, so
 * its own group). MessageGroupId takes 1-128 characters of A-Z a-z 0-9 and punctuation: a
 * key outside that travels as a hash of itself, the same for every message of the key.
 */
function groupIdOf(envelope: Envelope): string {
  const group = envelope.key ?? envelope.messageId;
  return /^[\x21-\x7E]{1,128}$/.test(group) ? group : `courier-sha256-${createHash('sha256').update(group, 'utf8').digest('base64url')}`;
}

/** A MessageDeduplicationId (at most 128 characters of A-Z a-z 0-9 and punctuation) for `value`. */
function dedupIdOf(value: string): string {
  return value.replace(/[^\x21-\x7E]/g, '_').slice(0, 128);
}

/** A dead-letter copy's attributes: the message's own (at most 9) plus the `courier-dead` mark. */
function deadAttributes(source: Readonly<Record<string, MessageAttributeValue>>, reason: DeadLetterReason, attempt: number): Record<string, MessageAttributeValue> {
  const attributes: Record<string, MessageAttributeValue> = {};
  for (const [name, value] of Object.entries(source)) {
    if (name !== ATTRIBUTES.dead && Object.keys(attributes).length < 9) attributes[name] = value;
  }
  attributes[ATTRIBUTES.dead] = { DataType: 'String', StringValue: deadMarkValue({ reason, attempt, deadAt: new Date().toISOString() }) };
  return attributes;
}

/** Splits entries into SendMessageBatch calls: at most 10 entries and 256 KiB each. */
function batches<T extends { bytes: number }>(entries: readonly T[]): T[][] {
  const out: T[][] = [];
  let current: T[] = [];
  let bytes = 0;
  for (const entry of entries) {
    if (current.length === MAX_BATCH_ENTRIES || (current.length > 0 && bytes + entry.bytes > SQS_MESSAGE_BYTES)) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(entry);
    bytes += entry.bytes;
  }
  if (current.length > 0) out.push(current);
  return out;
}

interface SubscriptionConfig {
  readonly client: SQSClient;
  readonly endpoint: Endpoint;
  readonly handler: DeliveryHandler;
  readonly queues: readonly { name: string; url: string }[];
  readonly deadLetterUrl: string;
  readonly fifo: boolean;
  readonly visibility: number;
  readonly wait: number;
  readonly logger: Logger;
  readonly retried: RetryLedger;
  readonly onClosed: () => void;
}

/**
 * FIFO retries happen in place (a changed visibility), and SQS keeps no writable state per
 * message, so the attempt a retry raises is remembered here, by SQS message id and the
 * receive count it was retried at: the next receive by this transport (count + 1) gets it.
 * A receive this transport did not retry is attempt 1 (a crash redelivery must not burn an
 * attempt); a retried message that another instance receives starts again at 1, which the
 * redrive policy's maxReceiveCount bounds. Bounded: the oldest entries go first.
 */
class RetryLedger {
  static readonly MAX_ENTRIES = 10_000;
  readonly #entries = new Map<string, { readonly attempt: number; readonly receiveCount: number }>();

  record(messageId: string, receiveCount: number, attempt: number): void {
    this.#entries.delete(messageId);
    this.#entries.set(messageId, { attempt, receiveCount });
    if (this.#entries.size > RetryLedger.MAX_ENTRIES) this.#entries.delete(this.#entries.keys().next().value!);
  }

  /** The attempt of a message received at `receiveCount`, when this transport retried its previous receive; else undefined. */
  take(messageId: string, receiveCount: number): number | undefined {
    const entry = this.#entries.get(messageId);
    if (entry === undefined) return undefined;
    this.#entries.delete(messageId);
    return entry.receiveCount === receiveCount - 1 ? entry.attempt : undefined;
  }
}

/** How a received message was settled; `undefined` while in hand. */
type Settled = 'ack' | 'retry' | 'dead' | 'failed';

/** One received message in hand: its heartbeat keeps it invisible until it is settled or released. */
class InHand {
  settled: Settled | undefined;
  readonly #timer: NodeJS.Timeout;

  constructor(
    readonly message: Message,
    readonly queueUrl: string,
    readonly client: SQSClient,
    visibility: number,
    logger: Logger,
  ) {
    // Extended at a third of the timeout, so one slow or failed call still leaves time.
    this.#timer = setInterval(() => {
      client.send(new ChangeMessageVisibilityCommand({ QueueUrl: queueUrl, ReceiptHandle: message.ReceiptHandle!, VisibilityTimeout: visibility })).catch((error: unknown) => {
        logger.warn('sqs: extending a message visibility failed', { messageId: message.MessageId, error: describeError(error) });
      });
    }, Math.max(1_000, Math.floor((visibility * 1_000) / 3)));
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  /** Makes the message visible again at once (ordered: a later message of a key whose head was retried). */
  async release(): Promise<void> {
    this.stop();
    this.settled ??= 'retry';
    await this.client.send(new ChangeMessageVisibilityCommand({ QueueUrl: this.queueUrl, ReceiptHandle: this.message.ReceiptHandle!, VisibilityTimeout: 0 })).catch(() => undefined);
  }
}

/** A subscription: one long-polling loop per topic queue, sharing the endpoint's concurrency. */
class SqsSubscription implements Subscription {
  readonly #config: SubscriptionConfig;
  readonly #abort = new AbortController();
  readonly #loops: Promise<void>[] = [];
  readonly #work = new Set<Promise<void>>();
  #free: number;
  #waiters: (() => void)[] = [];
  #closing: Promise<void> | undefined;

  constructor(config: SubscriptionConfig) {
    this.#config = config;
    this.#free = config.endpoint.concurrency;
  }

  start(): void {
    for (const queue of this.#config.queues) this.#loops.push(this.#poll(queue.name, queue.url));
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#abort.abort();
      for (const wake of this.#waiters.splice(0)) wake();
      await Promise.all(this.#loops);
      while (this.#work.size > 0) await Promise.all([...this.#work]);
      this.#config.onClosed();
    })();
    return this.#closing;
  }

  async #slots(): Promise<number> {
    while (this.#free === 0 && !this.#abort.signal.aborted) await new Promise<void>((resolve) => this.#waiters.push(resolve));
    const taken = Math.min(this.#free, MAX_BATCH_ENTRIES);
    this.#free -= taken;
    return taken;
  }

  #giveBack(count: number): void {
    this.#free += count;
    for (const wake of this.#waiters.splice(0)) wake();
  }

  async #poll(name: string, url: string): Promise<void> {
    const { client, wait, logger } = this.#config;
    const signal = this.#abort.signal;
    let failures = 0;
    while (!signal.aborted) {
      const slots = await this.#slots();
      if (signal.aborted) {
        this.#giveBack(slots);
        break;
      }
      let messages: Message[];
      try {
        const answer = await client.send(
          new ReceiveMessageCommand({
            QueueUrl: url,
            MaxNumberOfMessages: slots,
            WaitTimeSeconds: wait,
            MessageAttributeNames: ['All'],
            MessageSystemAttributeNames: ['ApproximateReceiveCount', 'MessageGroupId', 'SentTimestamp'],
          }),
          { abortSignal: signal },
        );
        messages = answer.Messages ?? [];
        failures = 0;
      } catch (error) {
        this.#giveBack(slots);
        if (signal.aborted) break;
        failures += 1;
        logger.warn('sqs: receive failed; retrying', { queue: name, error: describeError(error) });
        await abortableSleep(Math.min(5_000, 200 * 2 ** Math.min(failures, 5)), signal).catch(() => undefined);
        continue;
      }
      this.#giveBack(slots - messages.length);
      const held = messages.map((message) => new InHand(message, url, client, this.#config.visibility, logger));
      if (this.#config.endpoint.ordered) {
        // A key's messages of one receive run one after another; SQS FIFO hands out no
        // later message of a group while one of it is in flight, across every consumer.
        const groups = new Map<string, InHand[]>();
        for (const item of held) {
          const group = item.message.Attributes?.['MessageGroupId'] ?? item.message.MessageId!;
          groups.set(group, [...(groups.get(group) ?? []), item]);
        }
        for (const items of groups.values()) this.#track(this.#runInOrder(items));
      } else {
        for (const item of held) this.#track(this.#run(item));
      }
    }
  }

  #track(work: Promise<void>): void {
    this.#work.add(work);
    void work.finally(() => this.#work.delete(work));
  }

  async #runInOrder(items: readonly InHand[]): Promise<void> {
    for (const [index, item] of items.entries()) {
      await this.#run(item);
      if (item.settled !== 'ack' && item.settled !== 'dead') {
        // The head stays in front of its key: the rest of the group goes back and comes after it.
        const rest = items.slice(index + 1);
        await Promise.all(rest.map((later) => later.release()));
        this.#giveBack(rest.length);
        return;
      }
    }
  }

  async #run(item: InHand): Promise<void> {
    try {
      const delivery = this.#deliveryOf(item);
      if (delivery === undefined) return;
      await this.#config.handler(delivery).catch((error: unknown) => {
        this.#config.logger.error('sqs: delivery handler failed', { messageId: item.message.MessageId, error: describeError(error) });
      });
      // A handler that resolved without settling leaves the message to its visibility timeout.
      if (item.settled === undefined) {
        item.settled = 'failed';
        item.stop();
      }
    } finally {
      this.#giveBack(1);
    }
  }

  #deliveryOf(item: InHand): Delivery | undefined {
    const { message } = item;
    const due = Number(message.MessageAttributes?.[ATTRIBUTES.due]?.StringValue ?? 0);
    if (due > Date.now() + 1_000) {
      // A retry's copy that is not due yet (delays beyond 15 minutes): hidden again until it is.
      item.settled = 'retry';
      item.stop();
      const seconds = Math.min(MAX_VISIBILITY_SECONDS, Math.ceil((due - Date.now()) / 1_000));
      void this.#config.client
        .send(new ChangeMessageVisibilityCommand({ QueueUrl: item.queueUrl, ReceiptHandle: message.ReceiptHandle!, VisibilityTimeout: seconds }))
        .catch(() => undefined);
      return undefined;
    }
    let envelope: Envelope;
    try {
      envelope = envelopeOf(message.Body, message.MessageAttributes);
    } catch (error) {
      // Never handed to a handler: parked in the consumer's dead-letter queue.
      void this.#deadLetter(item, { code: 'ENVELOPE_INVALID', message: describeError(error) }, 1).catch(() => undefined);
      return undefined;
    }
    const receiveCount = Math.max(1, Number(message.Attributes?.['ApproximateReceiveCount'] ?? 1));
    const { fifo, retried } = this.#config;
    // Standard queues: a retry sends a copy carrying its attempt, so receives beyond the first are crash redeliveries.
    const ledgered = fifo ? retried.take(message.MessageId!, receiveCount) : undefined;
    const attempt = fifo ? (ledgered ?? 1) : Math.max(1, Number(message.MessageAttributes?.[ATTRIBUTES.attempt]?.StringValue ?? 1) || 1);
    const redelivered = ledgered === undefined && receiveCount > 1;
    const settle = async (kind: Settled, act: () => Promise<unknown>): Promise<void> => {
      if (item.settled !== undefined) return;
      item.settled = kind;
      item.stop();
      try {
        await act();
      } catch (error) {
        item.settled = 'failed';
        throw new TransportError(`settling message '${envelope.messageId}' failed: ${describeError(error)}`, { cause: error });
      }
    };
    const { client } = this.#config;
    return {
      envelope,
      attempt,
      redelivered,
      ...(message.MessageAttributes?.[ATTRIBUTES.replay] ? { replayed: true } : {}),
      ack: () => settle('ack', () => client.send(new DeleteMessageCommand({ QueueUrl: item.queueUrl, ReceiptHandle: message.ReceiptHandle! }))),
      retry: (delayMs) =>
        settle('retry', async () => {
          if (!fifo) {
            await this.#retryByCopy(item, attempt + 1, delayMs);
            return;
          }
          // In place, so the key keeps its order: whole seconds, rounded up; SQS caps a
          // message's invisibility at 12 hours from its first receive.
          retried.record(message.MessageId!, receiveCount, attempt + 1);
          await client.send(
            new ChangeMessageVisibilityCommand({
              QueueUrl: item.queueUrl,
              ReceiptHandle: message.ReceiptHandle!,
              VisibilityTimeout: Math.min(MAX_VISIBILITY_SECONDS, Math.max(0, Math.ceil(delayMs / 1_000))),
            }),
          );
        }),
      deadLetter: (reason) => settle('dead', () => this.#deadLetter(item, reason, attempt)),
    };
  }

  /**
   * Standard queues: sends a copy carrying `attempt` and delayed by `delayMs` (SQS delays
   * up to 15 minutes; a later due time travels in `courier-due` and the copy is kept
   * invisible on receive until then), then deletes the message. A crash in between leaves
   * both: the inbox drops whichever runs second.
   */
  async #retryByCopy(item: InHand, attempt: number, delayMs: number): Promise<void> {
    const { message } = item;
    const attributes: Record<string, MessageAttributeValue> = {};
    for (const [name, value] of Object.entries(message.MessageAttributes ?? {})) {
      if (name !== ATTRIBUTES.attempt && name !== ATTRIBUTES.due) attributes[name] = value;
    }
    attributes[ATTRIBUTES.attempt] = { DataType: 'String', StringValue: String(attempt) };
    const seconds = Math.max(0, Math.ceil(delayMs / 1_000));
    if (seconds > MAX_DELAY_SECONDS) attributes[ATTRIBUTES.due] = { DataType: 'String', StringValue: String(Date.now() + delayMs) };
    await this.#config.client.send(
      new SendMessageCommand({ QueueUrl: item.queueUrl, MessageBody: message.Body!, MessageAttributes: attributes, DelaySeconds: Math.min(seconds, MAX_DELAY_SECONDS) }),
    );
    await this.#config.client.send(new DeleteMessageCommand({ QueueUrl: item.queueUrl, ReceiptHandle: message.ReceiptHandle! }));
  }

  /** Sends a copy with the reason to the dead-letter queue, then deletes the message. */
  async #deadLetter(item: InHand, reason: DeadLetterReason, attempt: number): Promise<void> {
    item.settled ??= 'dead';
    item.stop();
    const { message } = item;
    const attributes = deadAttributes(message.MessageAttributes ?? {}, reason, attempt);
    await this.#config.client.send(
      new SendMessageCommand({
        QueueUrl: this.#config.deadLetterUrl,
        MessageBody: message.Body === undefined || message.Body === '' ? ' ' : message.Body,
        MessageAttributes: attributes,
        ...(this.#config.fifo
          ? { MessageGroupId: message.Attributes?.['MessageGroupId'] ?? message.MessageId!, MessageDeduplicationId: dedupIdOf(`dead-${message.MessageId!}-${attempt}`) }
          : {}),
      }),
    );
    await this.#config.client.send(new DeleteMessageCommand({ QueueUrl: item.queueUrl, ReceiptHandle: message.ReceiptHandle! }));
  }
}

/** A topic that does not exist, with provisioning off. */
class MissingTopic extends Error {}
