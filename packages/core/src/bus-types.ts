import type { Envelope } from './envelope.js';
import type { FaultHook } from './fault-points.js';
import type { InboxStore } from './inbox-store.js';
import type { Logger } from './logger.js';
import type { DecodedOf, MessageDefinition, PayloadOf } from './message-definition.js';
import type { AppendResult, OutboxStore, PublishedId } from './outbox-store.js';
import type { RelayLease } from './relay.js';
import type { RetryPolicy } from './retry.js';
import type { Transport } from './transport.js';

/** What happens to a head message that exhausted its attempts or is poison. */
export type PoisonPolicy = 'park' | 'halt';

/** Per-call options of {@link OutboxPublisher.publish}. */
export interface PublishOptions {
  /** Ordering key (usually the aggregate id). Order is promised per (topic, key). */
  readonly key?: string;
  /** Not published before this many milliseconds after commit (database clock). */
  readonly delay?: number;
  /** Not published before this instant. */
  readonly notBefore?: Date;
  /** Defaults to a new UUIDv7. Must be unique in the outbox. */
  readonly messageId?: string;
  /** Defaults to the handled message's correlationId inside a handler, else the new messageId. */
  readonly correlationId?: string;
  /** Defaults to the handled message's messageId inside a handler. */
  readonly causationId?: string;
  /** When the business fact happened; defaults to now. */
  readonly occurredAt?: Date;
  /** User headers; string values, no `courier-` prefix. */
  readonly headers?: Readonly<Record<string, string>>;
  /**
   * Priority, 0 (lowest) to 9; overrides the definition's. Carried in the envelope as the
   * `courier-priority` header and honoured only by transports declaring
   * `capabilities.priorities` for consumers that ask for it; others ignore it.
   */
  readonly priority?: number;
}

/**
 * Writes messages into one unit of work. Obtained from {@link Bus.outbox}. `A` is what the
 * outbox store's `append` returns: `void` (MikroORM, in-memory) makes `publish` return the
 * messageId, `Promise<void>` (a store that writes at once, such as node-postgres) makes it
 * return a promise of it.
 */
export interface OutboxPublisher<A extends AppendResult = void> {
  /**
   * Validates and appends one message to the unit of work; returns its messageId (a promise
   * of it when the store writes at once).
   *
   * Guarantees: the message is published if and only if the unit of work commits; on
   * bad input it throws (`SerializationError`, `ConfigError`) and appends nothing, leaving
   * the unit of work usable. On a store that writes at once the promise must be awaited
   * before the unit of work commits: it settles when the row is written in it; bad input
   * rejects it (nothing written, the unit of work usable), and any other rejection (a
   * duplicate messageId, a lost connection) means the unit of work must not commit. A text field no database can store — U+0000 or a lone UTF-16
   * surrogate in the key, an id, a header name or value (type and topic are ASCII by their
   * patterns) — is a `ConfigError` naming the field, never a failed commit. The payload
   * needs no such check: it is JSON text, which escapes both.
   */
  publish<D extends MessageDefinition<unknown, unknown>>(definition: D, payload: PayloadOf<D>, options?: PublishOptions): PublishedId<A>;
}

/** A decoded message as a handler sees it. */
export interface ReceivedMessage<TPayload> {
  readonly messageId: string;
  readonly type: string;
  /** The version it was published with (the payload is already upcast to the current one). */
  readonly version: number;
  readonly topic: string;
  readonly key: string | null;
  readonly occurredAt: Date;
  readonly correlationId: string;
  readonly causationId: string | null;
  readonly headers: Readonly<Record<string, string>>;
  readonly payload: TPayload;
}

/** What a handler gets besides the message. `A` is what the outbox store's `append` returns (see {@link OutboxPublisher}). */
export interface HandlerContext<Tx, A extends AppendResult = void> {
  /** The unit of work the inbox record commits in; write effects through it. */
  readonly tx: Tx;
  /** The consumer (group) name. */
  readonly consumer: string;
  /** Try number of this message for this consumer, from 1. */
  readonly attempt: number;
  /** Aborted when the bus stops. */
  readonly signal: AbortSignal;
  readonly logger: Logger;
  /** The raw envelope. */
  readonly envelope: Envelope;
  /**
   * Publishes through the outbox in `tx`, inheriting correlationId and setting causationId.
   * On a store that writes at once it returns a promise; the consumer awaits every such
   * append of the handler before it commits `tx`, and one that rejects fails the delivery
   * (retried by the retry policy) even when the handler did not await it.
   */
  publish<D extends MessageDefinition<unknown, unknown>>(definition: D, payload: PayloadOf<D>, options?: PublishOptions): PublishedId<A>;
}

/** A message handler. Throw to retry; throw `UnrecoverableError` to dead-letter at once. */
export type Handler<D, Tx, A extends AppendResult = void> = (message: ReceivedMessage<DecodedOf<D>>, context: HandlerContext<Tx, A>) => Promise<void>;

/** Per-subscription options. */
export interface SubscribeOptions {
  /** Most messages handled at once by this process. Default 8; an ordered subscription still handles one message per key at a time. */
  readonly concurrency?: number;
  /**
   * Keep per-key order. Default false. A failing message is retried through the transport,
   * which keeps it in front of its key: only that key waits during the backoff; other keys
   * and other subscriptions keep flowing, and no handler slot is held while it waits.
   */
  readonly ordered?: boolean;
  /** Retry policy for this subscription; defaults to the bus's. */
  readonly retry?: Partial<RetryPolicy>;
  /**
   * Runs that never finished before a message counts as poison (dead-lettered with
   * `CRASH_LOOP`). Default 3. A message is suspected only when the transport redelivers it
   * (`Delivery.redelivered`: a process or connection died with it in hand); a suspect runs
   * alone, and the count is its first unfinished run plus each later run alone whose
   * process died within `crashWindowMs` of its start. Raise it for services whose
   * processes are killed often (frequent rollouts, spot instances).
   */
  readonly maxCrashes?: number;
  /**
   * How long a suspect's run alone may be blamed for its process dying, in milliseconds.
   * Default 10 s. A message that kills its process does so while it runs, so set this to a
   * few times the handler's usual run time (its p99 under load, commit included): a kill
   * from outside that comes later than this is not counted against the message, and a
   * run that is stopped by `bus.stop()` never counts.
   */
  readonly crashWindowMs?: number;
  /**
   * What happens to a message given up on (attempts exhausted, `UnrecoverableError`, a
   * payload it cannot decode, a crash loop). Default `'park'`, ordered subscriptions
   * included: it is dead-lettered with its error and the key moves on (a gap in the key's
   * order, repaired by replaying the dead letter).
   *
   * `'halt'`, for ordered subscriptions only and with an inbox store that has halts
   * (`InboxHalts`; `ConfigError` otherwise): a message with a key is not dead-lettered; its
   * key is halted at it in the inbox store, and every later message of that key is held in
   * the store (acknowledged, not applied) while other keys flow. An operator lists the
   * halted keys (`courier halted list`) and resumes one with `retry` (the head runs again)
   * or `park` (the head is kept as parked and recorded dead); a consumer instance of the
   * subscription then applies the held messages in arrival order and lifts the halt. A
   * message without a key is dead-lettered as under `'park'`.
   *
   * Why `'park'` is the default even for ordered subscriptions: a halted key waits for a
   * person, and its held messages pile up in the database until then; most services prefer
   * a dead letter and an alert to a stopped customer. Choose `'halt'` when applying a
   * key's messages out of order is worse than not applying them (balances, state
   * machines), and alert on the halted-keys counter.
   */
  readonly poison?: PoisonPolicy;
}

/** Relay settings. */
export interface RelayConfig {
  /**
   * Rows claimed per batch. Default 500 (`DEFAULT_RELAY_BATCH_SIZE`): the relay's loops
   * together then keep a broker's confirm window full while some of them claim, and each
   * claim's and completion's round trip is shared by more rows (less CPU per message). Per-key
   * order does not depend on it (a claim takes one head per key unless the transport
   * declares ordered pipelining); a smaller batch lowers how many rows one relay holds under
   * lease at once, a larger one rarely drains faster.
   */
  readonly batchSize?: number;
  /**
   * Lease length: how long a claimed batch stays with this relay without a word from it.
   * When the store renews leases (`OutboxStore.renew`), the relay renews every third of it
   * while a batch is in hand, so it bounds how long a dead relay's keys stay blocked (about
   * `leaseMs` plus `pollIntervalMs`). Default 5 s; a renewal that fails for most of a lease
   * (the database slow or away) stops the batch's sending. When the store cannot renew:
   * default 30 s, and at least twice the transport's declared `publishTimeoutMs`
   * (`createBus` checks), so a confirm that comes late is never re-claimed and sent again.
   * It is also the lease of a consumer's drain of a resumed halted key (`poison: 'halt'`),
   * renewed every third of it while the drain runs: a dead drainer's key is drained by
   * another instance about this long later.
   */
  readonly leaseMs?: number;
  /** Poll interval when the store has no wake-up signal (or as a safety net). Default 1 s. */
  readonly pollIntervalMs?: number;
  /** Publish retry policy (attempts count only failures of the message itself). */
  readonly retry?: Partial<RetryPolicy>;
  /** Backoff while the transport or the store is down. */
  readonly pause?: { readonly initialDelayMs?: number; readonly maxDelayMs?: number };
  /** Poison head policy. Default 'park'. */
  readonly poison?: PoisonPolicy;
  /** Lease owner name; default host + pid + random. */
  readonly owner?: string;
}

/**
 * Arguments of {@link createBus}. Both stores share one unit-of-work type. `A` is what the
 * outbox store's `append` returns, inferred from the store: it decides whether `publish`
 * returns a `string` or a `Promise<string>`.
 */
export interface BusConfig<Tx, A extends AppendResult = AppendResult> {
  readonly outbox: OutboxStore<Tx, A>;
  /** Required when the bus has subscriptions. */
  readonly inbox?: InboxStore<Tx>;
  readonly transport: Transport;
  /** Default consumer retry policy. */
  readonly retry?: Partial<RetryPolicy>;
  readonly relay?: RelayConfig;
  /**
   * Where the bus logs. Default `defaultLogger`: warnings and errors (dead letters,
   * halted keys, outages) as JSON lines on stderr. `noopLogger` silences it.
   */
  readonly logger?: Logger;
  /** Largest payload accepted at publish, in bytes; the transport's limit applies too. Default 1 MiB. */
  readonly maxPayloadBytes?: number;
  /** Called when a key is halted by the relay's poison policy. */
  readonly onKeyHalted?: (topic: string, key: string, error: string) => void;
  /** Test hook for the conformance suite's fault points. Leave unset in production. */
  readonly faults?: FaultHook;
  /** Message id generator; default UUIDv7. */
  readonly newId?: () => string;
}

/** Which parts {@link Bus.start} runs, and what it does when one cannot start yet. */
export interface StartOptions {
  /** Run the relay (default true). */
  readonly relay?: boolean;
  /** Run the subscriptions (default true). */
  readonly consumers?: boolean;
  /**
   * Reject `start()` when any part fails its first try, even for an outage (a broker or
   * database that cannot be reached), after stopping what did start. Default false: a part
   * that fails with a retriable error keeps trying in the background and `health()` reports
   * it not ready with the error. Set it for a process that should exit (and be restarted)
   * rather than wait. Non-retriable errors (a bad configuration, a missing schema) reject
   * `start()` either way.
   */
  readonly failFast?: boolean;
}

/** Counters since start, also exported as OpenTelemetry metrics. */
export interface BusCounters {
  readonly published: number;
  readonly publishFailures: number;
  readonly relayPauses: number;
  readonly processed: number;
  readonly retries: number;
  readonly deadLettered: number;
  readonly duplicates: number;
  /** Keys halted by the relay's poison policy plus keys halted by ordered subscriptions with `poison: 'halt'`. */
  readonly haltedKeys: number;
  /**
   * Consumer acknowledgements that failed after the inbox recorded the message (a lock that
   * lapsed, a lost connection): each logged as a warning, none taken for the message's
   * failure; the broker redelivers the message and the inbox drops that copy. A steady rise
   * says locks or leases are too short for the handlers, or the connection is unwell.
   */
  readonly ackFailures: number;
  /**
   * Retry and dead-letter settles the transport failed (a retry or dead-letter copy the
   * broker refused or never confirmed, a nak or dead-letter disposition that failed): each
   * logged as an error; the consumer then asks the transport to give the message back after
   * the pause (`relay.pause.maxDelayMs`), and it is retried or given up on again when it
   * comes back. A steady rise says the broker refuses the copies (a dead-letter place too
   * small, full or missing) and messages go round instead of settling.
   */
  readonly settleFailures: number;
}

/**
 * Health snapshot.
 *
 * `ready` is what a readiness probe wants: true while the bus runs and every part it runs
 * works — the relay has claimed since its last failure, every consumer is subscribed. A
 * part that could not start yet (or lost its store or broker) is not ready and says why
 * in its `lastError`; the bus keeps retrying it in the background until `stop()`.
 */
export interface BusHealth {
  /** `degraded`: started, but a part is not ready (an outage, or a part still waiting to start). */
  readonly status: 'stopped' | 'starting' | 'running' | 'degraded' | 'stopping';
  /** True when `status` is `running`: every part the bus runs is ready. */
  readonly ready: boolean;
  readonly relay: {
    readonly running: boolean;
    /** True once the relay has claimed from the store and is not paused; false when it does not run (yet). */
    readonly ready: boolean;
    /** True while the transport or store is unavailable and the relay backs off. */
    readonly paused: boolean;
    /** The last claim or publish failure (kept after recovery; read it when not ready). */
    readonly lastError: string | null;
    /** Milliseconds since the relay last completed a claim, -1 before the first. */
    readonly sinceLastClaimMs: number;
    /** The name it claims under (the outbox's `lease_owner`); null when the bus runs no relay. */
    readonly owner: string | null;
    /** The leases on batches it is sending now (token, rows, held for), oldest first. */
    readonly leases: readonly RelayLease[];
  };
  readonly consumers: readonly {
    readonly consumer: string;
    /** True once its subscription started; false while `start()` keeps retrying it in the background. */
    readonly connected: boolean;
    readonly inFlight: number;
    /** Why it is not connected (the last subscribe failure); null once connected. */
    readonly lastError: string | null;
  }[];
  readonly counters: BusCounters;
}
