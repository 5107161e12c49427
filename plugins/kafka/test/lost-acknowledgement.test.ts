// An acknowledgement lost on the way back while another publish call waits: the broker
// appended the first call's records, the client saw the connection close. kafkajs then
// rolls its idempotent producer's sequence numbers back, and a second call queued behind
// the first on the same producer is sent with those same numbers; the broker takes it for
// a retry of the first batch and answers "written" without appending it. This is how the
// broker-SIGKILL restart test lost messages. The proxy here forwards every request to the
// broker but can hold back its answers, then cut the connections: the exact window a
// broker killed between appending and answering opens.
import { createServer, connect as tcpConnect, type Server, type Socket } from 'node:net';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import { Kafka, logLevel } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, kafkaBrokers, plainClient } from './support/fixture.js';

/** The Kafka API key of Produce requests. */
const PRODUCE = 0;

/** Splits one direction of a Kafka connection into frames (a 4-byte big-endian size, then that many bytes). */
class FrameReader {
  #buffer: Buffer = Buffer.alloc(0);

  /** Calls `onFrame` with each frame `chunk` completes (without its size prefix). */
  push(chunk: Buffer, onFrame: (frame: Buffer) => void): void {
    this.#buffer = this.#buffer.length === 0 ? chunk : Buffer.concat([this.#buffer, chunk]);
    while (this.#buffer.length >= 4) {
      const size = this.#buffer.readInt32BE(0);
      if (this.#buffer.length < 4 + size) return;
      onFrame(this.#buffer.subarray(4, 4 + size));
      this.#buffer = this.#buffer.subarray(4 + size);
    }
  }
}

/**
 * A loopback proxy to the broker that can swallow the broker's answers and cut every
 * connection. It reads the frames going by, so a test can wait for what it needs to have
 * happened (a Produce request sent, its answer come back from the broker) rather than sleep.
 */
class AnswerSwallowingProxy {
  swallow = false;
  /** Produce requests forwarded to the broker. */
  produceRequests = 0;
  /** Answers to Produce requests that came back from the broker while swallowing: each one's records were appended. */
  swallowedProduceAnswers = 0;
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
      // Correlation ids of this connection's Produce requests: an answer carries its request's.
      const produces = new Set<number>();
      const requests = new FrameReader();
      const answers = new FrameReader();
      client.on('data', (chunk: Buffer) => {
        requests.push(chunk, (frame) => {
          // A request: API key (int16), API version (int16), correlation id (int32), ...
          if (frame.readInt16BE(0) !== PRODUCE) return;
          produces.add(frame.readInt32BE(4));
          proxy.produceRequests += 1;
        });
        upstream.write(chunk);
      });
      upstream.on('data', (chunk: Buffer) => {
        const swallowed = proxy.swallow;
        answers.push(chunk, (frame) => {
          // An answer: correlation id (int32), ...
          if (swallowed && produces.has(frame.readInt32BE(0))) proxy.swallowedProduceAnswers += 1;
        });
        if (!swallowed) client.write(chunk);
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

/** Resolves after `ms`. */
const after = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

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
    // Sends that entered kafkajs (sendBatch), counted as they enter.
    let sends = 0;
    const producer = client.producer.bind(client);
    client.producer = (config) => {
      const made = producer(config);
      const sendBatch = made.sendBatch.bind(made);
      made.sendBatch = (batch) => {
        sends += 1;
        return sendBatch(batch);
      };
      return made;
    };
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
    const sentBefore = proxy.produceRequests;
    proxy.swallow = true;
    const began = performance.now();
    const firstCall = transport.publish([first]);
    // The first request is at the broker and appended: its answer came back and was held back.
    await eventually(() => expect(proxy.produceRequests - sentBefore, 'the first call sent its Produce request').toBeGreaterThan(0), { timeoutMs: 20_000 });
    const firstSentMs = performance.now() - began;
    await eventually(() => expect(proxy.swallowedProduceAnswers, 'the broker answered the first request (it appended it)').toBeGreaterThan(0), { timeoutMs: 20_000 });
    const sendsBefore = sends;
    const secondCall = transport.publish([second]);
    // The second call must be waiting behind the first when the connection drops. A transport
    // that lets it into kafkajs shows it entering sendBatch, and from there it reaches the
    // producer's per-broker lock (the first call holds it) without any I/O (the metadata is
    // fresh): one turn of the event loop later it waits there. One that holds it back itself
    // shows nothing, and nothing can show that it will not go out later: then the wait is
    // many times as long as the first call took to get its request out (the second has the
    // same way to go, on the same machine), at least 500 ms.
    const until = performance.now() + Math.max(500, 20 * firstSentMs);
    while (sends === sendsBefore && performance.now() < until) await after(10);
    await new Promise((resolve) => setImmediate(resolve));
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
