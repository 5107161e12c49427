import { SpanKind, context, trace, type SpanContext } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { defineMessage, type Envelope } from '@courier/core';
import { eventually, harness } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

let exporter: InMemorySpanExporter;

beforeEach(() => {
  exporter = new InMemorySpanExporter();
  expect(trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }))).toBe(true);
  expect(context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())).toBe(true);
});

afterEach(() => {
  trace.disable();
  context.disable();
});

const spans = (name: string): ReadableSpan[] => exporter.getFinishedSpans().filter((span) => span.name === name);

describe('telemetry', () => {
  it("stores the producer's trace context, and runs the handler in a span whose parent is the message's create span", async () => {
    await using h = harness();
    const tracer = trace.getTracer('test');
    const received: { envelope: Envelope; active: SpanContext | undefined; child: SpanContext }[] = [];
    h.bus.subscribe('billing', Placed, async (_message, ctx) => {
      const child = tracer.startSpan('charge card');
      child.end();
      received.push({ envelope: ctx.envelope, active: trace.getActiveSpan()?.spanContext(), child: child.spanContext() });
    });
    await h.bus.start();

    let messageId = '';
    const checkout = await tracer.startActiveSpan('checkout', async (span) => {
      await h.commit((tx) => {
        messageId = h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
      });
      span.end();
      return span.spanContext();
    });

    await eventually(() => expect(received).toHaveLength(1));
    const [create] = spans('orders create');
    expect(create).toBeDefined();
    expect(create!.kind).toBe(SpanKind.PRODUCER);
    expect(create!.spanContext().traceId).toBe(checkout.traceId);
    expect(create!.parentSpanContext?.spanId).toBe(checkout.spanId);
    expect(create!.attributes).toMatchObject({ 'messaging.message.id': messageId, 'courier.type': 'orders.OrderPlaced' });

    const { envelope, active, child } = received[0]!;
    expect(envelope.traceparent).toBe(`00-${checkout.traceId}-${create!.spanContext().spanId}-01`);

    await eventually(() => expect(spans('orders process')).toHaveLength(1));
    const [process] = spans('orders process');
    expect(process!.kind).toBe(SpanKind.CONSUMER);
    expect(process!.spanContext().traceId).toBe(checkout.traceId);
    expect(process!.parentSpanContext?.spanId).toBe(create!.spanContext().spanId);
    expect(process!.parentSpanContext?.isRemote).toBe(true);
    expect(process!.attributes).toMatchObject({ 'messaging.consumer.group.name': 'billing', 'messaging.message.id': messageId, 'courier.attempt': 1 });

    // Inside the handler the process span is active, so the user's spans nest under it.
    expect(active?.spanId).toBe(process!.spanContext().spanId);
    const [charge] = spans('charge card');
    expect(charge!.spanContext()).toEqual(child);
    expect(charge!.parentSpanContext?.spanId).toBe(process!.spanContext().spanId);
    expect(child.traceId).toBe(checkout.traceId);

    // The relay's batch span links to the message's create span rather than adopting it.
    await eventually(() => expect(spans('courier relay publish').length).toBeGreaterThan(0));
    const relaySpan = spans('courier relay publish').find((span) => span.links.length > 0);
    expect(relaySpan?.links.map((link) => link.context.spanId)).toEqual([create!.spanContext().spanId]);
  });

  it('publishes without trace context, and handles in a root span, when no span is active', async () => {
    await using h = harness();
    const received: Envelope[] = [];
    h.bus.subscribe('billing', Placed, async (_message, ctx) => {
      received.push(ctx.envelope);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(received).toHaveLength(1));
    expect(received[0]).toMatchObject({ traceparent: null, tracestate: null });
    expect(spans('orders create')).toEqual([]);
    await eventually(() => expect(spans('orders process')).toHaveLength(1));
    expect(spans('orders process')[0]!.parentSpanContext).toBeUndefined();
  });

  it('records a failing handler on its span as an error, once per attempt', async () => {
    await using h = harness({ bus: { retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1 } } });
    h.bus.subscribe('billing', Placed, async () => {
      throw new Error('declined');
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(spans('orders process')).toHaveLength(2));
    for (const span of spans('orders process')) {
      expect(span.status).toMatchObject({ code: 2, message: expect.stringContaining('declined') });
      expect(span.events.map((event) => event.name)).toContain('exception');
    }
    expect(spans('orders process').map((span) => span.attributes['courier.attempt'])).toEqual([1, 2]);
  });
});
