// JetStream counts the naks that hold a retry copy until its not-before as deliveries, so
// `info.redelivered` alone called every delayed retry a redelivery, and the consumer ran
// each one alone (the bus-wide exclusive gate) as a crash-loop suspect. The subscription
// tells its own not-before naks apart; a copy whose holder died is still flagged (the
// transport conformance cases).
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe('redelivered on JetStream', () => {
  it('a delayed retry copy, held back by naks until due, is not flagged redelivered', async () => {
    const testId = uniqueId();
    const fixture = await createJetStreamFixture({ testId });
    closers.push(() => fixture.close());
    const topic = `${testId}.redelivered`;
    const seen: Delivery[] = [];
    const subscription = await fixture.transport.subscribe({ consumer: `${testId}-retry`, topics: [topic], ordered: false, concurrency: 2 }, async (delivery) => {
      seen.push(delivery);
      if (delivery.attempt === 1) await delivery.retry(800, { code: 'TEST_RETRY', message: 'later' });
      else await delivery.ack();
    });
    closers.push(() => subscription.close());
    const results = await fixture.transport.publish([makeEnvelope({ topic, key: null, type: 'test.Redelivered' })]);
    expect(results.every((result) => result.ok)).toBe(true);
    await eventually(() => expect(seen.map((delivery) => delivery.attempt)).toEqual([1, 2]), { timeoutMs: 15_000 });
    expect(seen.map((delivery) => delivery.redelivered)).toEqual([false, false]);
  }, 30_000);
});
