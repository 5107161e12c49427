// consumerLag on Kafka (issue 35): per partition of the group's topics, the end offset minus
// the group's committed offset (from the log start where it committed none or retention
// removed records past it). Beyond the kit's case: a subscription commits its start on every
// partition it is assigned (the broker's only record of which topics a group consumes),
// reading commits, joins and creates nothing, and records removed by retention stop counting.
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery, Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('KafkaTransport consumerLag', () => {
  it('counts end minus committed over the group’s topics, null for a group the broker does not have, and reading changes nothing', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const transport = new KafkaTransport({ client: plainClient(testId), prefix: `${testId}.`, ...TEST_CONFIG, partitions: 3 });
    cleanups.push(() => transport.close());
    const admin = plainClient(`${testId}-inspect`).admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());
    const ours = async () => ({
      topics: (await admin.listTopics()).filter((topic) => topic.startsWith(`${testId}.`)).sort(),
      groups: (await admin.listGroups()).groups.map((group) => group.groupId).filter((group) => group.startsWith(`${testId}.`)).sort(),
    });
    const topic = 'orders';
    const group = transport.groupId('billing');

    const nothing = await ours();
    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    expect(await ours(), 'asking about a group the broker does not have created no group and no topic').toEqual(nothing);

    // Subscribed and gone before any record: the start of every assigned partition is committed.
    const received: Envelope[] = [];
    const handle = async (delivery: Delivery) => {
      received.push(delivery.envelope);
      await delivery.ack();
    };
    const first = await transport.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 2 }, handle);
    // Committed before subscribe resolved: closed at once, the group's topics are on record.
    await first.close();
    const committed = await admin.fetchOffsets({ groupId: group });
    expect(committed.map((entry) => [entry.topic, entry.partitions.map((partition) => partition.offset).sort()]).sort()).toEqual(
      [transport.topicName(topic), transport.retryTopic('billing')].sort().map((name) => [name, ['0', '0', '0']]),
    );
    expect(committed.flatMap((entry) => entry.partitions.map((partition) => partition.metadata))).toEqual(Array.from({ length: 6 }, () => 'courier-in-hand:0'));
    expect(await transport.consumerLag('billing')).toBe(0);

    const waiting = Array.from({ length: 6 }, (_, index) => makeEnvelope({ topic, key: `k${index}` }));
    expect((await transport.publish(waiting)).every((result) => result.ok)).toBe(true);
    const offsets = async () => ({
      committed: await admin.fetchOffsets({ groupId: group }),
      state: (await admin.describeGroups([group])).groups.map((described) => [described.state, described.members.length]),
      ...(await ours()),
    });
    const before = await offsets();
    expect(await transport.consumerLag('billing')).toBe(6);
    expect(await transport.consumerLag('billing')).toBe(6);
    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    expect(await offsets(), 'reading committed nothing, joined nothing and created nothing').toEqual(before);

    // Retention removes a partition's records before the group read them: they no longer wait.
    const ends = await admin.fetchTopicOffsets(transport.topicName(topic));
    const fullest = ends.reduce((best, end) => (Number(end.high) > Number(best.high) ? end : best));
    await admin.deleteTopicRecords({ topic: transport.topicName(topic), partitions: [{ partition: fullest.partition, offset: fullest.high }] });
    expect(await transport.consumerLag('billing')).toBe(6 - Number(fullest.high));

    // Back, the group takes what is left, commits, and nothing waits.
    const back = await transport.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 2 }, handle);
    cleanups.push(() => back.close());
    await eventually(() => expect(received).toHaveLength(6 - Number(fullest.high)), { timeoutMs: 20_000 });
    await eventually(async () => expect(await transport.consumerLag('billing')).toBe(0), { timeoutMs: 15_000 });
    const more = [makeEnvelope({ topic, key: 'late' })];
    expect((await transport.publish(more)).every((result) => result.ok)).toBe(true);
    await eventually(() => expect(received.map((envelope) => envelope.messageId)).toContain(more[0]!.messageId), { timeoutMs: 20_000 });
    await eventually(async () => expect(await transport.consumerLag('billing')).toBe(0), { timeoutMs: 15_000 });
  }, 90_000);
});
