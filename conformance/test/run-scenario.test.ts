import type { TransportFixture } from '../src/fixtures.js';
import { describe, expect, it } from 'vitest';
import { Ledger } from '../src/bus/invariants.js';
import { runInProcessScenario, settle } from '../src/bus/run-scenario.js';
import { createWorld } from '../src/bus/world.js';
import { SCENARIOS } from '../src/bus/scenarios.js';
import { createInMemoryStoreFixture, createInMemoryTransportFixture } from '../src/in-memory-fixtures.js';

/** Wraps the in-memory transport fixture so its outage can misbehave, and counts the calls. */
async function faultyOutageFixture(beginFails: boolean): Promise<{ fixture: TransportFixture; calls: string[] }> {
  const inner = await createInMemoryTransportFixture();
  const calls: string[] = [];
  const fixture: TransportFixture = {
    ...inner,
    outage: {
      begin: async () => {
        calls.push('begin');
        // Part-way: the broker is already gone when begin gives up, as when the RabbitMQ
        // fixture cut its sockets but a transport still reported itself connected.
        await inner.outage!.begin();
        if (beginFails) throw new Error('a transport still believes it is connected');
      },
      end: async () => {
        calls.push('end');
        await inner.outage!.end();
      },
    },
  };
  return { fixture, calls };
}

describe('runInProcessScenario outages', () => {
  it('ends an outage whose begin() threw part-way, and reports the fixture at fault instead of lost messages', async () => {
    const { fixture, calls } = await faultyOutageFixture(true);
    const run = runInProcessScenario(
      { store: createInMemoryStoreFixture, transport: async () => fixture },
      SCENARIOS['broker-restart'],
      'freeze',
      { seed: 7, timeoutMs: 15_000 },
    );
    const error = await run.then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).name).toBe('FixtureFault');
    expect((error as Error).message).toMatch(/the transport fixture's outage\.begin\(\) failed: .*a transport still believes it is connected/);
    expect((error as Error).message).not.toMatch(/has no end state|was lost/);
    expect(calls).toEqual(['begin', 'end']);
  }, 30_000);

  it('ends an outage exactly once when begin() succeeds, and the invariants hold', async () => {
    const { fixture, calls } = await faultyOutageFixture(false);
    const result = await runInProcessScenario(
      { store: createInMemoryStoreFixture, transport: async () => fixture },
      SCENARIOS['broker-restart'],
      'freeze',
      { seed: 7, timeoutMs: 15_000 },
    );
    expect(result.faultFired).toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.applied).toBe(result.committed);
    expect(calls).toEqual(['begin', 'end']);
  }, 30_000);
});

describe('runInProcessScenario bounds', () => {
  it('names a worker start that hangs, cut to the deadline, instead of waiting for the test runner', async () => {
    const inner = await createInMemoryTransportFixture();
    const hanging: TransportFixture = { ...inner, connect: () => new Promise(() => {}) };
    const startedAt = Date.now();
    // The run keeps 30 s of its deadline for its diagnosis and cleanup: ~3 s are left to wait.
    const error = await runInProcessScenario({ store: createInMemoryStoreFixture, transport: async () => hanging }, SCENARIOS['broker-restart'], 'freeze', {
      seed: 7,
      timeoutMs: 15_000,
      deadline: Date.now() + 33_000,
    }).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect((error as Error).message).toMatch(/the first worker's start \(connect, bus\.start\(\)\) did not finish in \d+ s \(cut short/);
    expect(Date.now() - startedAt).toBeLessThan(15_000);
  }, 40_000);

  it('fails a run that passed its checks when its cleanup hangs, naming the step', async () => {
    const inner = await createInMemoryTransportFixture();
    const unclosable: TransportFixture = { ...inner, close: () => new Promise(() => {}) };
    const error = await runInProcessScenario({ store: createInMemoryStoreFixture, transport: async () => unclosable }, SCENARIOS['after-publish-before-complete'], 'freeze', {
      seed: 7,
      timeoutMs: 15_000,
    }).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect((error as Error).message).toMatch(/the scenario ran to its verdict, but its cleanup hung: closing the transport fixture did not finish in \d+ s/);
    await inner.close();
  }, 60_000);
});

describe('settle', () => {
  /** A world of `count` committed messages whose effects the test writes itself, one every `everyMs`, leaving out `skip`. */
  async function slowWorld(count: number, everyMs: number, skip: ReadonlySet<number> = new Set()) {
    const store = await createInMemoryStoreFixture();
    const transport = await createInMemoryTransportFixture();
    const world = createWorld('tsettle');
    const ledger = new Ledger();
    const ids = Array.from({ length: count }, (_, index) => `m${index}`);
    ids.forEach((id, index) => ledger.commit(id, null, index));
    let next = 0;
    const timer = setInterval(() => {
      const index = next;
      next += 1;
      if (index >= count) return clearInterval(timer);
      if (!skip.has(index)) void store.transaction((tx) => store.recordEffect(tx, ids[index]!));
    }, everyMs);
    return { store, transport, world, ledger, ids, stop: () => clearInterval(timer) };
  }

  it('waits for a run that is slow but moving: each settled message restarts the clock', async () => {
    const { store, transport, world, ledger, stop } = await slowWorld(6, 300);
    try {
      const startedAt = Date.now();
      const { report } = await settle(world, ledger, store, transport.transport, false, 800, { maxMs: 10_000 });
      expect(Date.now() - startedAt).toBeGreaterThan(800);
      expect(report.problems).toEqual([]);
      expect(report.applied).toBe(6);
    } finally {
      stop();
    }
  }, 15_000);

  it('still fails a message that never settles, and names it lost when no fixture finds it', async () => {
    const { store, transport, world, ledger, ids, stop } = await slowWorld(6, 100, new Set([2]));
    try {
      const located = { ...transport, locate: async () => new Map<string, string>() };
      const error = await settle(world, ledger, store, transport.transport, false, 800, { maxMs: 10_000, transport: located }).then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect(error).toBeInstanceOf(Error);
      expect((error as Error).message).toMatch(/1 of 6 committed messages have no end state/);
      expect((error as Error).message).toContain(`message ${ids[2]} has no end state: LOST, found nowhere`);
    } finally {
      stop();
    }
  }, 15_000);

  it('looks again when a read of the end state hangs, and names the read when none answers in time', async () => {
    const { store, transport, world, ledger, stop } = await slowWorld(3, 50);
    try {
      const stalled = { ...store, readEffects: () => new Promise<string[]>(() => {}) };
      const startedAt = Date.now();
      const error = await settle(world, ledger, stalled, transport.transport, false, 2_000, { maxMs: 3_000 }).then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect((error as Error).message).toMatch(/could not be observed .*reading the end state \(effects, dead letters, halted keys\) did not finish in 3 s/);
      // Which of the reads hung, not only that one did.
      expect((error as Error).message).toContain('(still running: store.readEffects())');
      expect(Date.now() - startedAt).toBeLessThan(10_000);
      // A read that hangs for good leaves one more behind at each attempt: the error counts them.
      const piling = await settle(world, ledger, stalled, transport.transport, false, 4_000, { maxMs: 4_000, readTimeoutMs: 500 }).then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect((piling as Error).message).toMatch(/\(still running: store\.readEffects\(\); [1-9]\d* earlier read\(s\) of it never finished either\)/);
      // One stalled read is looked past: the next one answers and the run settles.
      let reads = 0;
      const once = { ...store, readEffects: () => (reads++ === 0 ? new Promise<string[]>(() => {}) : store.readEffects()) };
      const { report } = await settle(world, ledger, once, transport.transport, false, 8_000, { maxMs: 8_000, readTimeoutMs: 1_000 });
      expect(report.applied).toBe(3);
    } finally {
      stop();
    }
  }, 30_000);

  it('says where an unsettled message is when a fixture finds it', async () => {
    const { store, transport, world, ledger, ids, stop } = await slowWorld(3, 50, new Set([1]));
    try {
      const locating = { ...store, locate: async (wanted: readonly string[]) => new Map(wanted.map((id) => [id, `outbox seq 2 pending, attempts 0, due in 90000 ms`] as const)) };
      const error = await settle(world, ledger, locating, transport.transport, false, 500, { transport }).then(
        () => undefined,
        (reason: unknown) => reason,
      );
      expect((error as Error).message).toContain(`message ${ids[1]} has no end state: outbox seq 2 pending, attempts 0, due in 90000 ms`);
      expect((error as Error).message).not.toMatch(/LOST/);
    } finally {
      stop();
    }
  }, 15_000);
});
