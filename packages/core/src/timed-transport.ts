import { metrics, type Histogram, type Meter } from '@opentelemetry/api';
import { OPERATOR_GAUGES } from './operator-metrics.js';
import type { Transport } from './transport.js';

const INSTRUMENTATION = '@courier/core';

/** Names of the duration histograms the bus records (seconds); the operations guide documents each. */
export const DURATION_HISTOGRAMS = {
  /** OpenTelemetry messaging semantic conventions: a publish call, sent → every broker answer. */
  publish: 'messaging.client.operation.duration',
  /** OpenTelemetry messaging semantic conventions: a handler run. */
  process: 'messaging.process.duration',
  /** Courier: a delivery handed to the core → its acknowledgement (inbox, handler, commit, ack). */
  deliveryToAck: 'courier.consumer.delivery_to_ack.duration',
  /**
   * Courier (the semantic conventions have no end-to-end publish latency): an outbox row
   * due → the broker's confirm of it, per message, recorded by the relay.
   */
  commitToConfirm: 'courier.relay.commit_to_confirm.duration',
  /**
   * Courier: the envelope's `occurredAt` → the first start of the handler, per message and
   * consumer, recorded by the consumer on the first attempt of a first delivery (not a
   * retry, a crash redelivery, a replay or a halted key's drain). `occurredAt` is the
   * `publish()` call inside the producer's transaction unless the producer set it, so this
   * is commit → handler plus the rest of that transaction; it compares the producer's clock
   * with the consumer's (a negative difference is recorded as 0).
   */
  occurredToHandler: 'courier.consumer.occurred_to_handler.duration',
} as const;

/**
 * Bucket boundaries (seconds) the messaging semantic conventions recommend for their
 * duration histograms. Without this advice an SDK uses its default boundaries (0–10,000,
 * meant for milliseconds), which put every sub-5-second duration in one bucket.
 */
const MESSAGING_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];
/** Messages per publish call: a relay batch is at most `relay.batchSize` (500 by default). */
const BATCH_SIZE_BUCKETS = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000];
/** Publish latency can run into minutes while a relay is behind: the same, plus longer ones. */
const LATENCY_BUCKETS_S = [...MESSAGING_BUCKETS_S, 30, 60, 300, 900];

/**
 * A histogram's attributes per destination topic, built once per topic and shared after:
 * the sites that record per message (the relay's confirms, the consumer's acks) are hot,
 * and an attribute object per message is garbage an SDK-less process makes for nothing.
 */
export class TopicAttributes {
  readonly #base: Readonly<Record<string, string>>;
  readonly #byTopic = new Map<string, Readonly<Record<string, string>>>();

  constructor(base: Readonly<Record<string, string>>) {
    this.#base = base;
  }

  /** `base` plus `messaging.destination.name: topic`; the same object for the same topic. */
  of(topic: string): Readonly<Record<string, string>> {
    let attributes = this.#byTopic.get(topic);
    if (!attributes) {
      attributes = Object.freeze({ ...this.#base, 'messaging.destination.name': topic });
      this.#byTopic.set(topic, attributes);
    }
    return attributes;
  }
}

/** The histograms, created once per bus on the global (or given) meter; no-ops without an SDK. */
export class DurationHistograms {
  readonly publish: Histogram;
  readonly process: Histogram;
  readonly deliveryToAck: Histogram;
  readonly commitToConfirm: Histogram;
  readonly occurredToHandler: Histogram;
  /**
   * Messages per publish call (`courier.publish.batch.size`). A histogram rather than the
   * `messaging.batch.message_count` attribute on the duration: as an attribute every batch
   * size made a series of its own (up to `batchSize` × buckets × outcomes).
   */
  readonly batchSize: Histogram;

  constructor(meter: Meter = metrics.getMeter(INSTRUMENTATION)) {
    this.publish = meter.createHistogram(DURATION_HISTOGRAMS.publish, {
      unit: 's',
      description: 'publish call until the broker answered for every message (publisher confirm)',
      advice: { explicitBucketBoundaries: MESSAGING_BUCKETS_S },
    });
    this.process = meter.createHistogram(DURATION_HISTOGRAMS.process, { unit: 's', description: 'handler run time', advice: { explicitBucketBoundaries: MESSAGING_BUCKETS_S } });
    this.deliveryToAck = meter.createHistogram(DURATION_HISTOGRAMS.deliveryToAck, {
      unit: 's',
      description: 'delivery handed to the consumer until acknowledged',
      advice: { explicitBucketBoundaries: MESSAGING_BUCKETS_S },
    });
    this.commitToConfirm = meter.createHistogram(DURATION_HISTOGRAMS.commitToConfirm, {
      unit: 's',
      description: 'outbox row due (its insert, or its delay/notBefore) until the broker confirmed it',
      advice: { explicitBucketBoundaries: LATENCY_BUCKETS_S },
    });
    this.occurredToHandler = meter.createHistogram(DURATION_HISTOGRAMS.occurredToHandler, {
      unit: 's',
      description: "envelope occurredAt (the producer's publish call, its clock) until the handler's first start (the consumer's clock)",
      advice: { explicitBucketBoundaries: LATENCY_BUCKETS_S },
    });
    this.batchSize = meter.createHistogram(BATCH_SIZE_HISTOGRAM, {
      unit: '{message}',
      description: 'messages per publish call',
      advice: { explicitBucketBoundaries: BATCH_SIZE_BUCKETS },
    });
  }
}

/** Name of the histogram of messages per publish call. */
export const BATCH_SIZE_HISTOGRAM = 'courier.publish.batch.size';
const PUBLISH_ATTRIBUTES = Object.freeze({ 'messaging.system': 'courier', 'messaging.operation.type': 'send' });

/**
 * Renames for a Prometheus exporter: OpenTelemetry keeps the unit beside the name (`unit: 's'`),
 * Prometheus wants it in the name (`_seconds`), and the exporter this repository uses
 * does not add it. Pass these as `views` to the `MeterProvider` that feeds a Prometheus
 * exporter (`courier relay` and `serveCourierMetrics` do), so durations and ages read
 * `messaging_client_operation_duration_seconds`, `courier_outbox_oldest_pending_age_seconds`.
 * Plain objects, the shape of `@opentelemetry/sdk-metrics`' `ViewOptions`, so the core needs
 * no SDK; an OTLP pipeline keeps the semantic-convention names by not passing them.
 */
export const PROMETHEUS_VIEWS: readonly { readonly instrumentName: string; readonly name: string }[] = Object.freeze(
  [...Object.values(DURATION_HISTOGRAMS), OPERATOR_GAUGES.outboxOldestPendingAge, OPERATOR_GAUGES.inboxOldestRecordAge, OPERATOR_GAUGES.logSlotUnacknowledgedAge].map((name) =>
    Object.freeze({ instrumentName: name, name: `${name}_seconds` }),
  ),
);

const seconds = (startedAt: number): number => (performance.now() - startedAt) / 1000;

/**
 * Wraps a transport so that publish calls are timed, and otherwise passes everything
 * through unchanged (results, errors, capabilities, deliveries, the optional members).
 * Delivery → ack is recorded by the consumer at its ack site (`deliveryToAck`).
 * Recording never throws into the caller: the API's instruments don't.
 */
export function timedTransport(transport: Transport, histograms: DurationHistograms): Transport {
  return {
    capabilities: transport.capabilities,
    async publish(messages, options) {
      const startedAt = performance.now();
      let outcome = 'ok';
      try {
        const results = await transport.publish(messages, options);
        if (results.some((result) => !result.ok)) outcome = 'partial';
        return results;
      } catch (error) {
        outcome = 'error';
        throw error;
      } finally {
        if (messages.length > 0) {
          histograms.publish.record(seconds(startedAt), {
            'messaging.system': 'courier',
            'messaging.operation.type': 'send',
            'messaging.operation.name': 'publish',
            'courier.outcome': outcome,
          });
          histograms.batchSize.record(messages.length, PUBLISH_ATTRIBUTES);
        }
      }
    },
    // Deliveries pass through untouched: the consumer records delivery → ack where it
    // acknowledges, so no second Delivery object is built per message.
    subscribe: (endpoint, handler) => transport.subscribe(endpoint, handler),
    close: () => transport.close(),
    ...(transport.validate ? { validate: transport.validate.bind(transport) } : {}),
    ...(transport.deadLetters ? { deadLetters: transport.deadLetters } : {}),
    ...(transport.limits ? { limits: transport.limits } : {}),
  };
}

/** Wraps a handler so that each run's duration is recorded as `messaging.process.duration`, failures included. */
export function timedHandler<A extends unknown[]>(
  handler: (...args: A) => Promise<void>,
  histograms: DurationHistograms,
  attributes: Readonly<Record<string, string>>,
): (...args: A) => Promise<void> {
  return async (...args: A) => {
    const startedAt = performance.now();
    let outcome = 'ok';
    try {
      await handler(...args);
    } catch (error) {
      outcome = 'error';
      throw error;
    } finally {
      histograms.process.record(seconds(startedAt), { ...attributes, 'courier.outcome': outcome });
    }
  };
}
