// An acknowledgement lost on the way back while another publish call waits: the broker
// appended the first call's records, the client saw the connection close. kafkajs then
// rolls its idempotent producer's sequence numbers back, and a second call queued behind
// the first on the same producer is sent with those same numbers; the broker takes it for
// a retry of the first batch and answers "written" without appending it. This is how the
// broker-SIGKILL restart test lost messages. The proxy here forwards every request to the
// broker but can hold back its answers, then cut the connections: the exact window a
// broker killed between appending and answering opens.
import { createServer, connect as tcpConnect, type Server, type Socket } from 'node:net';
import { makeEnvelope, uniqueId } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import { Kafka, logLevel } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, kafkaBrokers, plainClient } from './support/fixture.js';

/** A loopback proxy to the broker that can swallow the broker's answers and cut every connection. */
class AnswerSwallowingProxy {
  swallow = false;
  readonly #server: Server;
  readonly #pairs = new Set<[Socket, Socket]>();

  private constructor(server: Server) {
    this.#server = server;
  }

  static async start(target: { host: string; port: number }): Promise<AnswerSwallowingProxy> {
    const server = createServer((client) => {
      const upstream = tcpConnect(target);
      const pair: [Socket, Socket] = [client, upstream];
      proxy.#pairs.add(pair);
      const end = (): void => {
        client.destroy();
        upstream.destroy();
        proxy.#pairs.delete(pair);
      };
      client.on('data', (chunk) => upstream.write(chunk));
      upstream.on('data', (chunk) => {
        if (!proxy.swallow) client.write(chunk);
      });
      for (const socket of pair) {
        socket.on('error', end);
        socket.on('close', end);
      }
    });
    // Connections arrive only after listen(), when `proxy` is set.
    const proxy = new AnswerSwallowingProxy(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    const address = this.#server.address();
    return typeof address === 'object' && address ? address.port : 0;
  }

  /** Cuts every open connection (clients reconnect through the proxy). */
  cut(): void {
    for (const [client, upstream] of [...this.#pairs]) {
      client.destroy();
      upstream.destroy();
    }
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Every `courier-message-id` in a topic, read from its start to its current end. */
async function idsInTopic(testId: string, topic: string): Promise<string[]> {
  const client = plainClient(`${testId}-reader`);
  const admin = client.admin();
  await admin.connect();
  const ends = new Map((await admin.fetchTopicOffsets(topic)).filter((o) => Number(o.high) > 0).map((o) => [o.partition, Number(o.high)]));
  await admin.disconnect();
  const ids: string[] = [];
  if (ends.size === 0) return ids;
  const reader = client.consumer({ groupId: `${testId}.reader`, maxWaitTimeInMs: 100 });
  await reader.connect();
  await reader.subscribe({ topics: [topic], fromBeginning: true });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`could not read ${topic} to its end`)), 20_000);
    void reader.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        const id = message.headers?.['courier-message-id']?.toString();
        if (id !== undefined) ids.push(id);
        if (Number(message.offset) + 1 >= (ends.get(partition) ?? 0)) ends.delete(partition);
        if (ends.size === 0) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  await reader.disconnect();
  return ids;
}

let cleanup: (() => Promise<void>) | undefined;
afterEach(async () => {
  await cleanup?.();
  cleanup = undefined;
});

describe('KafkaTransport publish when an acknowledgement is lost', () => {
  it('a call waiting behind one whose answer was lost is written, not taken for its duplicate', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    const [host, port] = kafkaBrokers[0]!.split(':');
    const proxy = await AnswerSwallowingProxy.start({ host: host!, port: Number(port) });
    const client = new Kafka({
      clientId: testId,
      brokers: kafkaBrokers,
      connectionTimeout: 2_000,
      requestTimeout: 30_000,
      retry: { retries: 5, initialRetryTime: 200, maxRetryTime: 1_000 },
      logLevel: logLevel.NOTHING,
      // Every socket (the bootstrap and the advertised address alike) goes through the proxy.
      socketFactory: ({ onConnect }) => tcpConnect({ host: '127.0.0.1', port: proxy.port }, onConnect),
    });
    // One partition: both calls' records share it, and both batches hold one record, so
    // their sequence ranges are equal; that is what the broker's duplicate check compares.
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, partitions: 1, publishTimeoutMs: 30_000 });
    cleanup = async () => {
      await transport.close();
      await proxy.close();
      await deleteTestObjects(testId);
    };
    const topic = 'acks';
    const envelope = (name: string): Envelope => makeEnvelope({ topic, key: name, type: 'kafka.LostAck', payload: JSON.stringify({ name }) });
    // Warm: the topic exists, the producer has its id, the metadata is known.
    expect((await transport.publish([envelope('warm')]))[0]!.ok).toBe(true);

    const first = envelope('first');
    const second = envelope('second');
    proxy.swallow = true;
    const firstCall = transport.publish([first]);
    // The first request is at the broker (appended); its answer is held back.
    await sleep(500);
    const secondCall = transport.publish([second]);
    await sleep(500);
    // The connection drops before the answer: what a broker SIGKILLed after appending does.
    proxy.swallow = false;
    proxy.cut();
    const results = [...(await firstCall.catch(() => [])), ...(await secondCall.catch(() => []))];

    const written = await idsInTopic(testId, transport.topicName(topic));
    const confirmed = results.filter((result) => result.ok).map((result) => result.messageId);
    // At least once: every message publish confirmed is in the log (copies are allowed).
    for (const id of confirmed) expect(written, `confirmed message ${id === first.messageId ? 'first' : 'second'} is not in the log`).toContain(id);
    // The run proves something only if the second call was confirmed at all.
    expect(confirmed).toContain(second.messageId);
  });
});
