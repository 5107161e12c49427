// What lies beyond the kit's contract: the Redis objects behind redelivery, delayed retries,
// dead letters and trimming, and the configuration checks.
import { eventually, makeEnvelope, uniqueId, type TransportFixture } from '@courier/conformance';
import { ConfigError, type Delivery, type Subscription, type Transport } from '@courier/core';
import { Redis } from 'ioredis';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { RedisStreamsTransport } from '../src/index.js';
import { CLAIM_IDLE_MS, createRedisStreamsFixture, redisUrl } from './support/fixture.js';

const inspector = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
inspector.on('error', () => undefined);
const closers: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});
afterAll(() => inspector.disconnect());

async function setup(settings: Parameters<typeof createRedisStreamsFixture>[1] = {}) {
  const testId = uniqueId();
  const fixture: TransportFixture = await createRedisStreamsFixture({ testId }, settings);
  closers.push(() => fixture.close());
  const topic = `${testId}.work`;
  const consumer = `${testId}-c`;
  const received: { delivery: Delivery; at: number; by: Transport }[] = [];
  const subscribe = async (transport: Transport, handle: (delivery: Delivery) => Promise<void>, ordered = false): Promise<Subscription> =>
    transport.subscribe({ consumer, topics: [topic], ordered, concurrency: 4 }, async (delivery) => {
      received.push({ delivery, at: Date.now(), by: transport });
      await handle(delivery);
    });
  const publish = async (n: number, key: string | null = null) => {
    const envelope = makeEnvelope({ topic, key, payload: JSON.stringify({ n }) });
    const [result] = await fixture.transport.publish([envelope]);
    expect(result?.ok).toBe(true);
    return envelope;
  };
  return { testId, fixture, topic, consumer, received, subscribe, publish };
}

describe('redis-streams consuming', () => {
  it('a handler running longer than claimIdleMs keeps its delivery: the heartbeat renews it, no other instance claims it', async () => {
    const { fixture, received, subscribe, publish } = await setup();
    const other = await fixture.connect();
    closers.push(() => other.close());
    let release!: () => void;
    const slow = new Promise<void>((resolve) => (release = resolve));
    await subscribe(fixture.transport, async (delivery) => {
      await slow;
      await delivery.ack();
    });
    await subscribe(other, (delivery) => delivery.ack());
    const envelope = await publish(1);
    await eventually(() => expect(received).toHaveLength(1), { timeoutMs: 5_000 });
    // Without the heartbeat the other instance's XAUTOCLAIM takes it after claimIdleMs.
    await new Promise((resolve) => setTimeout(resolve, CLAIM_IDLE_MS * 2.5));
    release();
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(received.map((r) => r.delivery.envelope.messageId)).toEqual([envelope.messageId]);
  }, 30_000);

  it("a dead instance's delivery is claimed after claimIdleMs by a live one (XAUTOCLAIM), attempt unchanged, flagged redelivered", async () => {
    const { fixture, received, subscribe, publish, topic, consumer, testId } = await setup();
    const doomed = await fixture.connect();
    await subscribe(doomed, () => new Promise<void>(() => undefined));
    const envelope = await publish(1);
    await eventually(() => expect(received).toHaveLength(1), { timeoutMs: 5_000 });
    const killedAt = Date.now();
    await fixture.kill(doomed);
    await subscribe(fixture.transport, (delivery) => delivery.ack());
    await eventually(() => expect(received).toHaveLength(2), { timeoutMs: CLAIM_IDLE_MS * 5 });
    const [, second] = received;
    expect(second!.by).toBe(fixture.transport);
    expect(second!.delivery.envelope.messageId).toBe(envelope.messageId);
    expect(second!.delivery.redelivered).toBe(true);
    expect(second!.delivery.attempt).toBe(1);
    // Not before the entry had been idle for claimIdleMs (it was read just before the kill).
    expect(second!.at - killedAt).toBeGreaterThanOrEqual(CLAIM_IDLE_MS - 500);
    await eventually(async () => expect(await inspector.xpending(`${testId}:topic:${topic}`, consumer)).toEqual([0, null, null, null]), { timeoutMs: 5_000 });
  }, 30_000);

  it('an unordered retry waits in the due set (scored by the server clock), comes back through the retry stream with attempt + 1, and leaves nothing behind', async () => {
    const { fixture, received, subscribe, publish, consumer, testId } = await setup();
    const delayed = `${testId}:delayed:${consumer}`;
    const retryStream = `${testId}:retry:${consumer}`;
    await subscribe(fixture.transport, async (delivery) => {
      if (delivery.attempt === 1) await delivery.retry(1_500, { code: 'HANDLER_FAILED', message: 'again' });
      else await delivery.ack();
    });
    const envelope = await publish(1);
    await eventually(() => expect(received).toHaveLength(1), { timeoutMs: 5_000 });
    const [seconds, micros] = (await inspector.time()).map(Number) as [number, number];
    const serverNow = seconds * 1_000 + Math.floor(micros / 1_000);
    const members = await inspector.zrange(delayed, 0, -1, 'WITHSCORES');
    expect(members).toHaveLength(2);
    const [member, score] = members as [string, string];
    // "<unique>|<attempt>|<replayed>|<envelope JSON>": the envelope text as it was published.
    expect(member.split('|').slice(1, 3)).toEqual(['2', '0']);
    expect(JSON.parse(member.slice(member.indexOf('{'))).messageId).toBe(envelope.messageId);
    expect(Number(score) - serverNow).toBeGreaterThan(1_000);
    expect(Number(score) - serverNow).toBeLessThanOrEqual(1_500);
    await eventually(() => expect(received).toHaveLength(2), { timeoutMs: 5_000 });
    const [first, second] = received;
    expect(second!.delivery.attempt).toBe(2);
    expect(second!.delivery.redelivered).toBe(false);
    expect(second!.at - first!.at).toBeGreaterThanOrEqual(1_400);
    // The due set is empty and the settled retry-stream entry deleted.
    await eventually(async () => {
      expect(await inspector.zcard(delayed)).toBe(0);
      expect(await inspector.xlen(retryStream)).toBe(0);
    }, { timeoutMs: 5_000 });
  }, 30_000);

  it('a due retry is kept by Redis, not by the process: a later instance of the group gets it after the first one closed', async () => {
    const { fixture, received, subscribe, publish } = await setup();
    const first = await fixture.connect();
    const subscription = await subscribe(first, (delivery) => delivery.retry(1_000, { code: 'HANDLER_FAILED', message: 'later' }));
    await publish(1);
    await eventually(() => expect(received).toHaveLength(1), { timeoutMs: 5_000 });
    await subscription.close();
    await first.close();
    await subscribe(fixture.transport, (delivery) => delivery.ack());
    await eventually(() => expect(received).toHaveLength(2), { timeoutMs: 5_000 });
    expect(received[1]!.by).toBe(fixture.transport);
    expect(received[1]!.delivery.attempt).toBe(2);
  }, 30_000);

  it('an entry that is not an envelope is dead-lettered ENVELOPE_INVALID, never handed to the handler, and left out of the list', async () => {
    const { fixture, received, subscribe, publish, topic, consumer, testId } = await setup();
    await subscribe(fixture.transport, (delivery) => delivery.ack());
    await inspector.xadd(`${testId}:topic:${topic}`, '*', 'envelope', '{"not":"an envelope"}');
    await publish(2);
    await eventually(async () => expect(await inspector.xlen(`${testId}:dead:${consumer}`)).toBe(1), { timeoutMs: 5_000 });
    await eventually(() => expect(received).toHaveLength(1), { timeoutMs: 5_000 });
    const [[, fields]] = (await inspector.xrange(`${testId}:dead:${consumer}`, '-', '+')) as [[string, string[]]];
    expect(fields).toContain('ENVELOPE_INVALID');
    expect(fields).toContain('{"not":"an envelope"}');
    expect(await fixture.transport.deadLetters!.list(consumer)).toEqual([]);
  }, 30_000);

  it('maxLen trims each topic stream at publish (XADD MAXLEN ~)', async () => {
    const { fixture, topic, testId } = await setup({ maxLen: 10 });
    for (let batch = 0; batch < 5; batch += 1) {
      const results = await fixture.transport.publish(Array.from({ length: 100 }, (_, n) => makeEnvelope({ topic, payload: JSON.stringify({ n }) })));
      expect(results.every((result) => result.ok)).toBe(true);
    }
    // Approximate trimming keeps whole radix-tree nodes (100 entries each by default): far below 500.
    expect(await inspector.xlen(`${testId}:topic:${topic}`)).toBeLessThan(250);
  }, 30_000);

  it('a list of a consumer with nothing creates nothing', async () => {
    const { fixture, testId } = await setup();
    expect(await fixture.transport.deadLetters!.list(`${testId}-nobody`)).toEqual([]);
    expect(await fixture.transport.deadLetters!.replay(`${testId}-nobody`, ['1-0', 'not an id'])).toBe(0);
    expect(await fixture.transport.deadLetters!.purge(`${testId}-nobody`, ['1-0'])).toBe(0);
    expect(await inspector.keys(`${testId}:*`)).toEqual([]);
  });
});

describe('redis-streams subscribe', () => {
  it('rejects non-retriably when a topic key exists and is not a stream (no retry fixes it)', async () => {
    const { fixture, topic, consumer, testId } = await setup();
    await inspector.set(`${testId}:topic:${topic}`, 'not a stream');
    const error = await fixture.transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async () => undefined).then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toMatchObject({ name: 'TransportError', retriable: false });
    expect((error as Error).message).toContain(`${testId}:topic:${topic}`);
  });
});

describe('redis-streams configuration', () => {
  it('lists every problem at once in a ConfigError', () => {
    let error: unknown;
    try {
      new RedisStreamsTransport({ connection: 'redis://x' as never, prefix: 'a b', claimIdleMs: 100, blockMs: -1, maxLen: 1.5 });
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems;
    expect(problems).toHaveLength(5);
    for (const name of ['connection', 'prefix', 'claimIdleMs', 'blockMs', 'maxLen']) expect(problems.some((problem) => problem.includes(`'${name}'`))).toBe(true);
  });
});
