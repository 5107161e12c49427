// A topic created a moment ago answers ListOffsets with NOT_LEADER_FOR_PARTITION (Kafka's
// NOT_LEADER_OR_FOLLOWER) until the broker has loaded its partitions, and kafkajs's
// `fetchTopicOffsets` gives up on that error at once. CI saw it end the PostgreSQL + Kafka
// example: its runner listed the payments consumer's dead letters while the worker that had
// just created the dead-letter topic was starting, and `deadLetters.list` threw kafkajs's raw
// error. The broker's window is too short to hit on demand, so the transport's admin clients
// answer the lookup with that error for the first tries here.
import { uniqueId } from '@courier/conformance';
import { TransportError } from '@courier/core';
import { KafkaJSProtocolError, type Admin } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

/** A transport whose admin clients (the shared one and any new one) fail the first `failures` offset lookups as a partition without a ready leader does. */
function transportWithNotReadyLeader(testId: string, failures: number, connectTimeoutMs = TEST_CONFIG.connectTimeoutMs) {
  const client = plainClient(testId);
  const lookups = { count: 0, admins: 0 };
  const adminOf = client.admin.bind(client);
  client.admin = (...args: Parameters<typeof client.admin>): Admin => {
    const admin = adminOf(...args);
    lookups.admins += 1;
    const lookup = admin.fetchTopicOffsets.bind(admin);
    admin.fetchTopicOffsets = async (topic) => {
      lookups.count += 1;
      if (lookups.count <= failures) {
        throw new KafkaJSProtocolError({ type: 'NOT_LEADER_FOR_PARTITION', code: 6, retriable: true, message: 'This server is not the leader for that topic-partition' } as never);
      }
      return await lookup(topic);
    };
    return admin;
  };
  const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, connectTimeoutMs, partitions: 1 });
  cleanups.push(() => transport.close());
  return { transport, lookups };
}

/** Creates the dead-letter topic of `consumer`, as the worker that subscribed it would (`deadLetters.list` creates nothing). */
async function createDeadLetterTopic(transport: KafkaTransport, testId: string, consumer: string): Promise<void> {
  const admin = plainClient(`${testId}-setup`).admin();
  await admin.connect();
  try {
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic: transport.deadLetterTopic(consumer), numPartitions: 1, configEntries: [{ name: 'cleanup.policy', value: 'compact' }] }] });
  } finally {
    await admin.disconnect();
  }
}

describe('KafkaTransport offset lookups on a partition whose leader is not ready', () => {
  it('deadLetters.list asks again (through a new admin client from the third try) instead of failing', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const { transport, lookups } = transportWithNotReadyLeader(testId, 3);
    await createDeadLetterTopic(transport, testId, 'payments');
    await expect(transport.deadLetters.list('payments')).resolves.toEqual([]);
    expect(lookups.count, 'offset lookups: 3 refused, then one answered').toBe(4);
    expect(lookups.admins, 'the shared admin client, then new ones for the third and fourth tries').toBe(3);
  });

  it('a leader still not ready after the connect timeout ends in a TransportError that names the consumer', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const { transport, lookups } = transportWithNotReadyLeader(testId, Number.POSITIVE_INFINITY, 1_500);
    await createDeadLetterTopic(transport, testId, 'payments');
    const failure = await transport.deadLetters.list('payments').then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(TransportError);
    expect((failure as TransportError).retriable).toBe(true);
    expect((failure as Error).message).toMatch(/could not read the dead letters of 'payments'.*not the leader/);
    expect(lookups.count).toBeGreaterThan(2);
  });
});
