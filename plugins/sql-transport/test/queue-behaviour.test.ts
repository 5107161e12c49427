// What the SQL transport promises beyond the conformance suite: ordered groups scale across
// instances (head-of-key claims, no single active consumer), a topic without groups is
// unroutable until a group is provisioned, and dead letters are pruned in batches.
import type { Delivery, Envelope, Transport } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createSqlTransportFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe.each(['postgresql', 'sqlite'] as const)('sql transport on %s', (dialect) => {
  it('shares an ordered group among instances: both receive, a key is never handled twice at once, and each key keeps publish order', async () => {
    const fixture = await createSqlTransportFixture(dialect)({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    const log: { instance: string; id: string; key: string }[] = [];
    const busyKeys = new Set<string>();
    const overlaps: string[] = [];
    const subscribe = (transport: Transport, instance: string) =>
      transport.subscribe({ consumer: 'ordered-group', topics: [topic], ordered: true, concurrency: 2 }, async (delivery: Delivery) => {
        const key = delivery.envelope.key ?? '';
        if (busyKeys.has(key)) overlaps.push(key);
        busyKeys.add(key);
        log.push({ instance, id: delivery.envelope.messageId, key });
        // Long enough that both instances hold work at once; fewer keys than handler slots,
        // so only the head-of-key rule keeps a key from running twice at once.
        await new Promise((resolve) => setTimeout(resolve, 20));
        busyKeys.delete(key);
        await delivery.ack();
      });
    const first = await fixture.connect();
    const second = await fixture.connect();
    await subscribe(first, 'first');
    await subscribe(second, 'second');
    const published: Envelope[] = Array.from({ length: 80 }, (_, index) => makeEnvelope({ topic, key: `k${index % 3}` }));
    for (let start = 0; start < published.length; start += 10) {
      for (const result of await fixture.transport.publish(published.slice(start, start + 10))) expect(result.ok).toBe(true);
    }
    await eventually(() => expect(new Set(log.map((entry) => entry.id)).size).toBe(80), { timeoutMs: 30_000 });
    expect(new Set(log.map((entry) => entry.instance)), 'both instances of the ordered group received').toEqual(new Set(['first', 'second']));
    expect(overlaps, 'a key was handled by two deliveries at once').toEqual([]);
    for (let key = 0; key < 3; key += 1) {
      const seen = log.filter((entry) => entry.key === `k${key}`).map((entry) => entry.id);
      expect(seen).toEqual(published.filter((envelope) => envelope.key === `k${key}`).map((envelope) => envelope.messageId));
    }
  }, 60_000);

  it('reports a topic without groups as unroutable; once a group is provisioned, it keeps messages for its first subscriber', async () => {
    const fixture = await createSqlTransportFixture(dialect)({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const topic = 'payments.captured';
    const early = makeEnvelope({ topic, key: null });
    const [unroutable] = await fixture.transport.publish([early]);
    expect(unroutable?.ok).toBe(false);
    expect(unroutable && !unroutable.ok && unroutable.error.code).toBe('PUBLISH_UNROUTABLE');
    await fixture.transport.provision({ consumer: 'late', topics: [topic] });
    const kept = makeEnvelope({ topic, key: null });
    const [result] = await fixture.transport.publish([kept]);
    expect(result?.ok).toBe(true);
    const received: string[] = [];
    await fixture.transport.subscribe({ consumer: 'late', topics: [topic], ordered: false, concurrency: 1 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    await eventually(() => expect(received).toEqual([kept.messageId]), { timeoutMs: 15_000 });
  }, 30_000);

  it('prunes dead letters older than the cutoff, in batches, and keeps younger ones', async () => {
    const fixture = await createSqlTransportFixture(dialect)({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    await fixture.transport.subscribe({ consumer: 'dlq', topics: [topic], ordered: false, concurrency: 8 }, (delivery) =>
      delivery.deadLetter({ code: 'TEST', message: 'parked by the test' }),
    );
    const old = Array.from({ length: 5 }, () => makeEnvelope({ topic, key: null }));
    await fixture.transport.publish(old);
    await eventually(async () => expect(await fixture.transport.deadLetters.list('dlq')).toHaveLength(5), { timeoutMs: 15_000 });
    const oldListed = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 600));
    const young = makeEnvelope({ topic, key: null });
    const youngSent = Date.now();
    await fixture.transport.publish([young]);
    await eventually(async () => expect(await fixture.transport.deadLetters.list('dlq')).toHaveLength(6), { timeoutMs: 15_000 });
    // The cutoff is the old letters' age when the prune is asked for, less a few ms for the
    // stored timestamps' rounding: they are older than it however late the prune runs. The young one, dead-lettered 600 ms or more
    // after them, is younger than it unless the prune ran that much late: a fixed cutoff
    // (400 ms) failed on a loaded machine whose list and prune took longer than that.
    const cutoff = Date.now() - oldListed - 5;
    const pruned = await fixture.transport.prune({ olderThanMs: cutoff, batchSize: 2 });
    const left = (await fixture.transport.deadLetters.list('dlq')).map((letter) => letter.envelope.messageId);
    if (Date.now() - youngSent < cutoff) {
      expect(pruned).toBe(5);
      expect(left).toEqual([young.messageId]);
    } else {
      expect(pruned, 'the young letter may have aged past the cutoff while the prune ran').toBe(6 - left.length);
      expect(left).toEqual(left.length === 0 ? [] : [young.messageId]);
    }
  }, 30_000);
});
