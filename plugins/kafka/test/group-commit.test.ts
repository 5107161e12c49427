// Group commit: publish calls that queue while a produce request is out go together in the
// next request. What must hold: every call gets the answer it would have had alone (a record
// refused for its content fails only its own call's record, and the later records of its key
// in that call), and the calls' order is kept per key. The sendBatch calls are counted on the
// kafkajs producer the transport gets from its client.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import type { Envelope, PublishResult } from '@courier/core';
import type { Kafka, Producer } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

/** A client whose producers count their sendBatch calls (and the records in each). */
function countingClient(testId: string): { client: Kafka; requests: number[] } {
  const client = plainClient(testId);
  const requests: number[] = [];
  const producer = client.producer.bind(client);
  client.producer = (config) => {
    const made: Producer = producer(config);
    const sendBatch = made.sendBatch.bind(made);
    made.sendBatch = (batch) => {
      requests.push(batch.topicMessages?.reduce((sum, topic) => sum + topic.messages.length, 0) ?? 0);
      return sendBatch(batch);
    };
    return made;
  };
  return { client, requests };
}

/** Every `courier-message-id` of a topic with its record key, per partition in offset order, read to the topic's end. */
async function recordsInTopic(testId: string, topic: string): Promise<{ key: string; id: string }[][]> {
  const client = plainClient(`${testId}-reader`);
  const admin = client.admin();
  await admin.connect();
  const ends = new Map((await admin.fetchTopicOffsets(topic)).filter((o) => Number(o.high) > 0).map((o) => [o.partition, Number(o.high)]));
  await admin.disconnect();
  const partitions = new Map<number, { key: string; id: string }[]>();
  if (ends.size === 0) return [];
  const reader = client.consumer({ groupId: `${testId}.reader`, maxWaitTimeInMs: 100 });
  await reader.connect();
  await reader.subscribe({ topics: [topic], fromBeginning: true });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`could not read ${topic} to its end`)), 30_000);
    void reader.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        const list = partitions.get(partition) ?? [];
        partitions.set(partition, list);
        list.push({ key: message.key?.toString() ?? '', id: message.headers?.['courier-message-id']?.toString() ?? '' });
        if (Number(message.offset) + 1 >= (ends.get(partition) ?? 0)) ends.delete(partition);
        if (ends.size === 0) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  await reader.disconnect();
  return [...partitions.values()];
}

const outcome = (results: readonly PublishResult[]) => results.map((result) => [result.messageId, result.ok ? 'ok' : result.error.code]);

let cleanup: (() => Promise<void>) | undefined;
afterEach(async () => {
  await cleanup?.();
  cleanup = undefined;
});

describe('KafkaTransport group commit', () => {
  it('calls queued behind a produce request share the next one; each is confirmed, and per key the calls keep their order', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    const { client, requests } = countingClient(testId);
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG });
    cleanup = async () => {
      await transport.close();
      await deleteTestObjects(testId);
    };
    const topic = 'grouped';
    const envelope = (key: string, call: number): Envelope => makeEnvelope({ topic, key, type: 'kafka.Grouped', payload: JSON.stringify({ key, call }) });
    // Warm: the topic exists and the producer is connected.
    expect((await transport.publish([envelope('warm', -1)]))[0]!.ok).toBe(true);
    requests.length = 0;

    // 8 calls at once, 5 keys each, the same 5 keys in every call.
    const calls = Array.from({ length: 8 }, (_, call) => ['a', 'b', 'c', 'd', 'e'].map((key) => envelope(key, call)));
    const results = await Promise.all(calls.map((messages) => transport.publish(messages)));
    for (const [index, messages] of calls.entries()) expect(outcome(results[index]!)).toEqual(messages.map((m) => [m.messageId, 'ok']));
    // The first call goes out alone; the 7 that queued while it was out share one request.
    expect(requests).toEqual([5, 35]);

    // Per key, the log holds the calls' records once each, in the order of the calls.
    const log = (await recordsInTopic(testId, transport.topicName(topic))).flat();
    for (const key of ['a', 'b', 'c', 'd', 'e']) {
      expect(
        log.filter((record) => record.key === key).map((record) => record.id),
        `key ${key}`,
      ).toEqual(calls.map((messages) => messages.find((m) => m.key === key)!.messageId));
    }
  });

  it('a record the broker refuses in a shared request fails only its own call; the calls sharing the request are confirmed', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    const { client, requests } = countingClient(testId);
    // maxMessageBytes above the topics' max.message.bytes (256 KiB): the 300 KiB record reaches the broker, which refuses it.
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, maxMessageBytes: 700 * 1024 });
    cleanup = async () => {
      await transport.close();
      await deleteTestObjects(testId);
    };
    const topic = 'refused';
    const envelope = (key: string, payload: unknown = { key }): Envelope => makeEnvelope({ topic, key, type: 'kafka.Refused', payload: JSON.stringify(payload) });
    expect((await transport.publish([envelope('warm')]))[0]!.ok).toBe(true);
    requests.length = 0;

    const first = [envelope('p')];
    const before = [envelope('b1'), envelope('b2')];
    const poison = envelope('k', 'x'.repeat(300 * 1024));
    const withPoison = [envelope('k'), poison, envelope('k'), envelope('o')];
    const after = [envelope('a1'), envelope('k')];
    // `first` goes out alone; the other three queue behind it and share the next request.
    const [r1, r2, r3, r4] = await Promise.all([first, before, withPoison, after].map((messages) => transport.publish(messages)));
    expect(outcome(r1!)).toEqual(first.map((m) => [m.messageId, 'ok']));
    expect(outcome(r2!)).toEqual(before.map((m) => [m.messageId, 'ok']));
    expect(outcome(r3!)).toEqual([
      [withPoison[0]!.messageId, 'ok'],
      [poison.messageId, 'PUBLISH_REJECTED'],
      [withPoison[2]!.messageId, 'ABORTED'],
      [withPoison[3]!.messageId, 'ok'],
    ]);
    // Another call's record of the same key is not stopped by the refusal (calls are independent).
    expect(outcome(r4!)).toEqual(after.map((m) => [m.messageId, 'ok']));
    // `first`; the shared request (refused); each of its calls alone (the one with the poison
    // refused again); then that call record by record, its key stopping at the poison.
    expect(requests).toEqual([1, 2 + 4 + 2, 2, 4, 2, 1, 1, 1]);

    const written = new Set((await recordsInTopic(testId, transport.topicName(topic))).flat().map((record) => record.id));
    for (const message of [...first, ...before, withPoison[0]!, withPoison[3]!, ...after]) expect(written.has(message.messageId), `${message.key} is in the log`).toBe(true);
    expect(written.has(poison.messageId)).toBe(false);
    expect(written.has(withPoison[2]!.messageId)).toBe(false);
  });
});
