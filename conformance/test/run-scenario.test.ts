import type { TransportFixture } from '../src/fixtures.js';
import { describe, expect, it } from 'vitest';
import { runInProcessScenario } from '../src/bus/run-scenario.js';
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
    expect((error as Error).message).not.toMatch(/was lost/);
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
