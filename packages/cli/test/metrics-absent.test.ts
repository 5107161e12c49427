// A gauge whose read failed (or whose subject went away) is absent from /metrics, not
// repeated: through a real serveCourierMetrics endpoint and its Prometheus text, an outbox
// whose stats() answer once and then fail, a halted key that is resumed, and a replication
// slot that is dropped. The failures are counted in courier_metrics_read_failures_total.
// About 1 s.
import { InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, METRICS_READ_FAILURES, type LogSlotOperations, type Logger } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { parsePrometheusText, serveCourierMetrics, type CourierMetricsServer } from '../src/index.js';

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };

/** `target` with some members replaced: a real store whose reads the test steers. */
function withMembers<T extends object>(target: T, members: Record<string, unknown>): T {
  return new Proxy(target, {
    get(object, property, receiver) {
      if (typeof property === 'string' && property in members) return members[property];
      const value: unknown = Reflect.get(object, property, receiver);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(object) : value;
    },
  });
}

describe('/metrics after a failed read', () => {
  let server: CourierMetricsServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  async function scrape(): Promise<ReturnType<typeof parsePrometheusText>> {
    const response = await fetch(`http://127.0.0.1:${server!.address.port}/metrics`);
    expect(response.status).toBe(200);
    return parsePrometheusText(await response.text());
  }
  const valueOf = (samples: ReturnType<typeof parsePrometheusText>, name: string, labels: Record<string, string> = {}) =>
    samples.find((sample) => sample.name === name && Object.entries(labels).every(([key, value]) => sample.labels[key] === value))?.value;

  it('an outbox whose stats() fail after one good read: the gauges go absent, the failure is counted, and a good read brings them back', async () => {
    server = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0, logger: quiet });
    const store = new InMemoryOutboxStore({ database: new InMemoryDatabase() });
    let failing = false;
    const outbox = withMembers(store, {
      stats: async () => {
        if (failing) throw new Error('connection refused');
        return { ...(await store.stats()), pending: 7, oldestPendingAgeMs: 90_000 };
      },
    });
    server.watch({ outbox });

    const good = await scrape();
    expect(valueOf(good, 'courier_outbox_pending')).toBe(7);
    expect(valueOf(good, 'courier_outbox_oldest_pending_age_seconds')).toBe(90);
    // Created at 0 when the gauges are registered, so the first failure is an increase().
    expect(valueOf(good, 'courier_metrics_read_failures_total', { courier_metrics_source: 'outbox' })).toBe(0);

    failing = true;
    const away = await scrape();
    expect(valueOf(away, 'courier_outbox_pending')).toBeUndefined();
    expect(valueOf(away, 'courier_outbox_oldest_pending_age_seconds')).toBeUndefined();
    expect(valueOf(away, 'courier_outbox_dead')).toBeUndefined();
    expect(valueOf(away, 'courier_metrics_read_failures_total', { courier_metrics_source: 'outbox' })).toBe(1);
    const stillAway = await scrape();
    expect(valueOf(stillAway, 'courier_outbox_pending')).toBeUndefined();
    expect(valueOf(stillAway, 'courier_metrics_read_failures_total', { courier_metrics_source: 'outbox' })).toBe(2);

    failing = false;
    const back = await scrape();
    expect(valueOf(back, 'courier_outbox_pending')).toBe(7);
    expect(valueOf(back, 'courier_metrics_read_failures_total', { courier_metrics_source: 'outbox' })).toBe(2);
  });

  it('a dropped replication slot and a failed slot read leave no lag behind; a halted key that was resumed leaves no halted-keys series', async () => {
    server = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0, logger: quiet });
    let slot: 'there' | 'dropped' | 'failing' = 'there';
    const logSlot: LogSlotOperations = {
      slot: 'orders_slot',
      async slotStats() {
        if (slot === 'failing') throw new Error('connection refused');
        return slot === 'there' ? { active: true, activePid: 42, lagBytes: 5_000_000, walStatus: 'reserved', unacknowledgedAgeMs: 0 } : undefined;
      },
    };
    let halted = [{ consumer: 'billing' }];
    const store = new InMemoryInboxStore({ database: new InMemoryDatabase() });
    const inbox = withMembers(store, { listHalted: async () => halted.map((key) => ({ ...key, topic: 'orders', key: 'k' })) });
    server.watch({ logSlot, inbox });

    const first = await scrape();
    expect(valueOf(first, 'courier_outbox_log_slot_lag_bytes', { courier_log_slot: 'orders_slot' })).toBe(5_000_000);
    expect(valueOf(first, 'courier_inbox_halted_keys', { messaging_consumer_group_name: 'billing' })).toBe(1);

    slot = 'failing';
    halted = [];
    const second = await scrape();
    expect(valueOf(second, 'courier_outbox_log_slot_lag_bytes')).toBeUndefined();
    expect(valueOf(second, 'courier_inbox_halted_keys')).toBeUndefined();
    expect(valueOf(second, 'courier_metrics_read_failures_total', { courier_metrics_source: 'log_slot' })).toBe(1);

    slot = 'dropped';
    const third = await scrape();
    expect(valueOf(third, 'courier_outbox_log_slot_lag_bytes')).toBeUndefined();
    // A slot that does not exist is not a failed read.
    expect(valueOf(third, 'courier_metrics_read_failures_total', { courier_metrics_source: 'log_slot' })).toBe(1);
  });

  it('names the failure counter it documents', () => {
    expect(METRICS_READ_FAILURES).toBe('courier.metrics.read_failures');
  });
});
