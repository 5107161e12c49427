// A member flags a record `redelivered` when it lay below the in-hand mark the group had
// committed when the member joined (or, for offsets an earlier release committed without a
// mark, below the partition's log end then). Both are looked up with the admin client; when
// a lookup failed, every record of the partition was once flagged, also those produced long
// after the join, until the next rebalance: a false "suspect" on each one makes the core
// consumer run a backlog one record at a time.
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery } from '@courier/core';
import type { Admin } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, plainClient } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('KafkaTransport suspects after failed lookups at the join', () => {
  it('records produced after the first fetch are not flagged redelivered when the lookup at join failed', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const client = plainClient(testId);
    // The transport's admin client answers everything but the committed-offset and log-end lookups.
    let lookups = 0;
    const adminOf = client.admin.bind(client);
    client.admin = (...args: Parameters<typeof client.admin>): Admin => {
      const admin = adminOf(...args);
      admin.fetchOffsets = async () => {
        lookups += 1;
        throw new Error('injected: the committed-offset lookup failed');
      };
      admin.fetchTopicOffsets = async () => {
        lookups += 1;
        throw new Error('injected: the high-watermark lookup failed');
      };
      return admin;
    };
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, partitions: 1 });
    cleanups.push(() => transport.close());
    const topic = 'marks';
    const flags = new Map<string, boolean>();
    await transport.subscribe({ consumer: 'c', topics: [topic], ordered: false, concurrency: 4 }, async (delivery: Delivery) => {
      flags.set(delivery.envelope.messageId, delivery.redelivered);
      await delivery.ack();
    });
    const envelope = (name: string) => makeEnvelope({ topic, key: name, type: 'kafka.WatermarkLookup', payload: JSON.stringify({ name }) });
    // The first record fetched may be flagged: without the lookup, the log end at the first fetch is the safe bound.
    const first = envelope('first');
    expect((await transport.publish([first]))[0]!.ok).toBe(true);
    await eventually(() => expect(flags.has(first.messageId)).toBe(true), { timeoutMs: 20_000 });
    const later = ['a', 'b', 'c'].map(envelope);
    expect((await transport.publish(later)).every((result) => result.ok)).toBe(true);
    await eventually(() => expect(later.filter((e) => !flags.has(e.messageId))).toEqual([]), { timeoutMs: 20_000 });
    expect(lookups).toBeGreaterThan(0);
    expect(later.map((e) => flags.get(e.messageId)), 'records produced after the first fetch flagged redelivered').toEqual([false, false, false]);
  });
});
