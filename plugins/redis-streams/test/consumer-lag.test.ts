// consumerLag on Redis Streams (issue 35): XINFO GROUPS `lag` of the consumer's group, summed
// over the topic streams under the prefix and the consumer's retry stream. Beyond the kit's
// case: a group on two topics, reading leaves every key, group and pending list as it was,
// and a lag Redis cannot tell is an error naming why, never a made-up number.
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { TransportError, type Delivery } from '@courier/core';
import { Redis } from 'ioredis';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { createRedisStreamsFixture, redisUrl } from './support/fixture.js';

const inspector = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
inspector.on('error', () => undefined);
const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});
afterAll(() => inspector.disconnect());

/** Every key under the test's prefix with its type, and each stream's groups (XINFO GROUPS) and length: what a passive read must leave as it was. */
async function snapshot(prefix: string): Promise<Record<string, unknown>> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, found] = await inspector.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
    keys.push(...found);
    cursor = next;
  } while (cursor !== '0');
  keys.sort();
  const state: Record<string, unknown> = {};
  for (const key of keys) {
    const type = await inspector.type(key);
    state[key] = type === 'stream' ? { groups: await inspector.call('XINFO', 'GROUPS', key), length: await inspector.xlen(key) } : type;
  }
  return state;
}

describe('redis-streams consumerLag', () => {
  it('sums the group’s lag over its topic streams and retry stream, null for a group on none, and reading changes nothing', async () => {
    const testId = uniqueId();
    const fixture = await createRedisStreamsFixture({ testId });
    closers.push(() => fixture.close());
    const transport = fixture.transport;
    const topics = [`${testId}.orders`, `${testId}.payments`];
    const consumer = `${testId}-billing`;

    const empty = await snapshot(testId);
    expect(await transport.consumerLag!('never-subscribed')).toBeNull();
    expect(await transport.consumerLag!('never-subscribed')).toBeNull();
    expect(await snapshot(testId), 'asking about a group that does not exist created nothing').toEqual(empty);

    const received: string[] = [];
    const handle = async (delivery: Delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    };
    const first = await transport.subscribe({ consumer, topics, ordered: false, concurrency: 2 }, handle);
    expect(await transport.consumerLag!(consumer)).toBe(0);
    await first.close();
    // Another group on the same streams: its lag is its own.
    await (await transport.subscribe({ consumer: `${testId}-audit`, topics: [topics[0]!], ordered: false, concurrency: 1 }, (delivery) => delivery.ack())).close();

    const orders = [makeEnvelope({ topic: topics[0]!, key: null }), makeEnvelope({ topic: topics[0]!, key: null })];
    const payments = [makeEnvelope({ topic: topics[1]!, key: null }), makeEnvelope({ topic: topics[1]!, key: null }), makeEnvelope({ topic: topics[1]!, key: null })];
    expect((await transport.publish([...orders, ...payments])).every((result) => result.ok)).toBe(true);
    const before = await snapshot(testId);
    expect(await transport.consumerLag!(consumer)).toBe(5);
    expect(await transport.consumerLag!(consumer)).toBe(5);
    expect(await transport.consumerLag!(`${testId}-audit`)).toBe(2);
    expect(await transport.consumerLag!('never-subscribed')).toBeNull();
    expect(await snapshot(testId), 'reading moved no group, pending list or entry, and created no key').toEqual(before);

    // Back, the group gets all five, and then nothing waits.
    const back = await transport.subscribe({ consumer, topics, ordered: false, concurrency: 2 }, handle);
    closers.push(() => back.close());
    await eventually(() => expect(received.sort()).toEqual([...orders, ...payments].map((envelope) => envelope.messageId).sort()), { timeoutMs: 15_000 });
    await eventually(async () => expect(await transport.consumerLag!(consumer)).toBe(0), { timeoutMs: 15_000 });
    await back.close();

    // An entry deleted past where the group has read: Redis answers nil for the lag, and so
    // does no number here.
    const [deleted, kept] = [makeEnvelope({ topic: topics[0]!, key: null }), makeEnvelope({ topic: topics[0]!, key: null })];
    expect((await transport.publish([deleted, kept])).every((result) => result.ok)).toBe(true);
    const [entry] = (await inspector.xrange(`${testId}:topic:${topics[0]!}`, '-', '+')).slice(-2);
    await inspector.xdel(`${testId}:topic:${topics[0]!}`, entry![0]);
    const refusal = await transport.consumerLag!(consumer).catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(TransportError);
    expect((refusal as Error).message).toContain(`Redis cannot tell the lag of group '${consumer}' on '${testId}:topic:${topics[0]!}'`);
  }, 60_000);

  it('after trimming (maxLen) counts what the stream still holds for the group, not what was trimmed away', async () => {
    const testId = uniqueId();
    const fixture = await createRedisStreamsFixture({ testId }, { maxLen: 50 });
    closers.push(() => fixture.close());
    const topic = `${testId}.orders`;
    await (await fixture.transport.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 1 }, (delivery) => delivery.ack())).close();
    // `MAXLEN ~` trims whole nodes of the stream (100 entries each by default): publish past a few.
    for (let batch = 0; batch < 5; batch += 1) {
      const results = await fixture.transport.publish(Array.from({ length: 100 }, () => makeEnvelope({ topic, key: null })));
      expect(results.every((result) => result.ok)).toBe(true);
    }
    const held = await inspector.xlen(`${testId}:topic:${topic}`);
    expect(held, 'the stream was trimmed').toBeLessThan(500);
    expect(await fixture.transport.consumerLag!('billing')).toBe(held);
  }, 60_000);

  it('takes the prefix literally: glob characters in it match no other prefix’s streams', async () => {
    const testId = uniqueId();
    // As a SCAN pattern, `<id>?` would also match `<id>X`, and `<id>[*]` `<id>*`.
    const [globbed, other] = await Promise.all([createRedisStreamsFixture({ testId: `${testId}?` }), createRedisStreamsFixture({ testId: `${testId}X` })]);
    closers.push(() => globbed.close(), () => other.close());
    for (const fixture of [globbed, other]) {
      await (await fixture.transport.subscribe({ consumer: 'billing', topics: ['orders'], ordered: false, concurrency: 1 }, (delivery) => delivery.ack())).close();
    }
    expect((await other.transport.publish([makeEnvelope({ topic: 'orders', key: null }), makeEnvelope({ topic: 'orders', key: null })])).every((result) => result.ok)).toBe(true);
    expect(await other.transport.consumerLag!('billing')).toBe(2);
    expect(await globbed.transport.consumerLag!('billing')).toBe(0);
  }, 60_000);
});
