// `close()` right after `subscribe()` resolves lands while the subscription's first pull is
// being set up (`consumers.get`, `consume`). An iterator created after the stop signal fired
// used to miss it — its 'abort' listener came too late and `close` could not see it — so it
// pulled forever and `close` never resolved (seen as a 30 s test timeout in a loaded CI run).
import { uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** Resolves with `promise`, or rejects once `ms` passed. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not resolve within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

describe('close right after subscribe', () => {
  it.each([false, true])('resolves promptly, every time (ordered: %s)', async (ordered) => {
    const fixture = await createJetStreamFixture({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const closed: number[] = [];
    for (let round = 0; round < 5; round += 1) {
      const transport = await fixture.connect();
      await transport.subscribe({ consumer: `close-race-${round}`, topics: ['orders.placed'], ordered, concurrency: 2 }, async (delivery) => delivery.ack());
      await within(transport.close(), 10_000, `close of round ${round}`);
      closed.push(round);
    }
    expect(closed).toEqual([0, 1, 2, 3, 4]);
  }, 90_000);
});
