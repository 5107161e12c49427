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
  /**
   * Every consumer (group) subscribed to a topic gets its own copy of each message of it,
   * while the instances of one group compete for theirs (absent: true). False on a broker
   * whose entity is a single queue per topic (Azure Service Bus queues, a Basic-tier
   * namespace): every receiver of the topic competes, whatever its group, so a second group
   * would silently take part of the first one's messages. The bus then refuses a second
   * consumer group on a topic (within the bus; groups in other processes it cannot see),
   * and the conformance suite skips, saying why, its two-groups case.
   */
  readonly fanOut?: boolean;
  /** `retry(delayMs)` waits the exact delay (false: rounded to a delay tier). */
  readonly nativeDelay: boolean;
  /**
   * The transport honours message priority (the envelope's `courier-priority`, from
   * `priority` on the definition or the publish call): a consumer that asks for it gets
   * higher priorities first from a backlog. Absent or false: priority is carried but
   * ignored, and messages are delivered as they would be without it.
   */
  readonly priorities?: boolean;
  /**
   * Dead-lettered deliveries are kept by the broker and reachable through `deadLetters`
   * (list, replay, purge). When false, `Delivery.deadLetter` must still take the message
   * out of the consumer's flow and keep it durably with its reason (say, on a dead-letter
   * topic of the transport's own), but Courier cannot list or replay it: operators use the
   * broker's tools, and the bus suite skips, saying why, the scenarios whose end state is
   * a consumer dead letter (`poison-head`, `crash-loop`), since it reads them from
   * `deadLetters`. A transport declaring false leaves `deadLetters` out.
   */
  readonly nativeDeadLetter: boolean;
  /**
   * Largest payload the broker accepts: the UTF-8 byte length of `envelope.payload` (the
   * serialised JSON text), not of the encoded message. Headers and other envelope fields
   * are bounded by `limits`; a transport whose broker limits the whole encoded message
   * declares the payload room left after its largest envelope fields. The bus refuses a
   * larger payload at `publish()` (`SerializationError` `PAYLOAD_TOO_LARGE`, against
   * min(`maxPayloadBytes`, this)); `publish` refuses one in its result, alone, with a
   * non-retriable error of code `PAYLOAD_TOO_LARGE`.
   */
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
  /**
   * Longest `retry(delayMs)` the transport can keep a delivery waiting for, and the
   * transport setting that bounds it (named in the refusal, e.g. `maxLockRenewalMs`); absent
   * when any delay is kept. A transport that holds the message in hand while the delay runs
   * (a lock it renews for a limited time) declares it, since a longer delay would let the
   * message return with its old attempt. `createBus` and `subscribe` refuse a retry policy
   * whose `maxDelayMs`, or a relay `pause.maxDelayMs` (the consumer's own redelivery delay
   * after a failure outside the handler), above `maxMs`, naming both settings.
   */
  readonly retryDelayLimit?: { readonly maxMs: number; readonly setting: string };
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

/**
 * Why a delivery is dead-lettered (or retried).
 *
 * What an implementation may rely on for every reason the core passes to
 * `Delivery.deadLetter` and `Delivery.retry`: `code` is at most `REASON_LIMITS.codeBytes`
 * and `message` at most `REASON_LIMITS.messageBytes` UTF-8 bytes, and neither holds U+0000
 * or a lone UTF-16 surrogate (the core cut a longer handler error on a character boundary,
 * saying so, and replaced those characters with U+FFFD: `boundReason`). A transport that
 * stores or sends that much keeps every reason whole, and the conformance suite lists a
 * dead letter whose reason is exactly at the limit. A transport whose `deadLetter` can be
 * called with text from elsewhere (its own code, a user driving it directly) bounds it
 * again where it writes, with `boundReason`.
 */
export interface DeadLetterReason {
  readonly code: string;
  readonly message: string;
}

/**
 * One received message. Exactly one of `ack`, `retry` or `deadLetter` settles it; calls
 * after the one that settled it are ignored. If the connection is lost first, the broker
 * redelivers.
 *
 * A settle that fails — it cannot reach the broker, or the broker refuses or never confirms
 * the copy it writes (a delay-tier or retry-topic publish, a dead-letter publish), or a
 * broker-native settle (a nak, an abandon, a dead-letter disposition, an ack) fails — rejects
 * with a `TransportError` and has settled nothing. Then, whatever else happens:
 * - the transport takes a later settle of the delivery (the core asks `retry` after a failed
 *   `retry` or `deadLetter`, to have the message back after its pause; it asks nothing after
 *   a failed `ack`, the inbox having recorded the message);
 * - the message is never lost: a copy is written, and confirmed, before the original is
 *   acknowledged or committed past, so a failure in between leaves a duplicate at worst;
 * - the message is never left in hand for ever: a delivery whose handler returned with it
 *   unsettled (every settle failed, or none was made) comes back to the consumer, flagged
 *   `redelivered` — through the broker where a lease, lock or dead channel brings it back
 *   (RabbitMQ requeues it, the SQL transport's lease and Service Bus's lock lapse), and
 *   through the transport itself where nothing would (a Kafka record stays in hand, holding
 *   its key and its partition's commit point, until the transport hands it back; a JetStream
 *   in-progress heartbeat must stop). Its key and commit point then move again;
 * - a dead letter the broker refuses for good (too large for the dead-letter place) is not
 *   retried unchanged for ever: the transport writes a reduced copy that still carries the
 *   whole message (the reason text cut; Kafka) or bounds what it adds before writing
 *   (RabbitMQ), so the key moves on.
 * The conformance kit holds every transport to this through `TransportFixture.failSettles`
 * and its oversized dead-letter case.
 */
export interface Delivery {
  readonly envelope: Envelope;
  /**
   * 1 for the first delivery, plus one per `retry` settle. Broker redeliveries after a
   * crash or a lost connection do not count (they set `redelivered`): the core counts
   * crashes itself to find crash loops, and a count that grew with redeliveries would burn
   * retry attempts on crashes. A broker whose
   * own delivery counter includes redeliveries (JetStream `num_delivered`, Service Bus
   * `deliveryCount`) carries the attempt in a header of the transport's own instead
   * (RabbitMQ: `courier-attempt`), written on the copy each `retry` publishes.
   */
  readonly attempt: number;
  /**
   * True when an operator replayed this message from the dead letters, on every delivery of
   * that replayed copy: the broker's redeliveries and duplicates of it and the copies its
   * `retry` settles produce. The consumer then runs it again even though it was
   * dead-lettered before, recorded in the inbox under the replay's own key, so a replay runs
   * at most once however many copies of it arrive; copies that are not replays (a relay's
   * at-least-once duplicate) are acknowledged without running. A retry that dropped the
   * mark would be taken for such a duplicate and acknowledged without running. Optional: a
   * transport that cannot tell leaves it unset, and replays are then treated as duplicates.
   */
  readonly replayed?: boolean;
  /**
   * True when the broker may have handed this message to this consumer (group) before
   * and it was never settled: a connection or process died with it in hand (RabbitMQ
   * `fields.redelivered`, JetStream `info.redelivered`). False for a first delivery and for
   * the copy or in-place wait a `retry` settle produces (those are counted in `attempt`).
   * A transport that cannot tell must say true: the core writes nothing before a
   * handler's own transaction unless this is set, and uses it to find messages that may
   * have killed their process (they run alone and their unfinished runs are counted), so
   * a false `false` would hide crash loops, while a false `true` only costs a run alone.
   */
  readonly redelivered: boolean;
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
  /**
   * Transport-specific handle for replay and purge, unique among the consumer's dead
   * letters. One non-empty token without whitespace or control characters (the conformance
   * suite checks it): operators copy it into `courier dead show|replay|purge dlq:<consumer>:<id>`.
   */
  readonly id: string;
  readonly consumer: string;
  readonly envelope: Envelope;
  readonly reason: DeadLetterReason;
  readonly attempt: number;
  readonly deadAt: Date;
}

/** Operator access to a transport's dead letters (present exactly when `nativeDeadLetter`). */
export interface TransportDeadLetters {
  /**
   * The consumer's dead letters. A read creates nothing (a consumer name nothing exists for
   * lists nothing) and neither takes messages from the broker nor hides them from another
   * reader (RabbitMQ's readers take turns under a lock for this). Oldest first (by `deadAt`),
   * the first `limit` of them. A transport that cannot read its whole dead-letter place
   * without hiding messages (SQS: receives with visibility 0 may keep returning the same
   * first messages) returns what it could read; with `count`, callers then say "N of M".
   * An entry that never was a valid envelope (dead-lettered with `ENVELOPE_INVALID`) has no
   * envelope to show: a transport may leave it out, and its README says where operators find
   * it (Kafka and NATS JetStream: with the broker's own tools).
   */
  list(consumer: string, options?: { limit?: number }): Promise<readonly DeadLetter[]>;
  /**
   * Optional: how many dead letters the consumer has, read without taking or hiding any (a
   * depth the broker keeps, not a listing): what `courier stats` and the dead-letter gauge
   * show, and the M of "N of M shown". 0 for a consumer nothing exists for; creates nothing.
   */
  count?(consumer: string): Promise<number>;
  /**
   * Optional: whether the broker has the consumer's dead-letter place (its dead-letter
   * queue, stream or subscription), asked passively: nothing created, nothing taken, no lock.
   * `list` answers a consumer that has none with nothing, like one with an empty queue; this
   * tells the two apart, so an operator's mistyped prefix or consumer name is reported as
   * such ("no such queue") instead of "no dead letters". A transport implements it only where
   * the broker can tell without creating anything.
   */
  exists?(consumer: string): Promise<boolean>;
  /**
   * Re-delivers to the consumer with the original messageId and attempt 1, marked
   * `replayed`. The replayed copy's run is recorded in the consumer's inbox under a key of
   * the dead letter's own, so it commits its effects at most once: a replay the broker
   * delivers twice, or the same dead letter replayed twice (two operators), runs once.
   * A replay whose run fails again is dead-lettered again and can be replayed again.
   */
  replay(consumer: string, ids: readonly string[]): Promise<number>;
  purge(consumer: string, ids: readonly string[]): Promise<number>;
}

/**
 * Called for every delivery; it settles the delivery before resolving and never rejects
 * for a handler's failure (the core settles those). A transport need not await it before
 * taking the next delivery, but keeps at most `endpoint.concurrency` in flight.
 */
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
 *   releases `ABORTED` ones without counting an attempt. An `ABORTED` error, thrown or in a
 *   result, is a `TransportError` with `retriable: true`: nothing about the message or the
 *   broker was wrong, the same publish with a live signal may succeed.
 * - Publishing is at-least-once: a message whose confirm was lost may arrive twice.
 * - "The broker answered" means the broker took responsibility for the message: it keeps it
 *   through whatever failures the broker promises to survive as it is configured (RabbitMQ: a
 *   persistent message in a durable queue, confirmed; Kafka: acks=all; a Redis `XADD` reply
 *   is only in memory unless the server writes an append-only file). The relay marks the row
 *   published on that answer, so a transport's README states what its answer is durable
 *   against and which broker settings that needs; a message the broker loses after answering
 *   is lost to Courier too.
 * - Every envelope field round-trips losslessly.
 * - `subscribe` uses manual acknowledgement; a delivery not settled before its
 *   connection dies is redelivered.
 * - A message the broker refuses for its content (even one that makes it close a channel
 *   or connection) fails alone, as a per-message result that is not a connectivity
 *   failure; its neighbours are still published.
 * - `validate`, when present, names every problem that makes the broker refuse an
 *   envelope whatever its state; `publish` refuses such an envelope in its result.
 * - `close` is idempotent and waits for work in flight.
 *
 * Lifecycle: there is no connect or start. A transport connects lazily (at its first
 * `publish` or `subscribe`, or begins in its constructor without failing it) and
 * reconnects by itself after a lost connection, re-declaring what it needs and resuming
 * its subscriptions. While the broker is unreachable `publish` and `subscribe` reject
 * with a retriable `TransportError` after a connect timeout of the transport's own, never
 * hanging (the bus retries `subscribe` in the background and reports the consumer not
 * ready in `health()`); a problem no retry fixes (queues declared with other settings)
 * rejects with a non-retriable error.
 *
 * Receiving: a message that is not a valid envelope (`decodeEnvelope` throws) is never
 * handed to a handler: the transport dead-letters it with code `ENVELOPE_INVALID` (or,
 * without `nativeDeadLetter`, keeps it aside as it keeps dead letters).
 */
export interface Transport {
  readonly capabilities: TransportCapabilities;
  /**
   * Lists what makes the broker refuse `envelope` whatever its state (a header name the
   * broker reserves, say); empty when it is deliverable. Optional.
   *
   * Guarantees: pure and synchronous (no I/O), so the outbox can call it at `publish()`
   * and refuse the message there, naming each problem, before anything is appended; an
   * envelope with problems is also refused by `publish`, alone, never sent, in its result
   * with a non-retriable error (not a `CONNECTIVITY_CODES` one) whose message names each
   * problem. Never names a problem with an envelope the broker takes. A transport
   * with nothing to check leaves it out.
   */
  validate?(envelope: Envelope): readonly string[];
  /**
   * Publishes `messages` in order and resolves with one result per message, in input
   * order, once the broker has answered for each (publisher confirm, acks=all, SDK send
   * resolved).
   *
   * Guarantees:
   * - Per-message failures are results, never a rejection: a nack or refusal
   *   (`PUBLISH_REJECTED`), a message no consumer can receive (`PUBLISH_UNROUTABLE`), a
   *   payload over `maxMessageBytes` (`PAYLOAD_TOO_LARGE`) or a message the transport
   *   cannot encode (not retriable), no answer in time (`PUBLISH_TIMEOUT`), or the
   *   connection lost after the message was sent (`TRANSPORT`, retriable: it may still
   *   arrive), or a destination that refused it for lack of room, such as a full queue
   *   (`PUBLISH_BACKPRESSURE`, retriable). The relay counts an attempt for the first kinds
   *   only; `TRANSPORT`, `PUBLISH_TIMEOUT`, `PUBLISH_BACKPRESSURE` and `CLOSED` results
   *   (`CONNECTIVITY_CODES`) pause it instead.
   * - The call rejects as a whole (retriable `TransportError`) only when nothing could be
   *   sent: no connection is open, or it was lost before the first message went out; and
   *   with a `ClosedError` after `close`. Once a message has been sent, the call resolves
   *   and reports each message.
   * - `signal`: already aborted, the call rejects with a `TransportError` of code `ABORTED`
   *   (`retriable: true`) and sends nothing, whatever `messages` holds; aborted mid-call,
   *   messages not yet sent come back as `ABORTED` results (the same error: the relay
   *   releases them without an attempt) while messages already sent are still answered.
   * - A transport that learns that no consumer group will receive a message (RabbitMQ's
   *   `basic.return`) reports `PUBLISH_UNROUTABLE`; the relay retries it, then parks it as
   *   a dead outbox row. Publishing to a topic before any consumer subscribed is otherwise
   *   allowed: a broker that stores messages per topic (JetStream streams, Kafka topics)
   *   keeps them for consumers that start later; one that routes into consumer queues
   *   cannot, and its README says to provision consumers first.
   */
  publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]>;
  /**
   * Starts delivering the endpoint's topics to `handler` with manual acknowledgement,
   * declaring what the broker needs (queues, consumers, bindings) idempotently.
   *
   * Guarantees: deliveries of one consumer (group) are shared among its subscriptions on
   * every connection; each group gets every message of its topics; at most
   * `endpoint.concurrency` handlers run at once. On an ordered endpoint each (topic, key)
   * is delivered in publish order, one at a time, retries in place included, and only one
   * subscription of the group receives at a time (single active consumer), so order holds
   * across instances. Rejects as described under Lifecycle while the broker is away.
   * After `close`, or when `close` begins while it is under way, it either resolved before
   * and that close stops the subscription, or rejects with a `ClosedError`: nothing of it
   * receives once `close` resolved.
   */
  subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription>;
  readonly deadLetters?: TransportDeadLetters;
  /**
   * Optional operator read: the consumer's lag at the broker — how many of its messages
   * wait there, not yet delivered (delivered and unacknowledged ones are not counted). What
   * `courier stats` and the console show per consumer. Asked passively: it creates nothing,
   * takes nothing, moves no offset or cursor. `null` when the broker has no place for the
   * consumer (it never subscribed; a mistyped name). A transport implements it only where
   * the broker keeps such a count (its README says what the number is); operator tools say
   * "not available" for one without it.
   */
  consumerLag?(consumer: string): Promise<number | null>;
  close(): Promise<void>;
  /**
   * Optional: the longest envelope fields and consumer names the broker takes (AMQP short
   * strings hold 255 bytes, say). The bus refuses a longer field at `publish()` and a
   * longer consumer name at `subscribe`, so neither fails later as a dead outbox row or a
   * subscription that cannot start.
   */
  readonly limits?: PortLimits;
}
