// An ordered record whose partition was taken away from its member mid-run and came back
// while it still ran, and which then asks for a retry: the key's records must flow again.
// A running record stays in front of its key through a rebalance; the records of the key
// fetched again after the partition came back queue behind it. When its retry became due
// it was abandoned (its assignment was revoked) but left in front, so they waited forever.
import { TcpProxy, deferred, eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, kafkaBrokers, proxiedClient } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

/** A transport whose kafkajs client id is `clientId` (the round-robin assignor orders members by it) behind a proxy of its own. */
async function member(testId: string, clientId: string, options: { holdsForever?: boolean } = {}): Promise<{ transport: KafkaTransport; proxy: TcpProxy }> {
  const [host, port] = kafkaBrokers[0]!.split(':');
  const proxy = await TcpProxy.create({ host: host!, port: Number(port) });
  await proxy.open();
  const transport = new KafkaTransport({ client: proxiedClient(proxy, clientId), prefix: `${testId}.`, ...TEST_CONFIG, partitions: 1 });
  cleanups.push(async () => {
    await proxy.close();
    // close waits for running handlers: one that never settles is not waited for.
    if (options.holdsForever) void transport.close();
    else await transport.close();
  });
  return { transport, proxy };
}

describe('KafkaTransport ordered retry across a rebalance', () => {
  it('a record retried after its partition moved away does not block its key when the partition comes back', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const topic = 'revoked';
    const consumer = `${testId}-c`;
    const endpoint = { consumer, topics: [topic], ordered: true, concurrency: 1 };
    // One partition, and member ids start with the client id: "b…" sorts before "z…", so
    // the round-robin assignor gives the partition to the second member while both are in.
    const first = await member(testId, `z-${testId}`);
    const second = await member(testId, `b-${testId}`, { holdsForever: true });

    const envelopes = ['one', 'two'].map((name) => makeEnvelope({ topic, key: 'k', type: 'kafka.RevokedRetry', payload: JSON.stringify({ name }) }));
    const [one, two] = envelopes as [typeof envelopes[0], typeof envelopes[0]];
    const release = deferred();
    const running = deferred();
    const acked: string[] = [];
    let firstRun = true;
    await first.transport.subscribe(endpoint, async (delivery: Delivery) => {
      if (firstRun && delivery.envelope.messageId === one.messageId) {
        firstRun = false;
        running.resolve();
        await release.promise;
        // The partition went away and came back meanwhile: this retry is for a record of a revoked assignment.
        await delivery.retry(100, { code: 'TEST', message: 'retry after the partition moved' });
        return;
      }
      await delivery.ack();
      acked.push(delivery.envelope.messageId);
    });
    expect((await first.transport.publish(envelopes)).every((result) => result.ok)).toBe(true);
    await running.promise;

    // The second member joins and takes the partition; it holds what it gets, settling nothing.
    const taken = deferred();
    await second.transport.subscribe(endpoint, async () => {
      taken.resolve();
      await new Promise(() => undefined);
    });
    await Promise.race([
      taken.promise,
      new Promise((_, reject) => setTimeout(() => reject(new Error('the partition did not move to the second member (assignor order?)')), 30_000)),
    ]);
    // The second member dies: after its session timeout the partition comes back to the
    // first, which fetches the key's records again and queues them behind the record still
    // running there from before.
    await second.proxy.close();
    await new Promise((resolve) => setTimeout(resolve, TEST_CONFIG.sessionTimeoutMs + 5_000));
    // Only now does that old run ask for its retry.
    release.resolve();
    await eventually(() => expect(acked).toEqual([one.messageId, two.messageId]), { timeoutMs: 30_000, intervalMs: 100 });
  });
});
