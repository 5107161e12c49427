// One active instance per ordered group: NATS 2.9 has no pinned consumers, so the transport
// holds the group with a lease of its own. Two instances of one ordered group: only the
// holder receives; when it dies, the other takes over and every key keeps its order.
import type { Delivery, Envelope, Transport } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe('ordered group (lease)', () => {
  it('only one instance receives; after it is killed the other takes over with per-key order kept', async () => {
    const fixture = await createJetStreamFixture({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    const log: { instance: string; id: string; key: string }[] = [];
    const subscribe = async (transport: Transport, instance: string) =>
      transport.subscribe({ consumer: 'ordered-group', topics: [topic], ordered: true, concurrency: 4 }, async (delivery: Delivery) => {
        log.push({ instance, id: delivery.envelope.messageId, key: delivery.envelope.key ?? '' });
        await delivery.ack();
      });
    const first = await fixture.connect();
    const second = await fixture.connect();
    await subscribe(first, 'first');
    await subscribe(second, 'second');
    const batch = (): Envelope[] => Array.from({ length: 30 }, (_, index) => makeEnvelope({ topic, key: `k${index % 3}` }));
    const published: Envelope[] = [];
    const publish = async (envelopes: Envelope[]) => {
      published.push(...envelopes);
      for (const result of await fixture.transport.publish(envelopes)) expect(result.ok).toBe(true);
    };
    const ids = () => new Set(log.map((entry) => entry.id));

    await publish(batch());
    await eventually(() => expect(ids().size).toBe(30), { timeoutMs: 30_000 });
    const holders = new Set(log.map((entry) => entry.instance));
    expect([...holders], 'both instances of one ordered group received').toHaveLength(1);
    const holder = holders.has('first') ? first : second;
    const standby = holder === first ? 'second' : 'first';

    await fixture.kill(holder);
    await publish(batch());
    await eventually(() => expect(ids().size).toBe(60), { timeoutMs: 40_000 });
    expect(new Set(log.slice(-30).map((entry) => entry.instance))).toEqual(new Set([standby]));
    // Per key, the first delivery of each message follows publish order, across the takeover.
    for (const key of ['k0', 'k1', 'k2']) {
      const firstSeen = [...new Set(log.filter((entry) => entry.key === key).map((entry) => entry.id))];
      expect(firstSeen).toEqual(published.filter((envelope) => envelope.key === key).map((envelope) => envelope.messageId));
    }
  }, 90_000);

  it('a holder that closes hands the group over at once', async () => {
    // A lease long enough that "at once" and "after the lease" lie far apart: a holder that
    // renews every 5 s and did not give the lease back hands over no sooner than 15 s after
    // its close; one that gave it back, at the standby's next try (every 4 s). With the
    // default 6 s lease the two were 1 s apart, less than a loaded machine's publish can take.
    const fixture = await createJetStreamFixture({ testId: uniqueId() }, { orderedLeaseMs: 20_000 });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    const log: string[] = [];
    const first = await fixture.connect();
    const second = await fixture.connect();
    const subscription = await first.subscribe({ consumer: 'g', topics: [topic], ordered: true, concurrency: 1 }, async (delivery) => {
      log.push(`first ${delivery.envelope.messageId}`);
      await delivery.ack();
    });
    const one = makeEnvelope({ topic, key: 'k' });
    await fixture.transport.publish([one]);
    await eventually(() => expect(log).toEqual([`first ${one.messageId}`]), { timeoutMs: 20_000 });
    await second.subscribe({ consumer: 'g', topics: [topic], ordered: true, concurrency: 1 }, async (delivery) => {
      log.push(`second ${delivery.envelope.messageId}`);
      await delivery.ack();
    });
    await subscription.close();
    const closedAt = Date.now();
    const two = makeEnvelope({ topic, key: 'k' });
    await fixture.transport.publish([two]);
    await eventually(() => expect(log).toEqual([`first ${one.messageId}`, `second ${two.messageId}`]), { timeoutMs: 20_000 });
    // Sooner than a lease the closing holder had kept could have run out (15 s): it released it.
    expect(Date.now() - closedAt).toBeLessThan(15_000);
  }, 60_000);
});
