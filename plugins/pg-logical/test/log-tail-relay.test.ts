import { createBus, noopLogger, type Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { readSlotStats } from '../src/index.js';
import { createLogTailFixture, eventually, Ping, RecordingTransport, type LogTailFixture } from './support/fixture.js';

const fixtures: LogTailFixture[] = [];
afterEach(async () => {
  while (fixtures.length > 0) await fixtures.pop()!.close();
});

async function fixture(): Promise<LogTailFixture> {
  const created = await createLogTailFixture();
  fixtures.push(created);
  return created;
}

describe('log-tailing relay (PostgreSQL logical replication)', () => {
  it('publishes committed rows from the slot, marks them published and acknowledges the slot past them', async () => {
    const f = await fixture();
    const store = f.logTail();
    const transport = new RecordingTransport();
    // A poll interval far beyond the test: only the slot's announcements can drive the relay.
    const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000 } });
    await bus.start({ relay: true, consumers: false });
    await eventually(() => expect(store.streaming).toBe(true));
    const before = await readSlotStats(f.admin, f.id);
    expect(before).toBeDefined();
    await f.transaction(async (em) => {
      for (let i = 0; i < 20; i++) bus.outbox(em).publish(Ping, { i }, { key: `k${i % 4}` });
    });
    await eventually(() => expect(transport.published).toHaveLength(20));
    await eventually(async () => expect((await f.inner.stats()).pending).toBe(0));
    // Per-key order: each key's payloads in append order.
    for (let k = 0; k < 4; k++) {
      const seen = transport.published.filter((e) => e.key === `k${k}`).map((e) => (JSON.parse(e.payload) as { i: number }).i);
      expect(seen).toEqual([...seen].sort((a, b) => a - b));
      expect(seen).toHaveLength(5);
    }
    await eventually(async () => {
      const stats = await store.slotStats();
      expect(stats?.active).toBe(true);
      expect(stats?.unacknowledgedAgeMs).toBe(0);
      expect(BigInt(lsnNumber(stats!.confirmedLsn!))).toBeGreaterThan(BigInt(lsnNumber(before!.confirmedLsn!)));
    });
    await bus.stop();
  });

  it('resumes from the slot after a restart: rows committed while no relay ran come from the log, not a sweep', async () => {
    const f = await fixture();
    const transport = new RecordingTransport();
    const first = f.logTail({ sweepIntervalMs: 60_000 });
    const bus1 = createBus({ outbox: first, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000 } });
    await bus1.start({ relay: true, consumers: false });
    await eventually(() => expect(first.streaming).toBe(true));
    await f.transaction(async (em) => {
      for (let i = 0; i < 5; i++) bus1.outbox(em).publish(Ping, { i }, { key: 'a' });
    });
    await eventually(() => expect(transport.published).toHaveLength(5));
    await bus1.stop();
    await first.close();
    // No reader now: the slot keeps the WAL of what is committed meanwhile.
    const producer = createBus({ outbox: f.polling(), transport, logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 5; i < 10; i++) producer.outbox(em).publish(Ping, { i }, { key: 'a' });
    });
    await eventually(async () => expect((await readSlotStats(f.admin, f.id))?.active).toBe(false));
    const second = f.logTail({ sweepIntervalMs: 60_000 });
    // Streaming before the relay's first claim, so that claim is no sweep.
    const unwatch = await second.watch(() => undefined);
    await eventually(() => expect(second.streaming).toBe(true));
    const bus2 = createBus({ outbox: second, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000 } });
    await bus2.start({ relay: true, consumers: false });
    await eventually(() => expect(transport.published).toHaveLength(10));
    expect(transport.published.map((e) => (JSON.parse(e.payload) as { i: number }).i)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(second.claimed).toEqual({ logged: 5, swept: 0 });
    await bus2.stop();
    await unwatch();
  });

  it('one reader per slot: a second relay on the slot is refused, claims as a polling relay meanwhile, and takes the slot over when the reader closes', async () => {
    const f = await fixture();
    const transport = new RecordingTransport();
    const active = f.logTail({ reconnectDelayMs: 50 });
    const standby = f.logTail({ reconnectDelayMs: 50 });
    const busA = createBus({ outbox: active, transport, logger: noopLogger, relay: { pollIntervalMs: 200 } });
    await busA.start({ relay: true, consumers: false });
    await eventually(() => expect(active.streaming).toBe(true));
    const busB = createBus({ outbox: standby, transport, logger: noopLogger, relay: { pollIntervalMs: 200 } });
    await busB.start({ relay: true, consumers: false });
    await f.transaction(async (em) => {
      for (let i = 0; i < 40; i++) busA.outbox(em).publish(Ping, { i }, { key: `k${i % 5}` });
    });
    await eventually(() => expect(transport.published).toHaveLength(40));
    expect(standby.streaming).toBe(false);
    await busA.stop();
    await active.close();
    await eventually(() => expect(standby.streaming).toBe(true));
    await f.transaction(async (em) => {
      for (let i = 40; i < 60; i++) busB.outbox(em).publish(Ping, { i }, { key: `k${i % 5}` });
    });
    await eventually(() => expect(transport.published).toHaveLength(60));
    // Fenced by leases: no row was published twice, and each key kept its order.
    expectOncePerRowInKeyOrder(transport.published, 60);
    expect(standby.claimed.logged).toBeGreaterThan(0);
    await busB.stop();
  });

  it('coexists with a polling relay on the same outbox: every row published once, per-key order kept', async () => {
    const f = await fixture();
    const transport = new RecordingTransport();
    const logTail = f.logTail({ sweepIntervalMs: 300 });
    const busLog = createBus({ outbox: logTail, transport, logger: noopLogger, relay: { pollIntervalMs: 100 } });
    const busPoll = createBus({ outbox: f.polling(), transport, logger: noopLogger, relay: { pollIntervalMs: 20 } });
    await busLog.start({ relay: true, consumers: false });
    await busPoll.start({ relay: true, consumers: false });
    await eventually(() => expect(logTail.streaming).toBe(true));
    for (let batch = 0; batch < 10; batch++) {
      await f.transaction(async (em) => {
        for (let i = 0; i < 20; i++) busLog.outbox(em).publish(Ping, { i: batch * 20 + i }, { key: `k${i % 7}` });
      });
    }
    await eventually(() => expect(transport.published).toHaveLength(200));
    await eventually(async () => expect((await f.inner.stats()).pending).toBe(0));
    expectOncePerRowInKeyOrder(transport.published, 200);
    await busPoll.stop();
    await busLog.stop();
  });

  it('delayed rows are published by the sweep once due; the log announces them but never claims them early', async () => {
    const f = await fixture();
    const transport = new RecordingTransport();
    const store = f.logTail({ sweepIntervalMs: 200 });
    const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 100 } });
    await bus.start({ relay: true, consumers: false });
    await eventually(() => expect(store.streaming).toBe(true));
    await f.transaction(async (em) => {
      bus.outbox(em).publish(Ping, { i: 0 }, { key: 'd', delay: 1_500 });
      bus.outbox(em).publish(Ping, { i: 1 }, { key: 'd' });
      bus.outbox(em).publish(Ping, { i: 2 }, { key: 'e' });
    });
    await eventually(() => expect(transport.published.map((e) => e.key)).toEqual(['e']));
    // The key's second row waits behind its delayed head.
    await eventually(() => expect(transport.published).toHaveLength(3), 20_000);
    expect(transport.published.map((e) => (JSON.parse(e.payload) as { i: number }).i)).toEqual([2, 0, 1]);
    await bus.stop();
  });
});

/** Each of `total` rows published exactly once, and within each key in append order. */
function expectOncePerRowInKeyOrder(published: readonly Envelope[], total: number): void {
  const ids = published.map((e) => e.messageId);
  expect(new Set(ids).size).toBe(total);
  const byKey = new Map<string, number[]>();
  for (const e of published) byKey.set(e.key ?? '', [...(byKey.get(e.key ?? '') ?? []), (JSON.parse(e.payload) as { i: number }).i]);
  for (const order of byKey.values()) expect(order).toEqual([...order].sort((a, b) => a - b));
}

function lsnNumber(lsn: string): string {
  const [high, low] = lsn.split('/');
  return ((BigInt(`0x${high}`) << 32n) | BigInt(`0x${low}`)).toString();
}
