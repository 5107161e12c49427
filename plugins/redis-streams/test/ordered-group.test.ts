// The ordered group's lease, beyond the kit: a holder that closes hands over at once (not
// after orderedLeaseMs), and leaves neither its lease nor its consumer name behind.
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery } from '@courier/core';
import { Redis } from 'ioredis';
import { afterAll, afterEach, expect, it } from 'vitest';
import { createRedisStreamsFixture, redisUrl } from './support/fixture.js';

const inspector = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
inspector.on('error', () => undefined);
const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});
afterAll(() => inspector.disconnect());

it('a holder that closes releases the lease at once: the standby takes over well within orderedLeaseMs, and no consumer name is left', async () => {
  const testId = uniqueId();
  const leaseMs = 10_000;
  const fixture = await createRedisStreamsFixture({ testId }, { orderedLeaseMs: leaseMs });
  closers.push(() => fixture.close());
  const standbyTransport = await fixture.connect();
  const topic = `${testId}.work`;
  const consumer = `${testId}-c`;
  const received: { by: string; delivery: Delivery }[] = [];
  const subscribe = (transport: typeof standbyTransport, by: string) =>
    transport.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 2 }, async (delivery) => {
      received.push({ by, delivery });
      await delivery.ack();
    });
  const holder = await subscribe(fixture.transport, 'holder');
  await eventually(async () => expect(await inspector.exists(`${testId}:lease:${consumer}`)).toBe(1), { timeoutMs: 5_000 });
  const standby = await subscribe(standbyTransport, 'standby');
  closers.push(() => standby.close());
  const publish = async (n: number) => {
    const [result] = await fixture.transport.publish([makeEnvelope({ topic, key: 'k', payload: JSON.stringify({ n }) })]);
    expect(result?.ok).toBe(true);
  };
  await publish(1);
  await eventually(() => expect(received.map((r) => r.by)).toEqual(['holder']), { timeoutMs: 5_000 });
  await holder.close();
  const closedAt = Date.now();
  expect(await inspector.exists(`${testId}:lease:${consumer}`)).toBe(0);
  await publish(2);
  await eventually(() => expect(received.map((r) => r.by)).toEqual(['holder', 'standby']), { timeoutMs: leaseMs });
  // The standby polls the lease every quarter of it; a lease left to expire would take leaseMs.
  expect(Date.now() - closedAt).toBeLessThan(leaseMs * 0.75);
  // The closed holder's consumer name is gone from the group (it held nothing); only the standby's is left.
  const consumers = (await inspector.call('XINFO', 'CONSUMERS', `${testId}:topic:${topic}`, consumer)) as unknown[];
  expect(consumers).toHaveLength(1);
}, 30_000);
