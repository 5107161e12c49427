import type { ConfirmChannel, Message, Options } from 'amqplib';
import { closeAmqp } from './amqp-close.js';

/** How the broker answered one publish. */
export type ConfirmOutcome =
  | { readonly kind: 'ok' }
  | { readonly kind: 'nacked' }
  | { readonly kind: 'returned'; readonly replyCode: number; readonly replyText: string }
  | { readonly kind: 'timeout' }
  | { readonly kind: 'closed'; readonly cause: unknown; readonly channelError: ChannelError | null };

/**
 * Why the broker closed a channel while its connection stayed open (AMQP `channel.close`
 * with a reply code: 406 PRECONDITION_FAILED for content it refuses, 403, 404, …).
 */
export interface ChannelError {
  readonly code: number;
  readonly message: string;
}

/**
 * The options {@link ConfirmPublisher.send} takes: amqplib's, for a message that is
 * mandatory and persistent. The caller builds them once per message (e.g.
 * `toAmqpMessage`) and they go to amqplib as they are, without a copy per send.
 */
export type ConfirmPublishOptions = Options.Publish & {
  readonly messageId: string;
  readonly mandatory: true;
  readonly deliveryMode: 2;
  readonly persistent?: true;
};

/** The `ok` outcome: one frozen object for every confirmed message (nothing to allocate per confirm). */
const OK: ConfirmOutcome = Object.freeze({ kind: 'ok' });

/**
 * Receives the outcomes of messages sent with {@link ConfirmPublisher.sendTo}, each with the
 * `index` it was sent with. One sink serves a whole batch, so a relay's batch of hundreds
 * of messages costs no promise per message (a promise per message and a reaction to it
 * were a measurable share of the relay's CPU per message).
 */
export interface OutcomeSink {
  /** Called exactly once per message sent to this sink, synchronously from the channel's event (or from `sendTo` on a closed channel). */
  settle(index: number, outcome: ConfirmOutcome): void;
}

interface Pending {
  readonly messageId: string;
  readonly sentAt: number;
  readonly sink: OutcomeSink;
  readonly index: number;
  done: boolean;
}

/** A sink for one message whose outcome a promise carries ({@link ConfirmPublisher.send}). */
class PromiseSink implements OutcomeSink {
  readonly promise: Promise<ConfirmOutcome>;
  #resolve!: (outcome: ConfirmOutcome) => void;

  constructor() {
    this.promise = new Promise((resolve) => {
      this.#resolve = resolve;
    });
  }

  settle(_index: number, outcome: ConfirmOutcome): void {
    this.#resolve(outcome);
  }
}

/**
 * How often a publisher with `timeoutMs` looks for timed-out messages, so a message's
 * `timeout` outcome comes at most `timeoutMs + sweepIntervalMs(timeoutMs)` after it was sent.
 */
export function sweepIntervalMs(timeoutMs: number): number {
  return Math.max(20, Math.floor(timeoutMs / 4));
}

/**
 * Publishes on one confirm channel with a window of unconfirmed messages in flight.
 *
 * Guarantees: every message sent gets exactly one outcome — `ok` only after the broker's
 * `basic.ack` and no `basic.return` for it; `returned` for a mandatory message no queue
 * took (RabbitMQ sends the return before the ack of the same message, so matching
 * returns to acks by messageId in order is exact); `nacked`; `timeout` when no answer
 * came within `timeoutMs` (the channel is then closed, since a channel that stops
 * confirming is not trusted again); `closed` when the channel or connection died first,
 * with `channelError` set when the broker closed the channel while the connection stayed
 * open (every unconfirmed message is then a suspect: one of them may be the cause).
 * Not more than `window` messages are unconfirmed at once, and socket back-pressure
 * (`publish` returning false) is honoured before the next write.
 */
export class ConfirmPublisher {
  readonly #channel: ConfirmChannel;
  readonly #window: number;
  readonly #timeoutMs: number;
  readonly #pending = new Set<Pending>();
  readonly #returns = new Map<string, Message[]>();
  #inFlight = 0;
  #waiters: (() => void)[] = [];
  #needsDrain = false;
  #closedBy: unknown = null;
  #channelError: ChannelError | null = null;
  #sweeper: NodeJS.Timeout;

  constructor(channel: ConfirmChannel, options: { readonly window: number; readonly timeoutMs: number }) {
    this.#channel = channel;
    this.#window = options.window;
    this.#timeoutMs = options.timeoutMs;
    channel.on('return', (message: Message) => {
      const id = String(message.properties.messageId);
      const list = this.#returns.get(id);
      if (list) list.push(message);
      else this.#returns.set(id, [message]);
    });
    channel.on('drain', () => {
      this.#needsDrain = false;
      this.#wake();
    });
    // amqplib emits 'error' only when the channel itself was closed (by the broker, or by
    // the client over a protocol error), and before 'close'; a lost connection closes its
    // channels without one. That is what tells a refused message from an outage.
    channel.on('error', (error: unknown) => {
      const code = (error as { code?: unknown } | null)?.code;
      if (typeof code === 'number' && this.#channelError === null) {
        this.#channelError = { code, message: error instanceof Error ? error.message : String(error) };
      }
    });
    channel.on('close', () => this.#markClosed(new Error('channel closed')));
    // One timer for the whole window instead of one per message: at tens of thousands
    // of messages a second, per-message timers cost more than the publishing itself.
    this.#sweeper = setInterval(() => this.#sweep(), sweepIntervalMs(this.#timeoutMs));
    this.#sweeper.unref();
  }

  /** False once the channel closed or stopped confirming; a new publisher is then needed. */
  get alive(): boolean {
    return this.#closedBy === null;
  }

  /** Messages sent and not yet answered. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** True when {@link send} may be called now without exceeding the window or the socket buffer. */
  hasCapacity(): boolean {
    return this.#closedBy !== null || (this.#inFlight < this.#window && !this.#needsDrain);
  }

  /** Resolves when {@link hasCapacity} is true (or the channel died: `send` then answers `closed`). */
  capacity(): Promise<void> {
    if (this.hasCapacity()) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  /**
   * Sends one persistent, mandatory message and returns its outcome's promise. Throws
   * synchronously, having sent nothing, when amqplib cannot encode it (e.g. a headers
   * table over 64 KiB); the window is then unchanged.
   */
  send(exchange: string, routingKey: string, content: Buffer, options: ConfirmPublishOptions): Promise<ConfirmOutcome> {
    const sink = new PromiseSink();
    this.sendTo(exchange, routingKey, content, options, sink, 0);
    return sink.promise;
  }

  /**
   * Sends one persistent, mandatory message whose outcome goes to `sink` with `index`
   * (exactly once: on the broker's answer, on a timeout, or at once when the channel is
   * already closed). Throws synchronously, having sent nothing and called nothing, when
   * amqplib cannot encode it (e.g. a headers table over 64 KiB); the window is then
   * unchanged. The same guarantees as {@link send}, without a promise per message.
   */
  sendTo(exchange: string, routingKey: string, content: Buffer, options: ConfirmPublishOptions, sink: OutcomeSink, index: number): void {
    if (this.#closedBy !== null) {
      sink.settle(index, this.#closed(this.#closedBy));
      return;
    }
    const pending: Pending = { messageId: options.messageId, sentAt: Date.now(), sink, index, done: false };
    let flushed: boolean;
    try {
      flushed = this.#channel.publish(exchange, routingKey, content, options, (error: unknown) => this.#answer(pending, error));
    } catch (error) {
      // A channel that is closing throws IllegalOperationError before our 'close'
      // listener ran: that is a lost channel, not a message amqplib cannot encode.
      if (error instanceof Error && error.name === 'IllegalOperationError') {
        this.#markClosed(error);
        sink.settle(index, this.#closed(error));
        return;
      }
      throw error;
    }
    this.#inFlight++;
    this.#pending.add(pending);
    if (!flushed) this.#needsDrain = true;
  }

  /** Closes the channel; unconfirmed messages answer `closed`. Idempotent. */
  async close(): Promise<void> {
    this.#markClosed(new Error('publisher closed'));
    // Resolves when the channel is closed by any means, the connection dying included.
    await closeAmqp(this.#channel);
  }

  #answer(pending: Pending, error: unknown): void {
    this.#inFlight--;
    this.#wake();
    let outcome: ConfirmOutcome;
    if (error) {
      // amqplib reports a nack and a closed channel through the same callback; only the
      // message text tells them apart.
      outcome = error instanceof Error && error.message === 'message nacked' ? { kind: 'nacked' } : this.#closed(error);
    } else {
      const returned = this.#takeReturn(pending.messageId);
      outcome = returned
        ? { kind: 'returned', replyCode: Number(returned.fields.replyCode ?? 0), replyText: String(returned.fields.replyText ?? '') }
        : OK;
    }
    if (pending.done) return;
    pending.done = true;
    this.#pending.delete(pending);
    pending.sink.settle(pending.index, outcome);
  }

  #takeReturn(messageId: string): (Message & { fields: { replyCode?: unknown; replyText?: unknown } }) | undefined {
    // Returns are rare (a mandatory message no queue took): no lookup, and no hash of the
    // message id, per confirm while there are none.
    if (this.#returns.size === 0) return undefined;
    const list = this.#returns.get(messageId);
    if (!list) return undefined;
    const first = list.shift();
    if (list.length === 0) this.#returns.delete(messageId);
    return first as (Message & { fields: { replyCode?: unknown; replyText?: unknown } }) | undefined;
  }

  #sweep(): void {
    const now = Date.now();
    let expired = false;
    // Sets iterate in insertion order, i.e. send order: stop at the first young entry.
    for (const pending of this.#pending) {
      if (now - pending.sentAt < this.#timeoutMs) break;
      pending.done = true;
      this.#pending.delete(pending);
      pending.sink.settle(pending.index, { kind: 'timeout' });
      expired = true;
    }
    if (expired) void this.close();
  }

  #markClosed(cause: unknown): void {
    if (this.#closedBy !== null) return;
    this.#closedBy = cause;
    clearInterval(this.#sweeper);
    for (const pending of this.#pending) {
      pending.done = true;
      pending.sink.settle(pending.index, this.#closed(cause));
    }
    this.#pending.clear();
    this.#returns.clear();
    this.#wake(true);
  }

  #closed(cause: unknown): ConfirmOutcome {
    return { kind: 'closed', cause, channelError: this.#channelError };
  }

  #wake(all = false): void {
    while (this.#waiters.length > 0 && (all || this.hasCapacity())) this.#waiters.shift()!();
  }
}
