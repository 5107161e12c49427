// Topics that do not exist are created with the configured partition count (the producer's
// auto-creation would use the broker's default, 1 here), and existing topics keep theirs.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

describe('KafkaTransport topics', () => {
  it('creates missing topics with the configured partitions, and leaves existing ones as they are', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    const client = plainClient(testId);
    const admin = client.admin();
    await admin.connect();
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, partitions: 5 });
    try {
      await admin.createTopics({ waitForLeaders: true, topics: [{ topic: `${testId}.existing`, numPartitions: 2 }] });
      const results = await transport.publish([
        makeEnvelope({ topic: 'created', key: 'k', type: 'kafka.Topics' }),
        makeEnvelope({ topic: 'existing', key: 'k', type: 'kafka.Topics' }),
      ]);
      expect(results.every((result) => result.ok)).toBe(true);
      await transport.subscribe({ consumer: 'group', topics: ['subscribed'], ordered: false, concurrency: 1 }, (delivery) => delivery.ack());
      const { topics } = await admin.fetchTopicMetadata({ topics: [`${testId}.created`, `${testId}.existing`, `${testId}.subscribed`, `${testId}.courier-retry.group`] });
      expect(Object.fromEntries(topics.map((topic) => [topic.name.slice(testId.length + 1), topic.partitions.length]))).toEqual({
        created: 5,
        existing: 2,
        subscribed: 5,
        'courier-retry.group': 5,
      });
    } finally {
      await transport.close();
      await admin.disconnect();
      await deleteTestObjects(testId);
    }
  });
});
