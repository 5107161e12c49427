import { createBus, noopLogger } from '@courier/core';
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
});

function lsnNumber(lsn: string): string {
  const [high, low] = lsn.split('/');
  return ((BigInt(`0x${high}`) << 32n) | BigInt(`0x${low}`)).toString();
}
