import type { Envelope, PortLimits } from './envelope.js';
import type { CourierError } from './errors.js';

/** What a transport can do; the core and the conformance suite adapt to it. */
export interface TransportCapabilities {
  /** Deliveries of one (topic, key) reach an ordered subscription in publish order, one at a time. */
  readonly orderingByKey: boolean;
  /**
   * Several messages of one key may go in one `publish` call: they reach consumers in call
   * order, and once one of them is refused, none after it of the same key in that call is
   * delivered. Only then may the relay pipeline a key; otherwise it sends one at a time.
   */
  readonly orderedPipelining: boolean;
  /** `retry(delayMs)` waits the exact delay (false: rounded to a delay tier). */
  readonly nativeDelay: boolean;
  /** Dead-lettered deliveries are kept by the broker and reachable through `deadLetters`. */
  readonly nativeDeadLetter: boolean;
  /** Largest envelope the broker accepts, in bytes of payload. */
  readonly maxMessageBytes: number;
  /**
   * Longest `publish` waits for the broker's answer to a message it sent before reporting
   * it `PUBLISH_TIMEOUT`, in milliseconds; absent when the transport does not bound it.
   * Over an outbox store that cannot renew leases, `createBus` refuses a relay lease shorter
   * than twice this, and the relay sends nothing so late in its lease that such an answer
   * could outlive it; so a slow confirm is never re-claimed and sent again while its first
   * copy is still awaited. A store that renews keeps the lease while the answer is awaited.
   */
  readonly publishTimeoutMs?: number;
}

/** Outcome of publishing one message. */
export type PublishResult =
  | { readonly messageId: string; readonly ok: true }
  | { readonly messageId: string; readonly ok: false; readonly error: CourierError };

/** A subscription's endpoint: one consumer (group) over one or more topics. */
export interface Endpoint {
  /** Consumer (group) name; deliveries are shared among the endpoint's instances. */
  readonly consumer: string;
  readonly topics: readonly string[];
  /** Deliver each (topic, key) in order, one at a time, retries included (see `Delivery.retry`). Requires `orderingByKey`. */
  readonly ordered: boolean;
  /** Most deliveries handed to the handler at once. */
  readonly concurrency: number;
}

/** Why a delivery is dead-lettered. */
export interface DeadLetterReason {
  readonly code: string;
  readonly message: string;
}

/**
 * One received message. Exactly one of `ack`, `retry` or `deadLetter` must be called;
 * later calls are ignored. If the connection is lost first, the broker redelivers.
 */
export interface Delivery {
  readonly envelope: Envelope;
  /** 1 for the first delivery, plus one per `retry` settle (broker redeliveries after a crash do not count). */
  readonly attempt: number;
  /**
   * True when an operator replayed this message from the dead letters. The consumer then
   * runs it again even though it was dead-lettered before; copies that are not replays
   * (a relay's at-least-once duplicate) are acknowledged without running. Optional: a
   * transport that cannot tell leaves it unset, and replays are then treated as duplicates.
   */
  readonly replayed?: boolean;
  /** Removes the message for this consumer. */
  ack(): Promise<void>;
  /**
   * Redelivers the message to this consumer after about `delayMs`, with `attempt + 1`, without blocking others.
   * On an ordered endpoint the message keeps its place: nothing later of its (topic, key) is
   * delivered before the retried one has been settled, while other keys flow and the
   * handler slot it held is free during the delay (transports typically wait in place). The
   * core relies on this for ordered subscriptions' retries.
   */
  retry(delayMs: number, reason: DeadLetterReason): Promise<void>;
  /** Moves the message to this consumer's dead-letter place with the reason and attempt count. */
  deadLetter(reason: DeadLetterReason): Promise<void>;
}

/** A live subscription. */
export interface Subscription {
  /** Stops receiving, waits for handlers in flight, then closes. Idempotent. */
  close(): Promise<void>;
}

/** A dead-lettered delivery as operators see it. */
export interface DeadLetter {
  /** Transport-specific handle for replay and purge. */
  readonly id: string;
  readonly consumer: string;
  readonly envelope: Envelope;
  readonly reason: DeadLetterReason;
  readonly attempt: number;
  readonly deadAt: Date;
}

/** Operator access to a transport's dead letters (present when `nativeDeadLetter`). */
export interface TransportDeadLetters {
  list(consumer: string, options?: { limit?: number }): Promise<readonly DeadLetter[]>;
  /** Re-delivers to the consumer with the original messageId and attempt 1. */
  replay(consumer: string, ids: readonly string[]): Promise<number>;
  purge(consumer: string, ids: readonly string[]): Promise<number>;
}

/** Called for every delivery; it settles the delivery before resolving. */
export type DeliveryHandler = (delivery: Delivery) => Promise<void>;

/**
 * Broker port.
 *
 * Contract every implementation keeps (the conformance suite checks each):
 * - `publish` resolves only when the broker has answered for every message, with one
 *   result per message in input order; one rejected message never fails its neighbours.
 *   It rejects (with a retriable `TransportError`) only when the transport as a whole is
 *   unavailable; the relay then pauses and counts no attempts.
 * - Once `publish`'s `signal` aborts (the relay stops, or its sending deadline for the
 *   lease passed), messages not yet sent come back `ABORTED` (or the call rejects with
 *   `ABORTED` before sending any); messages already sent are still answered. The relay
 *   releases `ABORTED` ones without counting an attempt.
 * - Publishing is at-least-once: a message whose confirm was lost may arrive twice.
 * - Every envelope field round-trips losslessly.
 * - `subscribe` uses manual acknowledgement; a delivery not settled before its
 *   connection dies is redelivered.
 * - A message the broker refuses for its content (even one that makes it close a channel
 *   or connection) fails alone, as a per-message result that is not a connectivity
 *   failure; its neighbours are still published.
 * - `validate`, when present, names every problem that makes the broker refuse an
 *   envelope whatever its state; `publish` refuses such an envelope in its result.
 * - `close` is idempotent and waits for work in flight.
 */
export interface Transport {
  readonly capabilities: TransportCapabilities;
  /**
   * Lists what makes the broker refuse `envelope` whatever its state (a header name the
   * broker reserves, say); empty when it is deliverable. Optional.
   *
   * Guarantees: pure and synchronous (no I/O), so the outbox can call it at `publish()`
   * and refuse the message there, naming each problem, before anything is appended; an
   * envelope with problems is also refused by `publish`, alone, never sent. A transport
   * with nothing to check leaves it out.
   */
  validate?(envelope: Envelope): readonly string[];
  publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]>;
  subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription>;
  readonly deadLetters?: TransportDeadLetters;
  close(): Promise<void>;
  /**
   * Optional: the longest envelope fields and consumer names the broker takes (AMQP short
   * strings hold 255 bytes, say). The bus refuses a longer field at `publish()` and a
   * longer consumer name at `subscribe`, so neither fails later as a dead outbox row or a
   * subscription that cannot start.
   */
  readonly limits?: PortLimits;
}
