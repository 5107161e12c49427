import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  createTraceState,
  isSpanContextValid,
  metrics,
  trace,
  type Context,
  type Counter,
  type Link,
  type Meter,
  type Tracer,
} from '@opentelemetry/api';
import type { Envelope } from './envelope.js';
import { describeError } from './errors.js';

const INSTRUMENTATION = '@courier/core';

/** W3C trace context fields as the envelope carries them. */
export interface TraceFields {
  readonly traceparent: string | null;
  readonly tracestate: string | null;
}

/** The fields of a message written outside any trace: one frozen object, shared. */
const NO_TRACE: TraceFields = Object.freeze({ traceparent: null, tracestate: null });

/**
 * Creates the producer span of a message being written, as a child of the active
 * context, and returns its W3C fields. With the no-op API (no SDK registered) and no
 * active span this returns nulls and costs almost nothing.
 */
export function captureTrace(tracer: Tracer, type: string, topic: string, messageId: string): TraceFields {
  const active = context.active();
  const parent = trace.getSpanContext(active);
  if (parent === undefined || !isSpanContextValid(parent)) {
    // No trace to continue: starting a root span for every write would flood tracing
    // backends with one-span traces, so a message without a parent carries none.
    return NO_TRACE;
  }
  const span = tracer.startSpan(
    `${topic} create`,
    {
      kind: SpanKind.PRODUCER,
      attributes: { 'messaging.system': 'courier', 'messaging.destination.name': topic, 'messaging.message.id': messageId, 'courier.type': type },
    },
    active,
  );
  const spanContext = span.spanContext();
  span.end();
  if (!isSpanContextValid(spanContext)) return NO_TRACE;
  const flags = (spanContext.traceFlags & 0xff).toString(16).padStart(2, '0');
  return {
    traceparent: `00-${spanContext.traceId}-${spanContext.spanId}-${flags}`,
    tracestate: spanContext.traceState?.serialize() || null,
  };
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** Rebuilds the producer's context from an envelope, or the root context when it has none. */
export function extractTrace(envelope: Pick<Envelope, 'traceparent' | 'tracestate'>): Context {
  const match = envelope.traceparent ? TRACEPARENT.exec(envelope.traceparent) : null;
  if (!match) return ROOT_CONTEXT;
  const spanContext = {
    traceId: match[2]!,
    spanId: match[3]!,
    traceFlags: Number.parseInt(match[4]!, 16),
    isRemote: true,
    ...(envelope.tracestate ? { traceState: createTraceState(envelope.tracestate) } : {}),
  };
  if (!isSpanContextValid(spanContext)) return ROOT_CONTEXT;
  return trace.setSpanContext(ROOT_CONTEXT, spanContext);
}

/** Links from a relay batch span to each message's producer span. */
export function traceLinks(envelopes: readonly Envelope[]): Link[] {
  const links: Link[] = [];
  for (const envelope of envelopes) {
    const spanContext = trace.getSpanContext(extractTrace(envelope));
    if (spanContext) links.push({ context: spanContext });
  }
  return links;
}

/** Runs `work` inside a span, recording an exception and error status when it throws. */
export async function inSpan<T>(
  tracer: Tracer,
  name: string,
  options: { kind: SpanKind; parent: Context; attributes?: Record<string, string | number>; links?: Link[] },
  work: () => Promise<T>,
): Promise<T> {
  const span = tracer.startSpan(name, { kind: options.kind, attributes: options.attributes ?? {}, links: options.links ?? [] }, options.parent);
  try {
    return await context.with(trace.setSpan(options.parent, span), work);
  } catch (error) {
    span.recordException(error instanceof Error ? error : new Error(String(error)));
    span.setStatus({ code: SpanStatusCode.ERROR, message: describeError(error) });
    throw error;
  } finally {
    span.end();
  }
}

/** A counter that keeps its own total (for `bus.health()`) and feeds an OpenTelemetry counter. */
export class CountingCounter {
  #total = 0;
  readonly #counter: Counter;

  constructor(counter: Counter) {
    this.#counter = counter;
  }

  get total(): number {
    return this.#total;
  }

  add(value: number, attributes?: Record<string, string>): void {
    this.#total += value;
    this.#counter.add(value, attributes);
  }
}

/** The counters the engine records, backed by OpenTelemetry metrics (no-op unless an SDK is registered). */
export class Instruments {
  readonly published: CountingCounter;
  readonly publishFailures: CountingCounter;
  readonly relayPauses: CountingCounter;
  readonly processed: CountingCounter;
  readonly retries: CountingCounter;
  readonly deadLettered: CountingCounter;
  readonly duplicates: CountingCounter;
  readonly haltedKeys: CountingCounter;
  /** Keys an ordered subscription halted (`poison: 'halt'`); counted in the snapshot's `haltedKeys` too. */
  readonly consumerHaltedKeys: CountingCounter;
  readonly ackFailures: CountingCounter;
  readonly settleFailures: CountingCounter;

  constructor(meter: Meter = metrics.getMeter(INSTRUMENTATION)) {
    const counter = (name: string, description: string) => new CountingCounter(meter.createCounter(name, { description }));
    this.published = counter('courier.relay.published', 'messages confirmed by the broker and completed');
    this.publishFailures = counter('courier.relay.failures', 'per-message publish failures');
    this.relayPauses = counter('courier.relay.pauses', 'times the relay paused for an unavailable transport or store');
    this.processed = counter('courier.consumer.processed', 'messages handled and committed');
    this.retries = counter('courier.consumer.retries', 'handler failures scheduled for retry');
    this.deadLettered = counter('courier.dead_lettered', 'messages dead-lettered by the relay or a consumer');
    this.duplicates = counter('courier.consumer.duplicates', 'redeliveries suppressed by the inbox');
    this.haltedKeys = counter('courier.relay.halted_keys', 'keys halted by the poison-head policy');
    this.consumerHaltedKeys = counter('courier.consumer.halted_keys', "keys an ordered subscription halted (poison 'halt')");
    this.ackFailures = counter('courier.consumer.ack_failures', 'acknowledgements that failed after the inbox recorded the message (the broker redelivers it; the inbox drops that copy)');
    this.settleFailures = counter('courier.consumer.settle_failures', 'retry and dead-letter settles the transport failed (the message is asked back later and given up on or retried again)');
  }

  /**
   * Adds 0 to the relay's counters, so their series exist from the relay's start: a
   * Prometheus `increase()` over a series whose first sample is already 1 sees no increase,
   * so without this the first failure after a deploy would never alert. Counters recorded
   * with per-event attributes (failures per topic and code) get their series at the first
   * event; the alert rules read those with `rate() > 0 for:` instead.
   */
  primeRelay(): void {
    for (const counter of [this.published, this.relayPauses, this.deadLettered, this.haltedKeys]) counter.add(0);
  }

  /** Adds 0 to the consumer counters of `consumer` (attribute `messaging.consumer.group.name`), for the same reason as {@link primeRelay}. */
  primeConsumer(consumer: string): void {
    const attributes = { 'messaging.consumer.group.name': consumer };
    for (const counter of [this.processed, this.retries, this.deadLettered, this.duplicates, this.consumerHaltedKeys, this.ackFailures, this.settleFailures]) counter.add(0, attributes);
  }

  /** Totals since this bus was created. */
  snapshot(): {
    published: number; publishFailures: number; relayPauses: number; processed: number;
    retries: number; deadLettered: number; duplicates: number; haltedKeys: number; ackFailures: number; settleFailures: number;
  } {
    return {
      published: this.published.total,
      publishFailures: this.publishFailures.total,
      relayPauses: this.relayPauses.total,
      processed: this.processed.total,
      retries: this.retries.total,
      deadLettered: this.deadLettered.total,
      duplicates: this.duplicates.total,
      haltedKeys: this.haltedKeys.total + this.consumerHaltedKeys.total,
      ackFailures: this.ackFailures.total,
      settleFailures: this.settleFailures.total,
    };
  }
}

/** The tracer Courier uses unless one is injected. */
export function defaultTracer(): Tracer {
  return trace.getTracer(INSTRUMENTATION);
}

export { SpanKind };
