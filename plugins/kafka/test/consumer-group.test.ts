// Kafka-specific consumer behaviour the conformance suite does not isolate: the committed
// offset never passes a record still in hand (a crash must not lose the record a slow
// handler held while later ones finished), and an ordered group split over two instances
// keeps every key in order when one instance dies and the other takes its partitions.
import { deferred, eventually, makeEnvelope, uniqueId, type TransportFixture } from '@courier/conformance';
import type { Delivery, Envelope, Transport } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createKafkaFixture, plainClient } from './support/fixture.js';

let fixture: TransportFixture | undefined;
afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

async function publishAll(transport: Transport, envelopes: readonly Envelope[]): Promise<void> {
  const results = await transport.publish(envelopes);
  expect(results.every((result) => result.ok)).toBe(true);
}

describe('KafkaTransport consumer groups', () => {
  it('commits only below the lowest unfinished record: a record held while later ones finish comes back after a crash', async () => {
    const testId = uniqueId();
    // One partition: every record shares it, so later acks would move the offset past the held one.
    fixture = await createKafkaFixture({ testId }, { partitions: 1 });
    const topic = `${testId}.floor`;
    const consumer = `${testId}-floor`;
    const envelopes = Array.from({ length: 6 }, (_, index) => makeEnvelope({ topic, key: `k${index}`, type: 'kafka.Floor' }));
    const held = envelopes[0]!;
    const doomed = await fixture.connect();
    const acked: string[] = [];
    const never = deferred();
    await doomed.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 8 }, async (delivery) => {
      if (delivery.envelope.messageId === held.messageId) return never.promise;
      // Counted once the ack (and the offset commit it waits for) is done.
      await delivery.ack();
      acked.push(delivery.envelope.messageId);
    });
    await publishAll(fixture.transport, envelopes);
    await eventually(() => expect(acked).toHaveLength(5), { timeoutMs: 20_000 });
    await fixture.kill(doomed);

    const survivor: Delivery[] = [];
    await fixture.transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 8 }, async (delivery) => {
      survivor.push(delivery);
      await delivery.ack();
    });
    await eventually(() => expect(survivor.map((d) => d.envelope.messageId)).toContain(held.messageId), { timeoutMs: 25_000 });
    expect(survivor.find((d) => d.envelope.messageId === held.messageId)!.attempt).toBe(1);
  });

  it('an ordered group over two instances keeps every key in order when one instance dies', async () => {
    const testId = uniqueId();
    fixture = await createKafkaFixture({ testId });
    const topic = `${testId}.ordered`;
    const consumer = `${testId}-ordered`;
    const keys = Array.from({ length: 8 }, (_, index) => `key-${index}`);
    const seen = new Map<string, string[]>();
    const record = (delivery: Delivery): void => {
      const key = delivery.envelope.key!;
      const list = seen.get(key) ?? [];
      // A copy redelivered after the crash may repeat an id; order is about first sightings.
      if (!list.includes(delivery.envelope.messageId)) list.push(delivery.envelope.messageId);
      seen.set(key, list);
    };
    const first = await fixture.connect();
    const second = await fixture.connect();
    const counts = { first: 0, second: 0 };
    await first.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 4 }, async (delivery) => {
      counts.first += 1;
      record(delivery);
      await delivery.ack();
    });
    await second.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 4 }, async (delivery) => {
      counts.second += 1;
      record(delivery);
      await delivery.ack();
    });
    const expected = new Map<string, string[]>();
    const batch = (count: number): Envelope[] =>
      Array.from({ length: count }, (_, index) => {
        const key = keys[index % keys.length]!;
        const envelope = makeEnvelope({ topic, key, type: 'kafka.Ordered' });
        expected.set(key, [...(expected.get(key) ?? []), envelope.messageId]);
        return envelope;
      });
    await publishAll(fixture.transport, batch(40));
    await eventually(() => expect([...seen.values()].flat()).toHaveLength(40), { timeoutMs: 20_000 });
    expect(counts.first).toBeGreaterThan(0);
    expect(counts.second).toBeGreaterThan(0);

    await fixture.kill(first);
    await publishAll(fixture.transport, batch(40));
    await eventually(
      () => {
        for (const [key, ids] of expected) expect(seen.get(key)).toEqual(ids);
      },
      { timeoutMs: 25_000 },
    );
  });
});

describe('KafkaTransport commit point and records waiting to retry', () => {
  // A record waiting for its retry is unfinished: committing past it (as the acks of records
  // after it would) loses it when its member dies before the retry runs.
  it('never commits past a record waiting to retry in place (ordered); a crash while it waits brings it back', async () => {
    const testId = uniqueId();
    fixture = await createKafkaFixture({ testId }, { partitions: 1 });
    const topic = `${testId}.waiting`;
    const consumer = `${testId}-waiting`;
    const envelopes = Array.from({ length: 5 }, (_, index) => makeEnvelope({ topic, key: `k${index}`, type: 'kafka.Waiting' }));
    const waiting = envelopes[0]!;
    const doomed = await fixture.connect();
    const acked: string[] = [];
    let retried = false;
    await doomed.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 8 }, async (delivery) => {
      if (delivery.envelope.messageId === waiting.messageId) {
        // Far beyond the test: it is still waiting when its member dies.
        await delivery.retry(600_000, { code: 'LATER', message: 'waits' });
        retried = true;
        return;
      }
      await delivery.ack();
      acked.push(delivery.envelope.messageId);
    });
    await publishAll(fixture.transport, envelopes);
    await eventually(() => expect({ retried, acked: acked.length }).toEqual({ retried: true, acked: 4 }), { timeoutMs: 20_000 });
    await fixture.kill(doomed);

    const survivor: Delivery[] = [];
    await fixture.transport.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 8 }, async (delivery) => {
      survivor.push(delivery);
      await delivery.ack();
    });
    await eventually(() => expect(survivor.map((d) => d.envelope.messageId)).toContain(waiting.messageId), { timeoutMs: 25_000 });
  });

  it('never commits the retry topic past a copy waiting for its time while later copies run (unordered)', async () => {
    const testId = uniqueId();
    fixture = await createKafkaFixture({ testId }, { partitions: 1 });
    const topic = `${testId}.waiting-copy`;
    const consumer = `${testId}-waiting-copy`;
    const [waiting, quick] = [makeEnvelope({ topic, key: 'a', type: 'kafka.Waiting' }), makeEnvelope({ topic, key: 'b', type: 'kafka.Waiting' })];
    const runs: string[] = [];
    let quickAcked = false;
    await fixture.transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 8 }, async (delivery) => {
      const { messageId } = delivery.envelope;
      runs.push(`${messageId === waiting.messageId ? 'waiting' : 'quick'}#${delivery.attempt}`);
      if (messageId === waiting.messageId) return delivery.retry(600_000, { code: 'LATER', message: 'waits' });
      if (delivery.attempt === 1) return delivery.retry(0, { code: 'SOON', message: 'again at once' });
      // The ack resolves once its commit is done.
      await delivery.ack();
      quickAcked = true;
    });
    await publishAll(fixture.transport, [waiting]);
    await eventually(() => expect(runs).toContain('waiting#1'), { timeoutMs: 20_000 });
    // The quick message's copy lands on the retry topic after the waiting one's, runs and is acknowledged.
    await publishAll(fixture.transport, [quick]);
    await eventually(() => expect(quickAcked).toBe(true), { timeoutMs: 20_000 });
    const retryTopic = (fixture.transport as unknown as { retryTopic(name: string): string }).retryTopic(consumer);
    const admin = plainClient(`${testId}-offsets`).admin();
    await admin.connect();
    try {
      const ends = await admin.fetchTopicOffsets(retryTopic);
      expect(ends.map((end) => end.high), 'both copies are on the retry topic').toEqual(['2']);
      // The acknowledgement's commit is done: it stopped at the waiting copy (offset 0).
      const [committed] = await admin.fetchOffsets({ groupId: `${testId}.${consumer}`, topics: [retryTopic] });
      expect(BigInt(committed?.partitions[0]?.offset ?? '-1'), 'the retry topic is committed no further than the waiting copy').toBeLessThanOrEqual(0n);
    } finally {
      await admin.disconnect();
    }
    expect(runs.filter((run) => run.startsWith('waiting'))).toEqual(['waiting#1']);
  });
});
