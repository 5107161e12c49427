import { createBus, noopLogger, type Envelope } from '@courier/core';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogTailFixture, eventually, Ping, RecordingTransport, type LogTailFixture } from './support/fixture.js';

// A row the claim by sequence finds leased by this same store's own sweep — claimed, published
// and completed by that sweep while the claim's statement was in flight — is this store's own:
// it must not be parked as "leased by another relay" until the lease runs out, blocking its
// key and the slot's acknowledgement meanwhile (the seconds-long idle stalls of pipelined
// bench drains).

const fixtures: LogTailFixture[] = [];
const restore: (() => void)[] = [];
afterEach(async () => {
  while (restore.length > 0) restore.pop()!();
  while (fixtures.length > 0) await fixtures.pop()!.close();
});

const payloadOf = (envelope: Envelope) => (JSON.parse(envelope.payload) as { i: number }).i;

/** Holds the claim by sequence (the statement that starts `WITH token AS MATERIALIZED`): before it runs, and before its result is handed back. */
function gateClaimBySequence(): { reached: Promise<void>; run: () => void; ran: Promise<void>; answer: () => void } {
  let reached!: () => void;
  let run!: () => void;
  let ran!: () => void;
  let answer!: () => void;
  const gates = {
    reached: new Promise<void>((resolve) => (reached = resolve)),
    runGate: new Promise<void>((resolve) => (run = resolve)),
    ran: new Promise<void>((resolve) => (ran = resolve)),
    answerGate: new Promise<void>((resolve) => (answer = resolve)),
  };
  const original = pg.Pool.prototype.query;
  let armed = true;
  pg.Pool.prototype.query = async function (this: pg.Pool, ...args: unknown[]) {
    const call = () => (original as (...a: unknown[]) => Promise<unknown>).apply(this, args);
    if (!armed || typeof args[0] !== 'string' || !args[0].startsWith('WITH token AS MATERIALIZED')) return call();
    armed = false;
    reached();
    await gates.runGate;
    const result = await call();
    ran();
    await gates.answerGate;
    return result;
  } as typeof original;
  restore.push(() => {
    pg.Pool.prototype.query = original;
  });
  return { reached: gates.reached, run, ran: gates.ran, answer };
}

describe('log-tail claim by sequence: rows of its own sweep', () => {
  it('a row its own sweep claimed and completed while the claim by sequence ran does not wait out the lease', async () => {
    const f = await createLogTailFixture();
    fixtures.push(f);
    // No sweep but the first (a new slot's) during the test, and a lease far longer than the test's patience.
    const leaseMs = 30_000;
    const store = f.logTail({ sweepIntervalMs: 120_000 });
    let announced = 0;
    await store.watch(() => announced++);
    await eventually(() => expect(store.streaming).toBe(true));
    announced = 0;
    const bus = createBus({ outbox: f.polling(), transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 0; i < 2; i++) bus.outbox(em).publish(Ping, { i }, { key: 'a' });
    });
    await eventually(() => expect(announced).toBeGreaterThan(0));
    const gate = gateClaimBySequence();
    // A relay loop's claim by sequence takes key a's head (its second row waits behind it) …
    const byLog = store.claim({ owner: 'relay', limit: 10, leaseMs, perKey: 1 });
    await gate.reached;
    // … while another loop, with nothing left to choose, runs the new slot's sweep, which takes the head first.
    const swept = await store.claim({ owner: 'relay', limit: 10, leaseMs, perKey: 1 });
    expect(swept.records.map((record) => payloadOf(record.envelope))).toEqual([0]);
    expect(store.claimed.swept).toBe(1);
    // The claim by sequence sees the head leased; the sweep's loop publishes and completes it before that answer arrives.
    gate.run();
    await gate.ran;
    await store.complete(swept.lease, swept.records.map((record) => record.sequence));
    gate.answer();
    expect((await byLog).records).toHaveLength(0);
    // The key's next row goes out now, not once the head's 30 s lease has run out.
    const began = Date.now();
    const next = await eventually(async () => {
      const batch = await store.claim({ owner: 'relay', limit: 10, leaseMs, perKey: 1 });
      expect(batch.records.length).toBeGreaterThan(0);
      return batch;
    }, 10_000);
    expect(next.records.map((record) => payloadOf(record.envelope))).toEqual([1]);
    expect(Date.now() - began).toBeLessThan(10_000);
    await store.complete(next.lease, next.records.map((record) => record.sequence));
    // Both rows settled: the slot is acknowledged past their transaction.
    await eventually(async () => expect((await store.slotStats())?.unacknowledgedAgeMs).toBe(0));
  });
});

describe('log-tail parked rows', () => {
  it('a row parked for a short wait is tried again then, not when an earlier-parked row with a longer wait is due', async () => {
    const f = await createLogTailFixture();
    fixtures.push(f);
    const store = f.logTail({ sweepIntervalMs: 300_000 });
    let announced = 0;
    await store.watch(() => announced++);
    await eventually(() => expect(store.streaming).toBe(true));
    // A new slot sweeps at its first empty claim: spend that sweep before anything is committed.
    expect((await store.claim({ owner: 'warm-up', limit: 10, leaseMs: 30_000, perKey: 1 })).records).toHaveLength(0);
    announced = 0;
    const polling = f.polling();
    const bus = createBus({ outbox: polling, transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      bus.outbox(em).publish(Ping, { i: 0 }, { key: 'long' });
      bus.outbox(em).publish(Ping, { i: 1 }, { key: 'short' });
    });
    await eventually(() => expect(announced).toBeGreaterThan(0));
    // Another relay holds both heads: one for 120 s, one for a moment (it dies; its lease lapses).
    const long = await polling.claim({ owner: 'poller-long', limit: 1, leaseMs: 120_000, perKey: 1 });
    expect(long.records.map((record) => payloadOf(record.envelope))).toEqual([0]);
    const short = await polling.claim({ owner: 'poller-short', limit: 1, leaseMs: 1_500, perKey: 1 });
    expect(short.records.map((record) => payloadOf(record.envelope))).toEqual([1]);
    // Both are parked here until their leases end: the first for 120 s, the second for 1.5 s (on a
    // machine slow enough for the short lease to have lapsed already, the first claim takes it).
    const first = await store.claim({ owner: 'relay', limit: 10, leaseMs: 30_000, perKey: 1 });
    expect(first.records.map((record) => payloadOf(record.envelope))).not.toContain(0);
    const began = Date.now();
    const batch =
      first.records.length > 0
        ? first
        : await eventually(async () => {
            const next = await store.claim({ owner: 'relay', limit: 10, leaseMs: 30_000, perKey: 1 });
            expect(next.records.length).toBeGreaterThan(0);
            return next;
          }, 20_000);
    expect(batch.records.map((record) => payloadOf(record.envelope))).toEqual([1]);
    expect(Date.now() - began).toBeLessThan(20_000);
    await store.complete(batch.lease, batch.records.map((record) => record.sequence));
    await polling.complete(long.lease, long.records.map((record) => record.sequence));
  });
});

describe('log-tail rows leased by another live relay', () => {
  it('a head another relay completes long before its lease ends: the key goes on within about a second, not at the lease end', async () => {
    const f = await createLogTailFixture();
    fixtures.push(f);
    const store = f.logTail({ sweepIntervalMs: 300_000 });
    let announced = 0;
    await store.watch(() => announced++);
    await eventually(() => expect(store.streaming).toBe(true));
    expect((await store.claim({ owner: 'warm-up', limit: 10, leaseMs: 30_000, perKey: 1 })).records).toHaveLength(0);
    announced = 0;
    const polling = f.polling();
    const bus = createBus({ outbox: polling, transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 0; i < 2; i++) bus.outbox(em).publish(Ping, { i }, { key: 'c' });
    });
    await eventually(() => expect(announced).toBeGreaterThan(0));
    // A polling relay holds c's head under a 120 s lease; the log-tail store parks it (and its key).
    const held = await polling.claim({ owner: 'poller', limit: 1, leaseMs: 120_000, perKey: 1 });
    expect(held.records.map((record) => payloadOf(record.envelope))).toEqual([0]);
    expect((await store.claim({ owner: 'relay', limit: 10, leaseMs: 30_000, perKey: 1 })).records).toHaveLength(0);
    // It publishes and completes the head at once: the key's next row must not wait out the 120 s.
    await polling.complete(held.lease, held.records.map((record) => record.sequence));
    const began = Date.now();
    const next = await eventually(async () => {
      const batch = await store.claim({ owner: 'relay', limit: 10, leaseMs: 30_000, perKey: 1 });
      expect(batch.records.length).toBeGreaterThan(0);
      return batch;
    }, 20_000);
    expect(next.records.map((record) => payloadOf(record.envelope))).toEqual([1]);
    expect(Date.now() - began).toBeLessThan(20_000);
    await store.complete(next.lease, next.records.map((record) => record.sequence));
  });
});
