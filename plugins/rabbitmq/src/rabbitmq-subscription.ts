import {
  boundText,
  describeError,
  REASON_LIMITS,
  whenAborted,
  TransportError,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type Logger,
  type Subscription,
} from '@courier/core';
import type { Channel, ChannelModel, ConsumeMessage } from 'amqplib';
import { closeAmqp } from './amqp-close.js';
import type { ConfirmPublishOptions } from './confirm-publisher.js';
import { attemptOf, copyProperties, COURIER_HEADERS, fromAmqpMessage, isBrokerHeader } from './amqp-mapping.js';
import { chooseDelayTier, declareConsumer, type RabbitMqNames, type RabbitMqQueueLimits } from './topology.js';

/** What a subscription needs from its transport. Internal. */
export interface SubscriptionLink {
  readonly logger: Logger;
  readonly random: () => number;
  readonly maxErrorBytes: number;
  readonly deadLetterDeliveryLimit: number;
  /** The consumer's queue limits (`RabbitMqTransportConfig.queueLimits`), declared with its queue. */
  readonly queueLimits: RabbitMqQueueLimits | undefined;
  /** The open connection, or null while disconnected. */
  connection(): ChannelModel | null;
  /** Publishes to a queue through the default exchange and waits for the confirm; throws TransportError otherwise. */
  publishToQueue(queue: string, content: Buffer, options: ConfirmPublishOptions): Promise<void>;
  count(counter: 'deliveries' | 'retried' | 'deadLettered'): void;
  forget(subscription: RabbitMqSubscription): void;
}

interface Lane {
  /** The channel the message came on; acks are valid on that channel only. */
  readonly channel: ChannelState;
}

interface ChannelState {
  readonly channel: Channel;
  open: boolean;
}

interface Job extends Lane {
  readonly message: ConsumeMessage;
  /** Per-key lane (`topic\0key`) on ordered endpoints; null when the message keeps no order. */
  lane: string | null;
  attempt: number;
  /** The broker's `redelivered` flag, cleared once the job waits in place for a retry (that run was settled). */
  redelivered: boolean;
  envelope: Envelope | null;
  timer: NodeJS.Timeout | null;
}

const RESTART_MIN_MS = 200;
const RESTART_MAX_MS = 10_000;
/** How many dead-lettered messageIds a subscription remembers to recognise their duplicates. */
const REMEMBERED_DEAD_LETTERS = 10_000;

/**
 * One endpoint consuming from its quorum queue on a channel of its own.
 *
 * Guarantees:
 * - Manual acknowledgement; at most `prefetch` unacknowledged deliveries, at most
 *   `endpoint.concurrency` handlers at once.
 * - Ordered endpoints: the queue has a single active consumer, and within this process
 *   deliveries of one (topic, key) run one at a time, in arrival order; different keys run
 *   concurrently. `retry` retries in place (the key waits, nothing overtakes it).
 * - Unordered endpoints: `retry` publishes a copy to a delay-tier queue with a confirm
 *   and only then acknowledges the original; `deadLetter` does the same with the
 *   dead-letter queue. A failure between the two leaves a duplicate, never a loss.
 * - A message is dead-lettered once per subscription: a later copy of a messageId it
 *   dead-lettered (one of its last 10,000) is acknowledged without being handed over,
 *   unless `deadLetters.replay` sent it. Such copies come from the at-least-once relay,
 *   and the inbox, which recognises copies of handled messages, records no dead letters.
 * - A settle on a channel that has closed throws a retriable `TransportError`: the broker
 *   redelivers the message, which the inbox recognises.
 * - After a channel or connection loss it re-declares its topology and resumes.
 */
export class RabbitMqSubscription implements Subscription {
  readonly #link: SubscriptionLink;
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #names: RabbitMqNames;
  readonly #prefetch: number;
  #channel: ChannelState | null = null;
  #consumerTag: string | null = null;
  #starting: Promise<void> | null = null;
  #restartTimer: NodeJS.Timeout | null = null;
  #restartAttempt = 0;
  #closing: Promise<void> | null = null;
  readonly #pending: Job[] = [];
  readonly #ready: Job[] = [];
  readonly #lanes = new Map<string, Job>();
  readonly #waiting = new Set<Job>();
  readonly #running = new Set<Promise<void>>();
  /** MessageIds this subscription moved to the dead-letter queue, oldest first. */
  readonly #deadLettered = new Set<string>();

  constructor(link: SubscriptionLink, endpoint: Endpoint, handler: DeliveryHandler, names: RabbitMqNames, prefetch: number) {
    this.#link = link;
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#names = names;
    this.#prefetch = prefetch;
  }

  /** The endpoint this subscription serves. */
  get endpoint(): Endpoint {
    return this.#endpoint;
  }

  /** Declares the topology and starts consuming on the current connection. Rejects if it cannot. */
  start(): Promise<void> {
    if (this.#closing) return Promise.resolve();
    if (this.#channel?.open) return Promise.resolve();
    this.#starting ??= this.#start().finally(() => {
      this.#starting = null;
    });
    return this.#starting;
  }

  /** Called by the transport after a reconnect: resumes, retrying with backoff on failure. */
  resume(): void {
    if (this.#closing) return;
    this.start().then(
      () => {
        this.#restartAttempt = 0;
      },
      (error: unknown) => {
        this.#link.logger.warn('rabbitmq consumer could not resume; retrying', { consumer: this.#endpoint.consumer, error: describeError(error) });
        this.#scheduleRestart();
      },
    );
  }

  /**
   * Stops receiving, waits for handlers in flight (until `signal` aborts, or not at all if it
   * already has), then closes the channel (which requeues the rest). Idempotent.
   */
  close(options: { signal?: AbortSignal } = {}): Promise<void> {
    this.#closing ??= this.#close(options.signal);
    return this.#closing;
  }

  async #start(): Promise<void> {
    const connection = this.#link.connection();
    if (!connection) throw new TransportError(`rabbitmq is not connected; consumer '${this.#endpoint.consumer}' waits for the connection`);
    const channel = await connection.createChannel();
    const state: ChannelState = { channel, open: true };
    channel.on('error', (error: Error) => {
      this.#link.logger.warn('rabbitmq consumer channel error', { consumer: this.#endpoint.consumer, error: describeError(error) });
    });
    channel.on('close', () => this.#onChannelClosed(state));
    try {
      await declareConsumer(channel, this.#names, this.#endpoint, { deadLetterDeliveryLimit: this.#link.deadLetterDeliveryLimit, limits: this.#link.queueLimits });
      await channel.prefetch(this.#prefetch);
      if (this.#closing) throw new TransportError(`consumer '${this.#endpoint.consumer}' closed while starting`);
      this.#channel = state;
      const reply = await channel.consume(this.#names.queue, (message) => this.#onMessage(state, message), { noAck: false });
      this.#consumerTag = reply.consumerTag;
    } catch (error) {
      state.open = false;
      await closeAmqp(channel);
      throw error;
    }
  }

  #onMessage(channel: ChannelState, message: ConsumeMessage | null): void {
    if (message === null) {
      // The broker cancelled the consumer (queue deleted, or a quorum leader moved):
      // drop the channel and start over, which re-declares the queue.
      this.#link.logger.warn('rabbitmq cancelled the consumer; restarting it', { consumer: this.#endpoint.consumer });
      void channel.channel.close().catch(() => undefined);
      return;
    }
    this.#link.count('deliveries');
    const job: Job = { channel, message, lane: null, attempt: attemptOf(message.properties.headers), redelivered: message.fields.redelivered === true, envelope: null, timer: null };
    this.#pending.push(job);
    this.#pump();
  }

  #onChannelClosed(state: ChannelState): void {
    state.open = false;
    if (this.#channel === state) {
      this.#channel = null;
      this.#consumerTag = null;
    }
    // Unsettled deliveries of a closed channel go back to the queue on the broker's side;
    // handing them to a handler now would only produce settles that cannot land.
    for (let i = this.#pending.length - 1; i >= 0; i--) if (this.#pending[i]!.channel === state) this.#pending.splice(i, 1);
    for (let i = this.#ready.length - 1; i >= 0; i--) if (this.#ready[i]!.channel === state) this.#release(this.#ready.splice(i, 1)[0]!);
    for (const job of [...this.#waiting]) {
      if (job.channel !== state) continue;
      if (job.timer) clearTimeout(job.timer);
      this.#waiting.delete(job);
      this.#release(job);
    }
    if (!this.#closing && this.#link.connection()) this.#scheduleRestart();
    this.#pump();
  }

  #scheduleRestart(): void {
    if (this.#closing || this.#restartTimer) return;
    const delay = Math.min(RESTART_MAX_MS, RESTART_MIN_MS * 2 ** this.#restartAttempt) * (0.5 + this.#link.random() / 2);
    this.#restartAttempt++;
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = null;
      // While disconnected the transport resumes every subscription after reconnecting.
      if (this.#link.connection()) this.resume();
    }, delay);
  }

  #pump(): void {
    while (!this.#closing && this.#running.size < this.#endpoint.concurrency) {
      const job = this.#ready.shift() ?? this.#next();
      if (!job) return;
      const run = this.#run(job);
      this.#running.add(run);
      void run.finally(() => {
        this.#running.delete(run);
        this.#pump();
      });
    }
  }

  /** The first pending job whose key lane is free (every job, on unordered endpoints). */
  #next(): Job | undefined {
    for (let i = 0; i < this.#pending.length; i++) {
      const job = this.#pending[i]!;
      if (this.#endpoint.ordered && job.lane === null) {
        job.lane = this.#laneOf(job);
      }
      if (job.lane !== null && this.#lanes.has(job.lane)) continue;
      this.#pending.splice(i, 1);
      if (job.lane !== null) this.#lanes.set(job.lane, job);
      return job;
    }
    return undefined;
  }

  #laneOf(job: Job): string | null {
    const headers = job.message.properties.headers ?? {};
    const key = headers[COURIER_HEADERS.key];
    if (typeof key !== 'string') return null;
    return `${String(headers[COURIER_HEADERS.topic])}\u0000${key}`;
  }

  #release(job: Job): void {
    if (job.lane !== null && this.#lanes.get(job.lane) === job) this.#lanes.delete(job.lane);
  }

  async #run(job: Job): Promise<void> {
    if (!job.channel.open) return this.#release(job);
    if (this.#isDeadLetteredCopy(job)) {
      // A relay that died between the broker's confirm and marking its rows published
      // sends them again, so the queue can hold a second copy, which on an ordered
      // endpoint reaches this same consumer. Handed over, it would be dead-lettered again:
      // the crash-loop count only grows, and the inbox records nothing for a dead letter.
      this.#link.logger.info('copy of a message already dead-lettered acknowledged', {
        consumer: this.#endpoint.consumer,
        messageId: String(job.message.properties.messageId),
      });
      job.channel.channel.ack(job.message);
      return this.#release(job);
    }
    if (job.envelope === null) {
      try {
        job.envelope = fromAmqpMessage(job.message);
      } catch (error) {
        await this.#deadLetterUndecodable(job, error);
        return this.#release(job);
      }
    }
    const delivery = new RabbitMqDelivery(this, job, job.envelope);
    try {
      await this.#handler(delivery);
    } catch (error) {
      this.#link.logger.error('delivery handler threw', { consumer: this.#endpoint.consumer, messageId: job.envelope.messageId, error: describeError(error) });
    }
    if (delivery.retryInPlaceMs !== null) return this.#waitInPlace(job, delivery.retryInPlaceMs);
    if (!delivery.settled) {
      // The handler broke its contract; requeue rather than hold the message forever.
      this.#link.logger.error('delivery handler returned without settling; requeueing', {
        consumer: this.#endpoint.consumer,
        messageId: job.envelope.messageId,
      });
      if (job.channel.open) job.channel.channel.nack(job.message, false, true);
    }
    this.#release(job);
  }

  #waitInPlace(job: Job, delayMs: number): void {
    // The key's lane stays taken while the message waits, so nothing of its key overtakes
    // it; the concurrency slot is freed for other keys.
    this.#waiting.add(job);
    job.timer = setTimeout(() => {
      job.timer = null;
      this.#waiting.delete(job);
      job.attempt += 1;
      job.redelivered = false;
      this.#ready.push(job);
      this.#pump();
    }, delayMs);
  }

  /** @internal Acknowledges on the channel the message came on. */
  ack(job: Job): void {
    if (!job.channel.open) throw lostChannel(this.#endpoint.consumer, job);
    job.channel.channel.ack(job.message);
  }

  /** @internal Republishes a copy to `queue` with a confirm, then acknowledges the original. */
  async moveTo(
    job: Job,
    queue: string,
    headers: Record<string, unknown>,
    what: 'retried' | 'deadLettered',
    onFailure: 'requeue' | 'reject' = 'requeue',
  ): Promise<void> {
    if (!job.channel.open) throw lostChannel(this.#endpoint.consumer, job);
    const { properties, content } = job.message;
    const options = copyProperties(properties as unknown as Record<string, unknown>, headers);
    options.messageId ||= job.envelope?.messageId ?? '';
    try {
      await this.#link.publishToQueue(queue, content, options);
    } catch (error) {
      // Not moved: give the original back to the queue so it is not held forever, or
      // reject it into the queue's own at-least-once dead-lettering.
      if (job.channel.open) job.channel.channel.nack(job.message, false, onFailure === 'requeue');
      throw error;
    }
    this.#link.count(what);
    this.ack(job);
    if (what === 'deadLettered') this.#rememberDeadLetter(job);
  }

  #rememberDeadLetter(job: Job): void {
    const id: unknown = job.message.properties.messageId;
    if (typeof id !== 'string' || id === '') return;
    this.#deadLettered.delete(id);
    this.#deadLettered.add(id);
    if (this.#deadLettered.size > REMEMBERED_DEAD_LETTERS) this.#deadLettered.delete(this.#deadLettered.values().next().value!);
  }

  /** True for a copy of a message this subscription dead-lettered that is not a replay of the dead letter. */
  #isDeadLetteredCopy(job: Job): boolean {
    const id: unknown = job.message.properties.messageId;
    if (typeof id !== 'string' || !this.#deadLettered.has(id)) return false;
    if (job.message.properties.headers?.[COURIER_HEADERS.replayedAt] === undefined) return true;
    // An operator replayed it: it runs again, and may be dead-lettered again.
    this.#deadLettered.delete(id);
    return false;
  }

  /** @internal Headers for a copy: the original's, without the broker's death records, plus `extra`. */
  copyHeaders(job: Job, extra: Record<string, unknown>): Record<string, unknown> {
    const headers: Record<string, unknown> = {};
    const original = job.message.properties.headers ?? {};
    for (const [name, value] of Object.entries(original)) {
      // x-death and friends grow on every cycle through a tier queue; the copy starts clean.
      if (!isBrokerHeader(name)) headers[name] = value;
    }
    if (headers[COURIER_HEADERS.originalExchange] === undefined) {
      headers[COURIER_HEADERS.originalExchange] = job.message.fields.exchange;
      headers[COURIER_HEADERS.originalRoutingKey] = job.message.fields.routingKey;
    }
    return Object.assign(headers, extra);
  }

  /** @internal */
  get names(): RabbitMqNames {
    return this.#names;
  }

  /** @internal */
  get link(): SubscriptionLink {
    return this.#link;
  }

  async #deadLetterUndecodable(job: Job, error: unknown): Promise<void> {
    this.#link.logger.error('undecodable message moved to the dead-letter queue', {
      consumer: this.#endpoint.consumer,
      messageId: String(job.message.properties.messageId),
      error: describeError(error),
    });
    const headers = this.copyHeaders(job, deadHeaders(job.attempt, { code: 'ENVELOPE_INVALID', message: describeError(error) }, this.#link.maxErrorBytes));
    // If republishing fails, the rejection still parks it through the queue's own
    // at-least-once dead-lettering (without the reason).
    await this.moveTo(job, this.#names.deadLetterQueue, headers, 'deadLettered', 'reject').catch(() => undefined);
  }

  async #close(signal: AbortSignal | undefined): Promise<void> {
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
    await this.#starting?.catch(() => undefined);
    const state = this.#channel;
    if (state?.open && this.#consumerTag) await state.channel.cancel(this.#consumerTag).catch(() => undefined);
    this.#pending.length = 0;
    this.#ready.length = 0;
    for (const job of this.#waiting) if (job.timer) clearTimeout(job.timer);
    this.#waiting.clear();
    const drained = Promise.allSettled([...this.#running]);
    if (signal) {
      await Promise.race([drained, whenAborted(signal)]);
    } else {
      await drained;
    }
    // Closing the channel hands every unacknowledged message back to the queue.
    if (state?.open) await closeAmqp(state.channel);
    this.#link.forget(this);
  }
}

/** One message handed to a handler. First settle wins; later ones are ignored. */
class RabbitMqDelivery implements Delivery {
  readonly envelope: Envelope;
  readonly attempt: number;
  readonly replayed: boolean;
  readonly redelivered: boolean;
  readonly #subscription: RabbitMqSubscription;
  readonly #job: Job;
  #settled = false;
  #retryInPlaceMs: number | null = null;

  constructor(subscription: RabbitMqSubscription, job: Job, envelope: Envelope) {
    this.#subscription = subscription;
    this.#job = job;
    this.envelope = envelope;
    this.attempt = job.attempt;
    this.redelivered = job.redelivered;
    this.replayed = job.message.properties.headers?.[COURIER_HEADERS.replayedAt] !== undefined;
  }

  get settled(): boolean {
    return this.#settled;
  }

  get retryInPlaceMs(): number | null {
    return this.#retryInPlaceMs;
  }

  async ack(): Promise<void> {
    if (this.#settled) return;
    this.#settled = true;
    this.#subscription.ack(this.#job);
  }

  async retry(delayMs: number, reason: DeadLetterReason): Promise<void> {
    if (this.#settled) return;
    this.#settled = true;
    const subscription = this.#subscription;
    if (subscription.endpoint.ordered) {
      // A copy through a tier queue would land behind later messages of its key.
      this.#retryInPlaceMs = Math.max(0, delayMs);
      return;
    }
    const { retryQueues } = subscription.names;
    const tier = retryQueues[chooseDelayTier(retryQueues.map((t) => t.delayMs), delayMs, subscription.link.random)]!;
    const headers = subscription.copyHeaders(this.#job, {
      [COURIER_HEADERS.attempt]: this.attempt + 1,
      [COURIER_HEADERS.retryCode]: boundText(reason.code, REASON_LIMITS.codeBytes),
    });
    await subscription.moveTo(this.#job, tier.name, headers, 'retried');
  }

  async deadLetter(reason: DeadLetterReason): Promise<void> {
    if (this.#settled) return;
    this.#settled = true;
    const subscription = this.#subscription;
    const headers = subscription.copyHeaders(this.#job, deadHeaders(this.attempt, reason, subscription.link.maxErrorBytes));
    delete headers[COURIER_HEADERS.retryCode];
    await subscription.moveTo(this.#job, subscription.names.deadLetterQueue, headers, 'deadLettered');
  }
}

function deadHeaders(attempt: number, reason: DeadLetterReason, maxErrorBytes: number): Record<string, unknown> {
  return {
    [COURIER_HEADERS.attempt]: attempt,
    [COURIER_HEADERS.deadCode]: boundText(reason.code, REASON_LIMITS.codeBytes),
    // Headers travel in one frame and amqplib encodes a headers table into 64 KiB at most.
    // The core's reasons are within REASON_LIMITS already; this also bounds the plugin's own
    // (an undecodable message's error) and a lower `maxErrorBytes`.
    [COURIER_HEADERS.deadReason]: boundText(reason.message, maxErrorBytes),
    [COURIER_HEADERS.deadAt]: new Date().toISOString(),
  };
}

function lostChannel(consumer: string, job: Job): TransportError {
  return new TransportError(
    `cannot settle message '${String(job.message.properties.messageId)}' on consumer '${consumer}': its channel closed; the broker redelivers it`,
  );
}
