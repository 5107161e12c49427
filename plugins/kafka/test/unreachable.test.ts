// A broker that cannot be reached when the transport starts: publish and subscribe reject
// with a retriable TransportError after the connect timeout, never hang, and the same
// transport works once the broker answers (the bus keeps retrying subscribe meanwhile).
import { TcpProxy, makeEnvelope, uniqueId } from '@courier/conformance';
import { TransportError, isRetriable } from '@courier/core';
import { describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, kafkaBrokers, proxiedClient } from './support/fixture.js';

describe('KafkaTransport with the broker unreachable at start', () => {
  it('rejects publish and subscribe retriably within the connect timeout, then works once the broker answers', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    const [host, port] = kafkaBrokers[0]!.split(':');
    const proxy = await TcpProxy.create({ host: host!, port: Number(port) });
    const transport = new KafkaTransport({ client: proxiedClient(proxy, testId), prefix: `${testId}.`, ...TEST_CONFIG, connectTimeoutMs: 2_000 });
    try {
      const envelope = makeEnvelope({ topic: `${testId}.t`, key: 'k', type: 'kafka.Unreachable' });
      const began = Date.now();
      const publishing = await transport.publish([envelope]).then(() => undefined, (error: unknown) => error);
      expect(publishing).toBeInstanceOf(TransportError);
      expect(isRetriable(publishing)).toBe(true);
      expect(String((publishing as Error).message)).toMatch(/Kafka/);
      const subscribing = await transport
        .subscribe({ consumer: `${testId}-c`, topics: [`${testId}.t`], ordered: false, concurrency: 1 }, (delivery) => delivery.ack())
        .then(() => undefined, (error: unknown) => error);
      expect(subscribing).toBeInstanceOf(TransportError);
      expect(isRetriable(subscribing)).toBe(true);
      // Bounded by the connect timeout (twice: publish, then subscribe), with slack for a loaded machine.
      expect(Date.now() - began).toBeLessThan(20_000);

      await proxy.open();
      const results = await transport.publish([envelope]);
      expect(results).toEqual([{ messageId: envelope.messageId, ok: true }]);
    } finally {
      await transport.close();
      await proxy.close();
      await deleteTestObjects(testId);
    }
  });
});
