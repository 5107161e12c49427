// Service Bus specifics the shared suites do not reach: throttling pauses the relay instead
// of burning attempts, and a handler that outlives the lock keeps its message.
import type { Delivery, Envelope } from '@courier/core';
import { CONNECTIVITY_CODES, CourierError } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createServiceBusFixture } from './support/fixture.js';
import { STANDIN_LOCK_MS, standIn } from './support/standin-server.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

const fixtureFor = async (testId = uniqueId()) => {
  const fixture = await createServiceBusFixture({ testId });
  closers.push(() => fixture.close());
  return { fixture, testId };
};

describe('ServiceBusTransport', () => {
  it('a throttled namespace (ServiceBusy) makes publish reject retriably, as connectivity: the relay pauses, no attempt is counted', async () => {
    const { server } = await standIn();
    const { fixture, testId } = await fixtureFor();
    const topic = 'orders.placed';
    const envelope: Envelope = makeEnvelope({ topic, key: 'k' });
    server!.throttle(`${testId}.${topic}`, true);
    let failure: unknown;
    try {
      await fixture.transport.publish([envelope]);
    } catch (error) {
      failure = error;
    } finally {
      server!.throttle(`${testId}.${topic}`, false);
    }
    expect(failure).toBeInstanceOf(CourierError);
    expect((failure as CourierError).retriable).toBe(true);
    expect(CONNECTIVITY_CODES).toContain((failure as CourierError).code);
    const [result] = await fixture.transport.publish([envelope]);
    expect(result?.ok).toBe(true);
  });

  it('a handler running for several lock durations keeps its lock (renewed), so no other consumer gets the message meanwhile', async () => {
    const { fixture } = await fixtureFor();
    const topic = 'orders.placed';
    const consumer = 'slow';
    const seen: string[] = [];
    const subscribe = async (name: string, hold: number) => {
      const transport = await fixture.connect();
      await transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async (delivery: Delivery) => {
        seen.push(`${name}@${delivery.attempt}`);
        await new Promise((resolve) => setTimeout(resolve, hold));
        await delivery.ack();
      });
    };
    await subscribe('first', 2.5 * STANDIN_LOCK_MS);
    await subscribe('second', 2.5 * STANDIN_LOCK_MS);
    // Both hold a message for 2.5 lock durations: whichever gets it first keeps it locked.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const [result] = await fixture.transport.publish([makeEnvelope({ topic, key: null })]);
    expect(result?.ok).toBe(true);
    await eventually(() => expect(seen.length).toBeGreaterThan(0), { timeoutMs: 10_000 });
    await new Promise((resolve) => setTimeout(resolve, 3 * STANDIN_LOCK_MS));
    expect(seen, 'the message was handed out again while its first handler still ran').toHaveLength(1);
  }, 40_000);
});
