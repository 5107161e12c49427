import { metrics, type Histogram, type Meter } from '@opentelemetry/api';
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
} as const;

/** The histograms, created once per bus on the global (or given) meter; no-ops without an SDK. */
export class DurationHistograms {
  readonly publish: Histogram;
  readonly process: Histogram;
  readonly deliveryToAck: Histogram;
  readonly commitToConfirm: Histogram;

  constructor(meter: Meter = metrics.getMeter(INSTRUMENTATION)) {
    this.publish = meter.createHistogram(DURATION_HISTOGRAMS.publish, { unit: 's', description: 'publish call until the broker answered for every message (publisher confirm)' });
    this.process = meter.createHistogram(DURATION_HISTOGRAMS.process, { unit: 's', description: 'handler run time' });
    this.deliveryToAck = meter.createHistogram(DURATION_HISTOGRAMS.deliveryToAck, { unit: 's', description: 'delivery handed to the consumer until acknowledged' });
    this.commitToConfirm = meter.createHistogram(DURATION_HISTOGRAMS.commitToConfirm, {
      unit: 's',
      description: 'outbox row due (its insert, or its delay/notBefore) until the broker confirmed it',
    });
  }
}

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
            'messaging.batch.message_count': messages.length,
            'courier.outcome': outcome,
          });
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
