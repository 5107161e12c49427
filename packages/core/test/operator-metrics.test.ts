// The operator gauges, read through the real OpenTelemetry metrics SDK and its in-memory
// exporter: values come from the outbox's stats at collection time, a failing stats()
// reports nothing (never zeros), and the relay-paused gauge follows bus.health().
import { metrics as otelMetrics } from '@opentelemetry/api';
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader, type GaugeMetricData, type HistogramMetricData } from '@opentelemetry/sdk-metrics';
import { afterEach, describe, expect, it } from 'vitest';
import { defineMessage, DURATION_HISTOGRAMS, InMemoryOutboxStore, METRICS_READ_FAILURES, UnrecoverableError, hasLogSlot, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, newMessageId, observeDeadLetters, observeInbox, observeInboxHalts, observeLogSlot, observeOutbox, observeRelay, OPERATOR_GAUGES, type Logger, type OutboxOperations, type TransportDeadLetters } from '@courier/core';
import { eventually, harness } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

const providers: MeterProvider[] = [];
afterEach(async () => {
  await Promise.all(providers.splice(0).map((provider) => provider.shutdown()));
});

function sdk() {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
  const provider = new MeterProvider({ readers: [reader] });
  providers.push(provider);
  return {
    meter: provider.getMeter('test'),
    /** Collects once and returns the last value of each gauge by name. */
    async read(): Promise<Record<string, number>> {
      exporter.reset();
      await reader.forceFlush();
      const values: Record<string, number> = {};
      for (const resource of exporter.getMetrics()) {
        for (const scope of resource.scopeMetrics) {
          for (const metric of scope.metrics as GaugeMetricData[]) {
            const point = metric.dataPoints.at(-1);
            if (point) values[metric.descriptor.name] = point.value;
          }
        }
      }
      return values;
    },
    /** Collects once and returns `name`'s points as `[attribute value of key, value]`, sorted. */
    async points(name: string, key: string): Promise<[unknown, number][]> {
      exporter.reset();
      await reader.forceFlush();
      const found: [unknown, number][] = [];
      for (const resource of exporter.getMetrics()) {
        for (const scope of resource.scopeMetrics) {
          for (const metric of scope.metrics as GaugeMetricData[]) {
            if (metric.descriptor.name !== name) continue;
            for (const point of metric.dataPoints) found.push([point.attributes[key], point.value]);
          }
        }
      }
      return found.sort((a, b) => String(a[0]).localeCompare(String(b[0])));
    },
  };
}

function pick(outbox: OutboxOperations): OutboxOperations {
  return {
    stats: () => outbox.stats(),
    prune: (olderThanMs, options) => outbox.prune(olderThanMs, options),
    listDead: (options) => outbox.listDead(options),
    replay: (sequences) => outbox.replay(sequences),
    purge: (sequences) => outbox.purge(sequences),
    listHalted: (options) => outbox.listHalted(options),
    resume: (topic, key, action) => outbox.resume(topic, key, action),
  };
}

describe('operator gauges', () => {
  it('report the outbox stats at collection time, with the given attributes', async () => {
    await using h = harness();
    const metrics = sdk();
    let calls = 0;
    const counted: OutboxOperations = { ...pick(h.outbox), stats: () => ((calls += 1), h.outbox.stats()) };
    const stop = observeOutbox(counted, { meter: metrics.meter, attributes: { 'courier.outbox.name': 'orders' } });
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-2' }, { key: 'k' });
    });
    const values = await metrics.read();
    expect(values).toMatchObject({
      [OPERATOR_GAUGES.outboxPending]: 2,
      [OPERATOR_GAUGES.outboxInFlight]: 0,
      [OPERATOR_GAUGES.outboxDead]: 0,
      [OPERATOR_GAUGES.outboxHaltedKeys]: 0,
    });
    expect(values[OPERATOR_GAUGES.outboxOldestPendingAge]).toBeGreaterThanOrEqual(0);
    expect(calls, 'one stats() call serves all five gauges').toBe(1);
    stop();
    await metrics.read();
    expect(calls, 'no stats() after the gauges were unregistered').toBe(1);
  });

  it('report nothing, and log why, when stats() fails — a dead database must not look like an empty backlog', async () => {
    const metrics = sdk();
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (message) => warnings.push(message) };
    const failing = { stats: () => Promise.reject(new Error('database away')) } as unknown as OutboxOperations;
    observeOutbox(failing, { meter: metrics.meter, logger });
    expect(await metrics.read()).not.toHaveProperty(OPERATOR_GAUGES.outboxPending);
    expect(warnings).toEqual(['outbox stats for metrics failed']);
  });

  it('log-slot gauges: lag and unacknowledged age while the slot exists; nothing when it is gone or its read fails (never zeros)', async () => {
    // The slot's members as PgLogicalOutboxStore has them (tested against PostgreSQL in packages/cli/test/cli-log-slot.test.ts).
    let state: 'present' | 'missing' | 'away' = 'present';
    const source = {
      slot: 'orders_slot',
      slotStats: () =>
        state === 'away'
          ? Promise.reject(new Error('database away'))
          : Promise.resolve(state === 'missing' ? undefined : { active: false, activePid: null, lagBytes: 1_048_576, walStatus: 'reserved', unacknowledgedAgeMs: 2_500 }),
    };
    expect(hasLogSlot(source)).toBe(true);
    expect(hasLogSlot(new InMemoryDatabase())).toBe(false);
    expect(hasLogSlot({ slot: 'orders_slot' })).toBe(false);
    expect(hasLogSlot(null)).toBe(false);
    const metrics = sdk();
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (message) => warnings.push(message) };
    const stop = observeLogSlot(source, { meter: metrics.meter, logger });
    expect(await metrics.points(OPERATOR_GAUGES.logSlotLag, 'courier.log_slot')).toEqual([['orders_slot', 1_048_576]]);
    expect(await metrics.points(OPERATOR_GAUGES.logSlotUnacknowledgedAge, 'courier.log_slot')).toEqual([['orders_slot', 2.5]]);
    stop();
    // Each on a provider of its own: a cumulative reader repeats a gauge's last value, which would hide what this collection observed.
    state = 'missing';
    const fresh = sdk();
    observeLogSlot(source, { meter: fresh.meter, logger });
    expect(await fresh.read()).not.toHaveProperty(OPERATOR_GAUGES.logSlotLag);
    expect(warnings).toEqual([]);
    state = 'away';
    const away = sdk();
    observeLogSlot(source, { meter: away.meter, logger });
    expect(await away.read()).not.toHaveProperty(OPERATOR_GAUGES.logSlotLag);
    expect(warnings).toEqual(['log-tail slot stats for metrics failed']);
  });

  it('courier.relay.paused is 1 only while the running relay is paused', async () => {
    const metrics = sdk();
    let relay = { running: true, paused: true };
    observeRelay({ health: () => ({ relay }) as never }, { meter: metrics.meter });
    expect((await metrics.read())[OPERATOR_GAUGES.relayPaused]).toBe(1);
    relay = { running: true, paused: false };
    expect((await metrics.read())[OPERATOR_GAUGES.relayPaused]).toBe(0);
    relay = { running: false, paused: true };
    expect((await metrics.read())[OPERATOR_GAUGES.relayPaused]).toBe(0);
  });
});

describe('transport dead-letter depth gauge', () => {
  const GROUP = 'messaging.consumer.group.name';

  async function brokerWithDeadLetters(count: number) {
    const broker = new InMemoryBroker();
    const connection = broker.connect();
    await connection.subscribe({ consumer: 'billing', topics: ['billing'], ordered: false, concurrency: 1 }, (delivery) =>
      delivery.deadLetter({ code: 'TEST', message: 'parked by the test' }),
    );
    await connection.publish(
      Array.from({ length: count }, () => {
        const messageId = newMessageId();
        return { messageId, type: 'billing.Charged', version: 1, topic: 'billing', occurredAt: new Date().toISOString(), key: null, correlationId: messageId, causationId: null, traceparent: null, tracestate: null, headers: {}, payload: '{}' };
      }),
    );
    await eventually(async () => expect(await connection.deadLetters.list('billing')).toHaveLength(count));
    return { broker, deadLetters: connection.deadLetters };
  }

  it('reports the depth per consumer, counting again only after minIntervalMs', async () => {
    const { broker, deadLetters } = await brokerWithDeadLetters(3);
    let lists = 0;
    const counted: Pick<TransportDeadLetters, 'list'> = { list: (consumer, options) => ((lists += 1), deadLetters.list(consumer, options)) };
    // An hour between counts: every scrape in this test after the first reports the first count.
    const cached = sdk();
    observeDeadLetters(counted, ['billing', 'shipping'], { meter: cached.meter, minIntervalMs: 3_600_000 });
    // No interval: every scrape counts.
    const fresh = sdk();
    const stop = observeDeadLetters(deadLetters, ['billing'], { meter: fresh.meter, minIntervalMs: 0 });
    expect(await cached.points(OPERATOR_GAUGES.transportDeadLetters, GROUP)).toEqual([['billing', 3], ['shipping', 0]]);
    expect(lists).toBe(2);
    await deadLetters.purge('billing', [(await deadLetters.list('billing'))[0]!.id]);
    expect(await cached.points(OPERATOR_GAUGES.transportDeadLetters, GROUP)).toEqual([['billing', 3], ['shipping', 0]]);
    expect(lists).toBe(2);
    expect(await fresh.points(OPERATOR_GAUGES.transportDeadLetters, GROUP)).toEqual([['billing', 2]]);
    stop();
    await broker.close();
  });

  it('caps the depth at limit, and reports nothing for a consumer whose count failed (never a zero)', async () => {
    const { broker, deadLetters } = await brokerWithDeadLetters(3);
    const metrics = sdk();
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (message) => warnings.push(message) };
    const flaky: Pick<TransportDeadLetters, 'list'> = {
      list: (consumer, options) => (consumer === 'away' ? Promise.reject(new Error('broker away')) : deadLetters.list(consumer, options)),
    };
    observeDeadLetters(flaky, ['billing', 'away'], { meter: metrics.meter, limit: 2, logger });
    expect(await metrics.points(OPERATOR_GAUGES.transportDeadLetters, GROUP)).toEqual([['billing', 2]]);
    expect(warnings).toEqual(['transport dead-letter count for metrics failed']);
    await broker.close();
  });
});

describe('duration histograms', () => {
  afterEach(() => {
    otelMetrics.disable();
  });

  it('record publish (sent → confirmed), handler duration and delivery → ack through the global meter provider', async () => {
    const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
    const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    expect(otelMetrics.setGlobalMeterProvider(provider)).toBe(true);
    await using h = harness();
    const handled: string[] = [];
    h.bus.subscribe('billing', Placed, async (message) => {
      handled.push(message.messageId);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(handled).toHaveLength(1));
    const counts = async (): Promise<Record<string, { count: number; attributes: Record<string, unknown> }>> => {
      exporter.reset();
      await reader.forceFlush();
      const found: Record<string, { count: number; attributes: Record<string, unknown> }> = {};
      for (const resource of exporter.getMetrics()) {
        for (const scope of resource.scopeMetrics) {
          for (const metric of scope.metrics as HistogramMetricData[]) {
            const count = metric.dataPoints.reduce((sum, point) => sum + point.value.count, 0);
            found[metric.descriptor.name] = { count, attributes: { ...metric.dataPoints[0]?.attributes } };
          }
        }
      }
      return found;
    };
    // The ack is recorded just after the handler's commit: poll until it is there.
    await eventually(async () => expect((await counts())[DURATION_HISTOGRAMS.deliveryToAck]?.count).toBe(1));
    const found = await counts();
    expect(found[DURATION_HISTOGRAMS.publish]?.count).toBeGreaterThanOrEqual(1);
    expect(found[DURATION_HISTOGRAMS.publish]?.attributes).toMatchObject({ 'messaging.operation.type': 'send', 'courier.outcome': 'ok' });
    expect(found[DURATION_HISTOGRAMS.process]).toMatchObject({ count: 1, attributes: { 'messaging.consumer.group.name': 'billing', 'messaging.destination.name': 'orders', 'courier.outcome': 'ok' } });
    expect(found[DURATION_HISTOGRAMS.deliveryToAck]?.attributes).toMatchObject({ 'messaging.consumer.group.name': 'billing' });
    // The consumer's counters carry the conventions' consumer-group attribute too.
    expect(found['courier.consumer.processed']?.attributes).toEqual({ 'messaging.consumer.group.name': 'billing' });
    // Second-scale buckets (the conventions' advice), not the SDK's default 0–10,000.
    const boundaries: Record<string, number[]> = {};
    for (const resource of exporter.getMetrics()) {
      for (const scope of resource.scopeMetrics) {
        for (const metric of scope.metrics as HistogramMetricData[]) {
          if ((Object.values(DURATION_HISTOGRAMS) as string[]).includes(metric.descriptor.name)) boundaries[metric.descriptor.name] = metric.dataPoints[0]?.value.buckets.boundaries ?? [];
        }
      }
    }
    for (const name of [DURATION_HISTOGRAMS.publish, DURATION_HISTOGRAMS.process, DURATION_HISTOGRAMS.deliveryToAck, DURATION_HISTOGRAMS.commitToConfirm]) {
      expect(boundaries[name]?.[0], name).toBe(0.005);
    }
  });
});

describe('commit → confirm histogram', () => {
  afterEach(() => {
    otelMetrics.disable();
  });

  it("records each confirmed row from when it became due, so a delayed row's delay is not in it", async () => {
    const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
    const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    expect(otelMetrics.setGlobalMeterProvider(provider)).toBe(true);
    const clock = { offset: 0 };
    await using h = harness({ clock });
    const handled: string[] = [];
    h.bus.subscribe('billing', Placed, async (message) => {
      handled.push((message.payload as { orderId: string }).orderId);
    });
    await h.bus.start();
    const hourMs = 3_600_000;
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'delayed' }, { delay: hourMs });
    });
    // The delayed row becomes due 2 s before the relay can see it: its latency starts there.
    clock.offset = hourMs + 2_000;
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'now' });
    });
    await eventually(() => expect(handled.sort()).toEqual(['delayed', 'now']));
    const read = async () => {
      exporter.reset();
      await reader.forceFlush();
      const points = [];
      for (const resource of exporter.getMetrics()) {
        for (const scope of resource.scopeMetrics) {
          for (const metric of scope.metrics as HistogramMetricData[]) {
            if (metric.descriptor.name === DURATION_HISTOGRAMS.commitToConfirm) points.push(...metric.dataPoints);
          }
        }
      }
      return points;
    };
    // The relay records after the broker's confirm, which can follow the delivery.
    const points = await eventually(async () => {
      const found = await read();
      expect(found.reduce((sum, point) => sum + point.value.count, 0)).toBe(2);
      return found;
    });
    expect(points[0]?.attributes).toMatchObject({ 'messaging.system': 'courier', 'messaging.destination.name': Placed.topic });
    const value = points[0]!.value;
    // The delayed row: at least the 2 s it waited once due, far below its hour of delay.
    expect(value.max ?? -1).toBeGreaterThanOrEqual(2);
    expect(value.max ?? Infinity).toBeLessThan(hourMs / 1000 / 2);
    // The other row was due at its commit: the relay's and the broker's time only.
    expect(value.min ?? -1).toBeGreaterThanOrEqual(0);
    expect(value.min ?? Infinity).toBeLessThan(value.max ?? -1);
  });

  it('records nothing for a row whose store gives no age (never a made-up start)', async () => {
    const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
    const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    expect(otelMetrics.setGlobalMeterProvider(provider)).toBe(true);
    await using h = harness();
    const claim = h.outbox.claim.bind(h.outbox);
    const completeAndClaim = h.outbox.completeAndClaim.bind(h.outbox);
    const ageless = <B extends { records: readonly { ageMs?: number }[] }>(batch: B): B => ({ ...batch, records: batch.records.map(({ ageMs: _ageMs, ...record }) => record) });
    h.outbox.claim = async (options) => ageless(await claim(options));
    h.outbox.completeAndClaim = async (done, options) => ageless(await completeAndClaim(done, options));
    const handled: string[] = [];
    h.bus.subscribe('billing', Placed, async (message) => {
      handled.push(message.messageId);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(handled).toHaveLength(1));
    await eventually(() => expect(h.bus.health().counters.published).toBe(1));
    exporter.reset();
    await reader.forceFlush();
    const names = exporter.getMetrics().flatMap((resource) => resource.scopeMetrics.flatMap((scope) => scope.metrics.map((metric) => metric.descriptor.name)));
    expect(names).toContain(DURATION_HISTOGRAMS.publish);
    expect(names).not.toContain(DURATION_HISTOGRAMS.commitToConfirm);
  });
});

describe('metrics read failures counter', () => {
  it('counts every failed read by source, each source created at 0 when its gauges are registered', async () => {
    const metrics = sdk();
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, warn: (message) => void warnings.push(message), error() {} };
    const away = async (): Promise<never> => {
      throw new Error('database away');
    };
    observeOutbox(pick(new InMemoryOutboxStore({ database: new InMemoryDatabase() })), { meter: metrics.meter, logger });
    observeInbox({ stats: away }, { meter: metrics.meter, logger, minIntervalMs: 0 });
    observeInboxHalts({ listHalted: away }, { meter: metrics.meter, logger });
    observeDeadLetters({ list: away, count: away }, ['billing'], { meter: metrics.meter, logger, minIntervalMs: 0 });
    const source = 'courier.metrics.source';
    expect(await metrics.points(METRICS_READ_FAILURES, source)).toEqual([['inbox', 1], ['inbox_halts', 1], ['outbox', 0], ['transport_dead_letters', 1]]);
    expect(await metrics.points(METRICS_READ_FAILURES, source)).toEqual([['inbox', 2], ['inbox_halts', 2], ['outbox', 0], ['transport_dead_letters', 2]]);
    // Nothing observed for the failed sources' gauges, and each failure logged.
    expect(await metrics.points(OPERATOR_GAUGES.inboxRecords, 'messaging.consumer.group.name')).toEqual([]);
    expect(warnings.filter((warning) => warning === 'transport dead-letter count for metrics failed')).toHaveLength(3);
  });
});

describe('occurredAt → handler histogram', () => {
  afterEach(() => {
    otelMetrics.disable();
  });

  it("records a message's first handler start from its occurredAt, once per message: not its retry, not a replay", async () => {
    const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
    const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
    const provider = new MeterProvider({ readers: [reader] });
    providers.push(provider);
    expect(otelMetrics.setGlobalMeterProvider(provider)).toBe(true);
    await using h = harness();
    const runs: string[] = [];
    h.bus.subscribe('billing', Placed, async (message) => {
      const { orderId } = message.payload as { orderId: string };
      runs.push(orderId);
      if (orderId === 'flaky' && runs.filter((run) => run === 'flaky').length === 1) throw new Error('first run fails');
      if (orderId === 'poison') throw new UnrecoverableError('never');
    });
    await h.bus.start();
    await h.commit((tx) => {
      // Set by the producer: the fact happened 20 s before its publish.
      h.bus.outbox(tx).publish(Placed, { orderId: 'old' }, { occurredAt: new Date(Date.now() - 20_000) });
      h.bus.outbox(tx).publish(Placed, { orderId: 'now' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'flaky' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'poison' });
    });
    await eventually(() => expect(h.bus.health().counters).toMatchObject({ processed: 3, deadLettered: 1 }));
    const [dead] = await h.connection.deadLetters!.list('billing', { limit: 10 });
    expect(await h.connection.deadLetters!.replay('billing', [dead!.id])).toBe(1);
    await eventually(() => expect(runs.filter((run) => run === 'poison')).toHaveLength(2));
    await eventually(() => expect(h.bus.health().counters.deadLettered).toBe(2));
    exporter.reset();
    await reader.forceFlush();
    const points = exporter
      .getMetrics()
      .flatMap((resource) => resource.scopeMetrics.flatMap((scope) => scope.metrics as HistogramMetricData[]))
      .filter((metric) => metric.descriptor.name === DURATION_HISTOGRAMS.occurredToHandler)
      .flatMap((metric) => metric.dataPoints);
    expect(points).toHaveLength(1);
    expect(points[0]!.attributes).toEqual({ 'messaging.system': 'courier', 'messaging.consumer.group.name': 'billing', 'messaging.destination.name': Placed.topic });
    // Four messages, each counted at its first start: the flaky one's retry and the poison one's replay add nothing.
    expect(points[0]!.value.count).toBe(4);
    expect(points[0]!.value.max ?? -1).toBeGreaterThanOrEqual(20);
    expect(points[0]!.value.min ?? -1).toBeGreaterThanOrEqual(0);
    expect(points[0]!.value.min ?? Infinity).toBeLessThan(20);
    expect(points[0]!.value.buckets.boundaries.at(-1)).toBe(900);
  });
});

describe('inbox halted-keys gauge', () => {
  it("counts a consumer's halted keys at collection time, and reports nothing when listing fails", async () => {
    const { meter, read } = sdk();
    const inbox = new InMemoryInboxStore({ database: new InMemoryDatabase() });
    const envelope = (key: string) => ({
      messageId: `m-${key}`, type: Placed.type, version: 1, topic: Placed.topic, occurredAt: new Date().toISOString(), key,
      correlationId: `m-${key}`, causationId: null, traceparent: null, tracestate: null, headers: {}, payload: '{}',
    });
    const stop = observeInboxHalts(inbox, { meter });
    expect((await read())[OPERATOR_GAUGES.inboxHaltedKeys]).toBeUndefined();
    await inbox.halt('billing', Placed.topic, 'a', envelope('a'), 'E');
    await inbox.halt('billing', Placed.topic, 'b', envelope('b'), 'E');
    expect((await read())[OPERATOR_GAUGES.inboxHaltedKeys]).toBe(2);
    stop();
    // A fresh SDK: the cumulative exporter keeps a gauge's last point.
    const other = sdk();
    const failing = observeInboxHalts({ listHalted: async () => Promise.reject(new Error('database away')) }, { meter: other.meter });
    expect((await other.read())[OPERATOR_GAUGES.inboxHaltedKeys]).toBeUndefined();
    failing();
  });
});

describe('inbox gauges', () => {
  const GROUP = 'messaging.consumer.group.name';

  it("report each consumer's dead letters, records and oldest record age from stats(), at most once per interval", async () => {
    const metrics = sdk();
    const db = new InMemoryDatabase();
    const inbox = new InMemoryInboxStore({ database: db });
    let reads = 0;
    const counted = { stats: () => ((reads += 1), inbox.stats()) };
    const stop = observeInbox(counted, { meter: metrics.meter, minIntervalMs: 3_600_000 });
    expect(reads).toBe(0);
    expect(await metrics.points(OPERATOR_GAUGES.inboxDeadLetters, GROUP)).toEqual([]);
    await inbox.run('m-1', 'billing', async () => undefined);
    await inbox.run('m-2', 'billing', async () => undefined);
    await inbox.run('m-2', 'billing~dead', async () => undefined);
    await inbox.run('m-1', 'shipping', async () => undefined);
    // The first read was of an empty inbox; a fresh observer reads now.
    stop();
    const fresh = sdk();
    const again = observeInbox(counted, { meter: fresh.meter, minIntervalMs: 3_600_000 });
    expect(await fresh.points(OPERATOR_GAUGES.inboxDeadLetters, GROUP)).toEqual([['billing', 1], ['shipping', 0]]);
    expect(await fresh.points(OPERATOR_GAUGES.inboxRecords, GROUP)).toEqual([['billing', 2], ['shipping', 1]]);
    const ages = await fresh.points(OPERATOR_GAUGES.inboxOldestRecordAge, GROUP);
    expect(ages.map(([consumer]) => consumer)).toEqual(['billing', 'shipping']);
    for (const [, seconds] of ages) expect(seconds).toBeGreaterThanOrEqual(0);
    const readsSoFar = reads;
    await inbox.run('m-3', 'billing~dead', async () => undefined);
    // Within the interval: the last values, no new read.
    expect(await fresh.points(OPERATOR_GAUGES.inboxDeadLetters, GROUP)).toEqual([['billing', 1], ['shipping', 0]]);
    expect(reads).toBe(readsSoFar);
    again();
  });

  it('report nothing while stats() fails and read again at the next collection; a store without stats() is refused by name', async () => {
    const { meter, points } = sdk();
    const inbox = new InMemoryInboxStore({ database: new InMemoryDatabase() });
    await inbox.run('m-1', 'billing~dead', async () => undefined);
    let away = true;
    const warnings: string[] = [];
    const logger: Logger = { debug() {}, info() {}, error() {}, warn: (message) => warnings.push(message) };
    const stop = observeInbox({ stats: () => (away ? Promise.reject(new Error('database away')) : inbox.stats()) }, { meter, logger });
    expect(await points(OPERATOR_GAUGES.inboxDeadLetters, GROUP)).toEqual([]);
    expect(warnings).toEqual(['inbox stats for metrics failed']);
    away = false;
    expect(await points(OPERATOR_GAUGES.inboxDeadLetters, GROUP)).toEqual([['billing', 1]]);
    stop();
    expect(() => observeInbox({}, { meter })).toThrow(/no stats\(\)/);
  });
});
