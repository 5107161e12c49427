import { metrics, type Attributes, type Meter, type ObservableResult } from '@opentelemetry/api';
import type { Bus } from './bus.js';
import { describeError } from './errors.js';
import type { Logger } from './logger.js';
import { defaultLogger } from './logger.js';
import type { InboxOperations, InboxStats } from './inbox-operations.js';
import type { InboxHalts } from './inbox-store.js';
import type { OutboxOperations, OutboxStats } from './outbox-store.js';
import type { TransportDeadLetters } from './transport.js';

const INSTRUMENTATION = '@courier/core';

/** Names of the observable gauges Courier registers; the operations guide documents each. */
export const OPERATOR_GAUGES = {
  outboxPending: 'courier.outbox.pending',
  outboxOldestPendingAge: 'courier.outbox.oldest_pending.age',
  outboxInFlight: 'courier.outbox.in_flight',
  outboxDead: 'courier.outbox.dead',
  outboxHaltedKeys: 'courier.outbox.halted_keys',
  inboxHaltedKeys: 'courier.inbox.halted_keys',
  inboxDeadLetters: 'courier.inbox.dead_letters',
  inboxRecords: 'courier.inbox.records',
  inboxOldestRecordAge: 'courier.inbox.oldest_record.age',
  relayPaused: 'courier.relay.paused',
  transportDeadLetters: 'courier.transport.dead_letters',
  logSlotLag: 'courier.outbox.log_slot.lag_bytes',
  logSlotUnacknowledgedAge: 'courier.outbox.log_slot.unacknowledged.age',
} as const;

/**
 * Name of the counter of failed operator reads behind the gauges (Prometheus
 * `courier_metrics_read_failures_total`), attribute `courier.metrics.source`: `outbox`,
 * `log_slot`, `inbox`, `inbox_halts` or `transport_dead_letters`.
 *
 * A failed read reports no gauge values for that collection (never zeros, never the last
 * values — the endpoint of `@courier/cli` drops a series nobody observed), so an operator
 * sees the failure here and the gauges' absence. Each observer adds 0 for its source when it
 * registers, so the first failure after a start is an `increase()` too.
 */
export const METRICS_READ_FAILURES = 'courier.metrics.read_failures';

/** Which operator read failed: the value of `courier.metrics.source` on {@link METRICS_READ_FAILURES}. */
export type MetricsReadSource = 'outbox' | 'log_slot' | 'inbox' | 'inbox_halts' | 'transport_dead_letters';

/** Creates the failure counter's series for `source` at 0 and returns the function that counts one failure. */
function readFailures(meter: Meter, attributes: Attributes, source: MetricsReadSource): () => void {
  const counter = meter.createCounter(METRICS_READ_FAILURES, { description: 'operator reads behind the gauges that failed (the gauges report nothing for that collection)' });
  const observed = { ...attributes, 'courier.metrics.source': source };
  counter.add(0, observed);
  return () => counter.add(1, observed);
}

/**
 * The optional operator members of an outbox that tails a replication slot (as
 * `PgLogicalOutboxStore` of `@courier/pg-logical` does): its slot's name, and the slot as the
 * server sees it (`undefined` when there is no such slot). Reading creates nothing. Detected
 * at runtime with {@link hasLogSlot}, so the CLI and the metrics need not depend on the plugin.
 */
export interface LogSlotOperations {
  readonly slot: string;
  slotStats(): Promise<
    | {
        readonly active: boolean;
        readonly activePid: number | null;
        /** WAL bytes the server keeps for the slot. */
        readonly lagBytes: number;
        readonly walStatus: string | null;
        /** How long nobody has read the slot (PostgreSQL 17+; null otherwise or while read). */
        readonly inactiveForMs?: number | null;
        /** In the reading process: how long the oldest received, not yet acknowledged transaction has waited (0 when none). */
        readonly unacknowledgedAgeMs?: number;
      }
    | undefined
  >;
}

/** Whether `outbox` has the {@link LogSlotOperations} members (a string `slot` and a `slotStats()` method). */
export function hasLogSlot(outbox: unknown): outbox is LogSlotOperations {
  if (typeof outbox !== 'object' || outbox === null) return false;
  const candidate = outbox as Partial<LogSlotOperations>;
  return typeof candidate.slot === 'string' && typeof candidate.slotStats === 'function';
}

/**
 * Registers the gauges of a log-tailing outbox's replication slot, with attribute
 * `courier.log_slot` (the slot's name): `courier.outbox.log_slot.lag_bytes` (bytes of WAL the
 * server keeps for the slot; it grows while nobody reads or acknowledges it, until the disk
 * fills) and `courier.outbox.log_slot.unacknowledged.age` (seconds the oldest transaction
 * received here has waited for its acknowledgement; meaningful in the process that reads
 * the slot, 0 elsewhere).
 *
 * Guarantees: `slotStats()` runs once per collection and only when a metrics SDK collects;
 * a failing one is logged, counted in {@link METRICS_READ_FAILURES} (source `log_slot`) and
 * reports nothing (never zeros). A slot that does not exist
 * reports nothing either (no WAL is held for it); nothing is created by reading. Returns a
 * function that unregisters the gauges; call it before closing the store.
 */
export function observeLogSlot(outbox: LogSlotOperations, options: ObserveOptions = {}): () => void {
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = { ...(options.attributes ?? {}), 'courier.log_slot': outbox.slot };
  const logger = options.logger ?? defaultLogger;
  const failed = readFailures(meter, attributes, 'log_slot');
  const lag = meter.createObservableGauge(OPERATOR_GAUGES.logSlotLag, { description: 'WAL bytes the server keeps for the log-tail replication slot (alert when it grows)', unit: 'By' });
  const age = meter.createObservableGauge(OPERATOR_GAUGES.logSlotUnacknowledgedAge, {
    description: 'age of the oldest transaction the log-tail relay received and has not yet acknowledged on its slot',
    unit: 's',
  });
  const callback = async (observer: { observe(instrument: typeof lag, value: number, attributes?: Attributes): void }): Promise<void> => {
    let stats;
    try {
      stats = await outbox.slotStats();
    } catch (error) {
      failed();
      logger.warn('log-tail slot stats for metrics failed', { slot: outbox.slot, error: describeError(error) });
      return;
    }
    if (!stats) return;
    observer.observe(lag, stats.lagBytes, attributes);
    observer.observe(age, (stats.unacknowledgedAgeMs ?? 0) / 1000, attributes);
  };
  const instruments = [lag, age];
  meter.addBatchObservableCallback(callback, instruments);
  return () => meter.removeBatchObservableCallback(callback, instruments);
}

/** Options of {@link observeOutbox} and {@link observeRelay}. */
export interface ObserveOptions {
  /** Defaults to the global meter provider's `@courier/core` meter (a no-op without an SDK). */
  readonly meter?: Meter;
  /** Added to every observation, e.g. `{ 'courier.outbox.name': 'orders' }` when a process watches several. */
  readonly attributes?: Attributes;
  /** Where a failed `stats()` is reported (the gauges then report nothing for that collection). Default `defaultLogger` (warn and error on stderr). */
  readonly logger?: Logger;
}

/**
 * Registers observable gauges over an outbox's operator half: pending rows, age of the
 * oldest due pending row (seconds), rows in flight (leased), dead rows and halted keys.
 *
 * Guarantees: `stats()` runs at most once per collection (all five gauges share it),
 * only when a metrics SDK collects (so with the no-op API it never runs), and a failing
 * `stats()` (database away) is logged and leaves that collection without values rather
 * than reporting zeros that would silence a backlog alert; each failure counts in
 * {@link METRICS_READ_FAILURES} (source `outbox`). Returns a function that
 * unregisters the gauges; call it before closing the store.
 */
export function observeOutbox(outbox: OutboxOperations, options: ObserveOptions = {}): () => void {
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = options.attributes ?? {};
  const logger = options.logger ?? defaultLogger;
  const failed = readFailures(meter, attributes, 'outbox');
  const pending = meter.createObservableGauge(OPERATOR_GAUGES.outboxPending, { description: 'outbox rows not yet published (due or not)' });
  const age = meter.createObservableGauge(OPERATOR_GAUGES.outboxOldestPendingAge, { description: 'age of the oldest due pending outbox row (database clock)', unit: 's' });
  const inFlight = meter.createObservableGauge(OPERATOR_GAUGES.outboxInFlight, { description: 'outbox rows claimed by a relay and awaiting the broker' });
  const dead = meter.createObservableGauge(OPERATOR_GAUGES.outboxDead, { description: 'dead outbox rows (never published; replay or purge them)' });
  const halted = meter.createObservableGauge(OPERATOR_GAUGES.outboxHaltedKeys, { description: 'keys halted by the poison-head policy (resume them)' });
  const callback = async (observer: {
    observe(instrument: typeof pending, value: number, attributes?: Attributes): void;
  }): Promise<void> => {
    let stats: OutboxStats;
    try {
      stats = await outbox.stats();
    } catch (error) {
      failed();
      logger.warn('outbox stats for metrics failed', { error: describeError(error) });
      return;
    }
    observer.observe(pending, stats.pending, attributes);
    observer.observe(age, stats.oldestPendingAgeMs / 1000, attributes);
    observer.observe(inFlight, stats.inFlight, attributes);
    observer.observe(dead, stats.dead, attributes);
    observer.observe(halted, stats.haltedKeys, attributes);
  };
  const instruments = [pending, age, inFlight, dead, halted];
  meter.addBatchObservableCallback(callback, instruments);
  return () => meter.removeBatchObservableCallback(callback, instruments);
}

/**
 * Registers the gauge `courier.inbox.halted_keys`: keys halted by ordered subscriptions
 * with `poison: 'halt'`, one observation per consumer that has any (attribute
 * `messaging.consumer.group.name`).
 *
 * Guarantees: `listHalted()` runs once per collection and only when a metrics SDK
 * collects; a failing one is logged, counted in {@link METRICS_READ_FAILURES} (source
 * `inbox_halts`) and leaves that collection without values (never zeros, which would clear
 * an alert while the database is away). A consumer whose keys
 * were all resumed and drained is no longer observed. Returns a function that unregisters
 * the gauge; call it before closing the store.
 */
export function observeInboxHalts(inbox: Pick<InboxHalts, 'listHalted'>, options: ObserveOptions = {}): () => void {
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = options.attributes ?? {};
  const logger = options.logger ?? defaultLogger;
  const failed = readFailures(meter, attributes, 'inbox_halts');
  const halted = meter.createObservableGauge(OPERATOR_GAUGES.inboxHaltedKeys, { description: "keys halted by ordered subscriptions with poison 'halt' (resume them)" });
  const callback = async (result: ObservableResult): Promise<void> => {
    let keys;
    try {
      keys = await inbox.listHalted({ limit: 100_000 });
    } catch (error) {
      failed();
      logger.warn('inbox halts for metrics failed', { error: describeError(error) });
      return;
    }
    const perConsumer = new Map<string, number>();
    for (const key of keys) perConsumer.set(key.consumer, (perConsumer.get(key.consumer) ?? 0) + 1);
    for (const [consumer, count] of perConsumer) result.observe(count, { ...attributes, 'messaging.consumer.group.name': consumer });
  };
  halted.addCallback(callback);
  return () => halted.removeCallback(callback);
}

/**
 * Registers the gauge `courier.relay.paused`: 1 while the bus's relay backs off because
 * its transport or store is unavailable, else 0 (also 0 when the relay does not run).
 * Reads `bus.health()` only, so it costs nothing between collections. Returns a function
 * that unregisters it.
 */
export function observeRelay(bus: Pick<Bus<unknown>, 'health'>, options: ObserveOptions = {}): () => void {
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = options.attributes ?? {};
  const paused = meter.createObservableGauge(OPERATOR_GAUGES.relayPaused, { description: '1 while the relay is paused by an unavailable transport or store' });
  const callback = (result: ObservableResult): void => {
    const relay = bus.health().relay;
    result.observe(relay.running && relay.paused ? 1 : 0, attributes);
  };
  paused.addCallback(callback);
  return () => paused.removeCallback(callback);
}

/** Options of {@link observeDeadLetters}. */
export interface ObserveDeadLettersOptions extends ObserveOptions {
  /** Most dead letters counted per consumer when the transport has no `count` (it lists); a larger depth reports this number. Default 10,000 (as `courier stats`). */
  readonly limit?: number;
  /**
   * Counts again at most this often (milliseconds); collections in between report the last
   * counts. Counting lists the dead letters (RabbitMQ reads through its dead-letter queue),
   * so a scrape every few seconds must not do it every time. Default 60,000.
   */
  readonly minIntervalMs?: number;
}

/**
 * Registers the gauge `courier.transport.dead_letters`: how many dead letters the
 * transport holds per consumer (attribute `messaging.consumer.group.name`), counted
 * through `deadLetters.count` where the transport has it (a depth read without taking any
 * message: RabbitMQ's passive queue declare), else `deadLetters.list` — the depth
 * `courier stats` shows. A transport keeps dead
 * letters per consumer and cannot list its consumers, so the caller names them.
 *
 * Guarantees: nothing is counted until a metrics SDK collects; then at most once per
 * `minIntervalMs`, one count at a time however many collections overlap, and the
 * collections in between report the last counts. A depth of `limit` or more reports
 * `limit` (an alert on "above zero" or "growing" still fires). A consumer whose count
 * fails (broker away) is logged, counted in {@link METRICS_READ_FAILURES} (source
 * `transport_dead_letters`) and reports nothing until a count succeeds, rather than a
 * zero that would silence an alert. Returns a function that unregisters the gauge.
 */
export function observeDeadLetters(
  deadLetters: Pick<TransportDeadLetters, 'list' | 'count'>,
  consumers: readonly string[],
  options: ObserveDeadLettersOptions = {},
): () => void {
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = options.attributes ?? {};
  const logger = options.logger ?? defaultLogger;
  const limit = options.limit ?? 10_000;
  const minIntervalMs = options.minIntervalMs ?? 60_000;
  const failed = readFailures(meter, attributes, 'transport_dead_letters');
  const depth = meter.createObservableGauge(OPERATOR_GAUGES.transportDeadLetters, {
    description: 'dead letters the transport holds per consumer (replay or purge them with `courier dead`)',
  });
  let counts = new Map<string, number>();
  let countedAt = -Infinity;
  let counting: Promise<void> | undefined;
  const count = async (): Promise<void> => {
    const next = new Map<string, number>();
    await Promise.all(
      consumers.map(async (consumer) => {
        try {
          // `count` reads a depth without taking messages; `list` is the fallback for a transport without it.
          next.set(consumer, deadLetters.count ? await deadLetters.count(consumer) : Math.min(limit, (await deadLetters.list(consumer, { limit })).length));
        } catch (error) {
          failed();
          logger.warn('transport dead-letter count for metrics failed', { consumer, error: describeError(error) });
        }
      }),
    );
    counts = next;
    countedAt = performance.now();
  };
  const callback = async (result: ObservableResult): Promise<void> => {
    if (performance.now() - countedAt >= minIntervalMs) {
      counting ??= count().finally(() => {
        counting = undefined;
      });
      await counting;
    }
    for (const [consumer, value] of counts) result.observe(value, { ...attributes, 'messaging.consumer.group.name': consumer });
  };
  depth.addCallback(callback);
  return () => depth.removeCallback(callback);
}

/** Options of {@link observeInbox}. */
export interface ObserveInboxOptions extends ObserveOptions {
  /**
   * Reads `stats()` again at most this often (milliseconds); collections in between report
   * the last values. A store may count every inbox record to answer, so a scrape every few
   * seconds must not do it every time. Default 60,000.
   */
  readonly minIntervalMs?: number;
}

/**
 * Registers gauges over an inbox store's optional `stats()`, one observation per consumer
 * (attribute `messaging.consumer.group.name`): `courier.inbox.dead_letters` (messages the
 * consumer dead-lettered whose mark is still in the inbox: alert when it grows),
 * `courier.inbox.records` (its deduplication window) and `courier.inbox.oldest_record.age`
 * (seconds; how far back duplicates are recognised, bounded by prune).
 *
 * Guarantees: nothing is read until a metrics SDK collects; then `stats()` runs at most
 * once per `minIntervalMs`, one read at a time however many collections overlap, and the
 * collections in between report the last values. A failing read (database away) is logged,
 * counted in {@link METRICS_READ_FAILURES} (source `inbox`) and reports nothing until one succeeds (the next collection reads again), never zeros that would clear an alert. Throws a
 * `TypeError` naming the remedy when the store has no `stats()`. Returns a function that
 * unregisters the gauges; call it before closing the store.
 */
export function observeInbox(inbox: Pick<InboxOperations, 'stats'>, options: ObserveInboxOptions = {}): () => void {
  if (typeof inbox.stats !== 'function') {
    throw new TypeError('observeInbox: this inbox store has no stats() (an optional operator member); use a store that has it, or observe only its halts (observeInboxHalts)');
  }
  const read = inbox.stats.bind(inbox);
  const meter = options.meter ?? metrics.getMeter(INSTRUMENTATION);
  const attributes = options.attributes ?? {};
  const logger = options.logger ?? defaultLogger;
  const minIntervalMs = options.minIntervalMs ?? 60_000;
  const failed = readFailures(meter, attributes, 'inbox');
  const dead = meter.createObservableGauge(OPERATOR_GAUGES.inboxDeadLetters, {
    description: 'messages a consumer dead-lettered whose mark is still in the inbox (replay them with `courier dead`)',
  });
  const records = meter.createObservableGauge(OPERATOR_GAUGES.inboxRecords, { description: "inbox records of a consumer (its deduplication window)" });
  const age = meter.createObservableGauge(OPERATOR_GAUGES.inboxOldestRecordAge, { description: "age of a consumer's oldest inbox record (database clock)", unit: 's' });
  let last: InboxStats | undefined;
  let readAt = -Infinity;
  let reading: Promise<void> | undefined;
  const refresh = async (): Promise<void> => {
    try {
      last = await read();
      readAt = performance.now();
    } catch (error) {
      // Nothing reported, and the next collection reads again.
      last = undefined;
      readAt = -Infinity;
      failed();
      logger.warn('inbox stats for metrics failed', { error: describeError(error) });
    }
  };
  const callback = async (observer: { observe(instrument: typeof dead, value: number, attributes?: Attributes): void }): Promise<void> => {
    if (performance.now() - readAt >= minIntervalMs) {
      reading ??= refresh().finally(() => {
        reading = undefined;
      });
      await reading;
    }
    for (const consumer of last?.consumers ?? []) {
      const observed = { ...attributes, 'messaging.consumer.group.name': consumer.consumer };
      observer.observe(dead, consumer.deadLetters, observed);
      observer.observe(records, consumer.records, observed);
      observer.observe(age, consumer.oldestRecordAgeMs / 1000, observed);
    }
  };
  const instruments = [dead, records, age];
  meter.addBatchObservableCallback(callback, instruments);
  return () => meter.removeBatchObservableCallback(callback, instruments);
}
