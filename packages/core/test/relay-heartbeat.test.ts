import { describe, expect, it } from 'vitest';
import { defineMessage } from '@courier/core';
import { eventually, harness } from './support/harness.js';
import { SendLog, slowTransport } from './support/relay-transports.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

describe('relay lease heartbeat', () => {
  // Two relays over one store; the first batch's confirm takes 2.5 leases. Without
  // renewals the other relay re-claims the row when the lease expires and sends it again.
  it('a slow but alive relay keeps its batch past the lease: no other relay sends it again', async () => {
    const log = new SendLog();
    const leaseMs = 600;
    await using h = harness({
      transport: (inner) => slowTransport(inner, log, leaseMs * 2.5),
      bus: { relay: { leaseMs, batchSize: 5, retry: { maxAttempts: 1 } } },
    });
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push((message.payload as { id: string }).id);
    });
    const other = h.another({ relay: { leaseMs, batchSize: 5, retry: { maxAttempts: 1 } } });
    await h.bus.start();
    await other.start({ consumers: false });
    await h.commit((tx) => {
      for (let index = 0; index < 3; index += 1) h.bus.outbox(tx).publish(Placed, { id: `m-${index}` }, { key: `k-${index}` });
    });
    await eventually(() => expect(new Set(seen).size).toBe(3), 15_000);
    await eventually(() => expect(log.unconfirmed).toBe(0), 10_000);
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 }), 10_000);
    expect(log.duplicates, 'a message was sent twice: its lease ran out while its confirm was awaited').toBe(0);
    expect(seen).toHaveLength(3);
  });

  // The database clock jumps past the lease while a batch is being sent (as if renewals had
  // failed) and another claimer takes the rows: the next renewal finds them gone.
  it('stops sending a batch once a renewal finds its rows re-claimed', async () => {
    const log = new SendLog();
    // Long enough that the lease, not a deadline, ends the sending: 40 confirms of 200 ms
    // take 8 s; the first renewal (at 2 s) finds the rows gone.
    const leaseMs = 6_000;
    const clock = { offset: 0 };
    await using h = harness({
      clock,
      transport: (inner) => slowTransport(inner, log, 200),
      bus: { relay: { leaseMs, batchSize: 40, retry: { maxAttempts: 1 } } },
    });
    await h.commit((tx) => {
      for (let index = 0; index < 40; index += 1) h.bus.outbox(tx).publish(Placed, { id: `m-${index}` }, { key: `k-${index}` });
    });
    await h.bus.start({ consumers: false });
    await eventually(() => expect(log.sent.size).toBeGreaterThan(0), 10_000);
    clock.offset += 60_000;
    const stolen = await h.outbox.claim({ owner: 'thief', limit: 100, leaseMs: 600_000, perKey: 1 });
    expect(stolen.records.length).toBeGreaterThan(0);
    // The relay's publish call ends early: the rest of its batch comes back ABORTED.
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ inFlight: stolen.records.length }), 10_000);
    await eventually(() => expect(log.unconfirmed).toBe(0), 10_000);
    // About 10 go before the first renewal; without it the relay sends until its lease is
    // 80% spent (about 24) or all 40.
    expect(log.sent.size, 'the relay kept sending rows another relay had re-claimed').toBeLessThan(20);
    expect(h.outbox.failures, 'losing a lease counts no attempt').toEqual([]);
  });
});
