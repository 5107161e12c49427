import { createBus, noopLogger, type Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import type { PgLogicalOutboxStore } from '../src/index.js';
import type { EntityManager } from '@mikro-orm/core';
import { createLogTailFixture, eventually, Ping, RecordingTransport, type LogTailFixture } from './support/fixture.js';

// The claim by sequence with `perKey > 1` (a transport that keeps order across a pipelined
// batch): a key's announced rows go out as a run from its head in one claim, and a head that
// cannot be taken blocks the rest of its key only.

const fixtures: LogTailFixture[] = [];
afterEach(async () => {
  while (fixtures.length > 0) await fixtures.pop()!.close();
});

/** A streaming log-tail store with no sweep during the test, and a counter of the log's announcements. */
async function streamingStore(): Promise<{ f: LogTailFixture; store: PgLogicalOutboxStore<EntityManager>; announced: () => number }> {
  const f = await createLogTailFixture();
  fixtures.push(f);
  const store = f.logTail({ sweepIntervalMs: 60_000 });
  let count = 0;
  await store.watch(() => count++);
  await eventually(() => expect(store.streaming).toBe(true));
  // A new slot sweeps at its first empty claim: spend that sweep before anything is committed.
  expect((await store.claim({ owner: 'warm-up', limit: 10, leaseMs: 30_000, perKey: 1 })).records).toHaveLength(0);
  count = 0;
  return { f, store, announced: () => count };
}

const payloadOf = (envelope: Envelope) => (JSON.parse(envelope.payload) as { i: number }).i;

describe('log-tail claim by sequence: runs per key', () => {
  it('takes up to perKey rows of a key in one claim, in sequence order, and the next run after they settle', async () => {
    const { f, store, announced } = await streamingStore();
    const bus = createBus({ outbox: f.polling(), transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 0; i < 6; i++) bus.outbox(em).publish(Ping, { i }, { key: 'a' });
      for (let i = 6; i < 8; i++) bus.outbox(em).publish(Ping, { i }, { key: 'b' });
    });
    await eventually(() => expect(announced()).toBeGreaterThan(0));
    const first = await store.claim({ owner: 'runs', limit: 100, leaseMs: 30_000, perKey: 4 });
    // Key a: its first four rows (perKey); key b: both. One row per key before runs were claimed.
    expect(first.records.map((record) => payloadOf(record.envelope))).toEqual([0, 1, 2, 3, 6, 7]);
    // Key a's last two rows wait behind the four held here.
    expect((await store.claim({ owner: 'runs', limit: 100, leaseMs: 30_000, perKey: 4 })).records).toHaveLength(0);
    await store.complete(first.lease, first.records.map((record) => record.sequence));
    const second = await store.claim({ owner: 'runs', limit: 100, leaseMs: 30_000, perKey: 4 });
    expect(second.records.map((record) => payloadOf(record.envelope))).toEqual([4, 5]);
    await store.complete(second.lease, second.records.map((record) => record.sequence));
    expect(store.claimed).toEqual({ logged: 8, swept: 0 });
  });

  it('a head leased by another relay blocks its whole key, not other keys', async () => {
    const { f, store, announced } = await streamingStore();
    const polling = f.polling();
    const bus = createBus({ outbox: polling, transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 0; i < 3; i++) bus.outbox(em).publish(Ping, { i }, { key: 'c' });
    });
    await eventually(() => expect(announced()).toBeGreaterThan(0));
    // A polling relay holds c's head.
    const held = await polling.claim({ owner: 'poller', limit: 1, leaseMs: 1_000, perKey: 1 });
    expect(held.records.map((record) => payloadOf(record.envelope))).toEqual([0]);
    await f.transaction(async (em) => {
      for (let i = 3; i < 6; i++) bus.outbox(em).publish(Ping, { i }, { key: 'd' });
    });
    await eventually(() => expect(announced()).toBeGreaterThan(1));
    const batch = await store.claim({ owner: 'runs', limit: 10, leaseMs: 30_000, perKey: 10 });
    // c's head is announced and waiting here too, but leased elsewhere: none of c; all of d.
    expect(batch.records.map((record) => payloadOf(record.envelope))).toEqual([3, 4, 5]);
    await polling.complete(held.lease, held.records.map((record) => record.sequence));
    await store.complete(batch.lease, batch.records.map((record) => record.sequence));
    // c's rows come back from parking once the head's lease has ended (the head itself is published by then).
    const rest = await eventually(async () => {
      const next = await store.claim({ owner: 'runs', limit: 10, leaseMs: 30_000, perKey: 10 });
      expect(next.records.length).toBeGreaterThan(0);
      return next;
    });
    expect(rest.records.map((record) => payloadOf(record.envelope))).toEqual([1, 2]);
  });

  it('a relay on a pipelining transport publishes every row once, each key in order, from the log', async () => {
    const { f, store } = await streamingStore();
    const transport = new RecordingTransport();
    Object.assign(transport, { capabilities: { ...transport.capabilities, orderedPipelining: true } });
    const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000, batchSize: 50 } });
    await bus.start({ relay: true, consumers: false });
    for (let batch = 0; batch < 6; batch++) {
      await f.transaction(async (em) => {
        for (let i = 0; i < 50; i++) bus.outbox(em).publish(Ping, { i: batch * 50 + i }, { key: `k${i % 3}` });
      });
    }
    await eventually(() => expect(transport.published).toHaveLength(300));
    await eventually(async () => expect((await f.inner.stats()).pending).toBe(0));
    expect(new Set(transport.published.map((e) => e.messageId)).size).toBe(300);
    for (let k = 0; k < 3; k++) {
      const order = transport.published.filter((e) => e.key === `k${k}`).map(payloadOf);
      expect(order).toEqual([...order].sort((a, b) => a - b));
    }
    expect(store.claimed).toEqual({ logged: 300, swept: 0 });
    await bus.stop();
  });
});
