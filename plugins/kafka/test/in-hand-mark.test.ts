// A log keeps no per-record delivery state, so a member learns which records may have been
// in a dead member's hands from a mark the members commit with their offsets: "handed over
// up to offset N" (offset-commit metadata), committed before any record at or past it is
// handed to the handler. Before the mark existed, every record below the log end at the join
// was flagged `redelivered`: a new group's backlog ran one record at a time (the core runs a
// suspect alone, with a crash count written before and dropped after its run).
import { deferred, eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery, Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { encodeRecord } from '../src/record-codec.js';
import { createKafkaFixture, TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

const envelope = (topic: string, name: string): Envelope => makeEnvelope({ topic, key: name, type: 'kafka.InHandMark', payload: JSON.stringify({ name }) });

async function publishOk(transport: KafkaTransport, envelopes: readonly Envelope[]): Promise<void> {
  const results = await transport.publish(envelopes);
  expect(results.filter((result) => !result.ok)).toEqual([]);
}

describe('KafkaTransport redelivered flag from the in-hand mark', () => {
  it("a new group's backlog, published before it joined, comes as first deliveries", async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const transport = new KafkaTransport({ client: plainClient(testId), prefix: `${testId}.`, ...TEST_CONFIG, partitions: 2 });
    cleanups.push(() => transport.close());
    const topic = 'backlog';
    const backlog = Array.from({ length: 20 }, (_, index) => envelope(topic, `k${index}`));
    await publishOk(transport, backlog);
    const flags = new Map<string, boolean>();
    await transport.subscribe({ consumer: 'c', topics: [topic], ordered: false, concurrency: 4 }, async (delivery: Delivery) => {
      flags.set(delivery.envelope.messageId, delivery.redelivered);
      await delivery.ack();
    });
    await eventually(() => expect(flags.size).toBe(backlog.length), { timeoutMs: 20_000 });
    expect(backlog.filter((e) => flags.get(e.messageId)).length, 'backlog records flagged redelivered').toBe(0);
  });

  it('records in the hands of a member that died come to the next member flagged; records produced after it died do not', async () => {
    const testId = uniqueId();
    const fixture = await createKafkaFixture({ testId }, { partitions: 1 });
    cleanups.push(() => fixture.close());
    const transport = fixture.transport as KafkaTransport;
    const topic = 'held';
    const endpoint = { consumer: 'c', topics: [topic], ordered: false, concurrency: 8 };
    const before = Array.from({ length: 5 }, (_, index) => envelope(topic, `b${index}`));
    await publishOk(transport, before);
    const doomed = await fixture.connect();
    const inHand = new Set<string>();
    const never = deferred();
    await doomed.subscribe(endpoint, async (delivery: Delivery) => {
      inHand.add(delivery.envelope.messageId);
      await never.promise;
    });
    await eventually(() => expect(inHand.size).toBe(before.length), { timeoutMs: 20_000 });
    await fixture.kill(doomed);
    const after = Array.from({ length: 3 }, (_, index) => envelope(topic, `a${index}`));
    await publishOk(transport, after);
    const flags = new Map<string, boolean>();
    const survivor = await fixture.connect();
    await survivor.subscribe(endpoint, async (delivery: Delivery) => {
      flags.set(delivery.envelope.messageId, delivery.redelivered);
      await delivery.ack();
    });
    await eventually(() => expect(flags.size).toBe(before.length + after.length), { timeoutMs: 45_000 });
    expect(before.map((e) => flags.get(e.messageId)), 'records the dead member had in hand').toEqual(before.map(() => true));
    expect(after.map((e) => flags.get(e.messageId)), 'records produced after it died').toEqual(after.map(() => false));
  });

  it('a group committed by an earlier release (an offset without a mark) flags the records up to the log end at the join, on every partition without a mark', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const client = plainClient(testId);
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, partitions: 2 });
    cleanups.push(() => transport.close());
    const topic = 'legacy';
    const name = transport.topicName(topic);
    // Partition 0: 4 records, committed at 1 without metadata (as an earlier release commits); partition 1: 2 records, nothing committed.
    const admin = client.admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic: name, numPartitions: 2 }] });
    const zero = Array.from({ length: 4 }, (_, index) => envelope(topic, `p0-${index}`));
    const one = Array.from({ length: 2 }, (_, index) => envelope(topic, `p1-${index}`));
    const producer = client.producer({ idempotent: true, maxInFlightRequests: 1 });
    await producer.connect();
    cleanups.push(() => producer.disconnect());
    await producer.sendBatch({
      acks: -1,
      topicMessages: [{ topic: name, messages: [...zero.map((e) => ({ ...encodeRecord(e), partition: 0 })), ...one.map((e) => ({ ...encodeRecord(e), partition: 1 }))] }],
    });
    await admin.setOffsets({ groupId: transport.groupId('c'), topic: name, partitions: [{ partition: 0, offset: '1' }] });
    const flags = new Map<string, boolean>();
    await transport.subscribe({ consumer: 'c', topics: [topic], ordered: false, concurrency: 4 }, async (delivery: Delivery) => {
      flags.set(delivery.envelope.messageId, delivery.redelivered);
      await delivery.ack();
    });
    const expected = [...zero.slice(1), ...one];
    await eventually(() => expect(expected.filter((e) => !flags.has(e.messageId))).toEqual([]), { timeoutMs: 20_000 });
    expect(expected.map((e) => flags.get(e.messageId)), 'records below the log end at the join').toEqual(expected.map(() => true));
    expect(flags.has(zero[0]!.messageId), 'a record below the committed offset').toBe(false);
    const later = [envelope(topic, 'later-a'), envelope(topic, 'later-b')];
    await publishOk(transport, later);
    await eventually(() => expect(later.filter((e) => !flags.has(e.messageId))).toEqual([]), { timeoutMs: 20_000 });
    expect(later.map((e) => flags.get(e.messageId)), 'records produced after the join').toEqual([false, false]);
  });
});
