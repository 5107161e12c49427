// The relay's and consumers' counters as an alert reads them, through the real metrics SDK:
// they exist at 0 from the start (so increase() sees the first event), a database outage
// counts as a pause like a broker outage (with its cause), publish failures carry the topic
// and the error code, failed attempts are logged at warn (rate-limited per topic), and the
// publish duration carries no batch-size attribute (a histogram of its own instead).
import { metrics as otelMetrics, type Attributes } from '@opentelemetry/api';
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader, type MetricData } from '@opentelemetry/sdk-metrics';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BATCH_SIZE_HISTOGRAM, DURATION_HISTOGRAMS, defineMessage, type Logger } from '@courier/core';
import { eventually, harness } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

let exporter: InMemoryMetricExporter;
let reader: PeriodicExportingMetricReader;
let provider: MeterProvider;

beforeEach(() => {
  exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  provider = new MeterProvider({ readers: [reader] });
  expect(otelMetrics.setGlobalMeterProvider(provider)).toBe(true);
});
afterEach(async () => {
  otelMetrics.disable();
  await provider.shutdown();
});

async function collect(): Promise<MetricData[]> {
  exporter.reset();
  await reader.forceFlush();
  return exporter.getMetrics().flatMap((resource) => resource.scopeMetrics.flatMap((scope) => scope.metrics));
}

async function points(name: string): Promise<{ attributes: Attributes; value: unknown }[]> {
  const metric = (await collect()).find((candidate) => candidate.descriptor.name === name);
  return (metric?.dataPoints ?? []).map((point) => ({ attributes: point.attributes, value: point.value }));
}

function recordingLogger(): Logger & { readonly lines: { level: string; message: string; fields: Record<string, unknown> }[] } {
  const lines: { level: string; message: string; fields: Record<string, unknown> }[] = [];
  const at = (level: string) => (message: string, fields?: Readonly<Record<string, unknown>>) => lines.push({ level, message, fields: { ...fields } });
  return { lines, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

describe('relay and consumer counters', () => {
  it('exist at 0 once the bus starts, per consumer for the consumer counters', async () => {
    await using h = harness();
    h.bus.subscribe('billing', Placed, async () => undefined);
    await h.bus.start();
    for (const name of ['courier.relay.published', 'courier.relay.pauses', 'courier.relay.halted_keys']) {
      expect(await points(name), name).toEqual([{ attributes: {}, value: 0 }]);
    }
    for (const name of ['courier.consumer.processed', 'courier.consumer.retries', 'courier.consumer.duplicates', 'courier.consumer.halted_keys']) {
      expect(await points(name), name).toEqual([{ attributes: { 'messaging.consumer.group.name': 'billing' }, value: 0 }]);
    }
    expect(await points('courier.dead_lettered')).toEqual(
      expect.arrayContaining([
        { attributes: {}, value: 0 },
        { attributes: { 'messaging.consumer.group.name': 'billing' }, value: 0 },
      ]),
    );
  });

  it('count a database outage as a pause, with its cause', async () => {
    await using h = harness();
    h.db.setAvailable(false);
    await h.bus.start();
    await eventually(() => expect(h.bus.health().counters.relayPauses).toBeGreaterThanOrEqual(1));
    expect(await points('courier.relay.pauses')).toContainEqual({ attributes: { 'courier.pause.cause': 'store' }, value: expect.any(Number) });
    h.db.setAvailable(true);
  });

  it('label publish failures with topic and error code, and log failed attempts at warn, at most once per topic per 10 s', async () => {
    const logger = recordingLogger();
    await using h = harness({ bus: { logger, relay: { retry: { maxAttempts: 3, initialDelayMs: 1, multiplier: 1, maxDelayMs: 1, jitter: 0 } } } });
    h.broker.failPublish((envelope) => envelope.payload.includes('"poison"'));
    await h.bus.start();
    await h.commit((tx) => {
      for (let index = 0; index < 3; index += 1) h.bus.outbox(tx).publish(Placed, { id: 'poison', index });
    });
    await eventually(async () => expect(await h.outbox.listDead()).toHaveLength(3));
    const failures = await points('courier.relay.failures');
    expect(failures).toEqual([{ attributes: { 'messaging.destination.name': 'orders', 'error.type': 'PUBLISH_REJECTED' }, value: 9 }]);
    // Six retried attempts within milliseconds: one warning for the topic, the rest counted into the next one.
    const warned = logger.lines.filter((line) => line.message === 'publish attempt failed; retrying');
    expect(warned).toHaveLength(1);
    expect(warned[0]!.level).toBe('warn');
    expect(warned[0]!.fields).toMatchObject({ topic: 'orders', attempt: 1, maxAttempts: 3, error: expect.stringContaining('PUBLISH_REJECTED') });
    expect(logger.lines.filter((line) => line.message === 'relay dead-lettered a message')).toHaveLength(3);
  });

  it('record the batch size as a histogram of its own, not as an attribute of the publish duration', async () => {
    await using h = harness();
    h.bus.subscribe('billing', Placed, async () => undefined);
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, {});
      h.bus.outbox(tx).publish(Placed, {});
    });
    await eventually(() => expect(h.bus.health().counters.processed).toBe(2));
    const metrics = await collect();
    const duration = metrics.find((metric) => metric.descriptor.name === DURATION_HISTOGRAMS.publish)!;
    expect(duration.dataPoints.every((point) => !('messaging.batch.message_count' in point.attributes))).toBe(true);
    const sizes = metrics.find((metric) => metric.descriptor.name === BATCH_SIZE_HISTOGRAM)!;
    expect(sizes.dataPoints.reduce((sum, point) => sum + (point.value as { sum: number }).sum, 0)).toBe(2);
  });
});
