// A kafkajs consumer that crashes with an error kafkajs does not restart after. kafkajs
// restarts a crashed consumer only for errors it deems retriable; when a rejoin's
// FindCoordinator request fails (a broker restarting, a connection cut mid-request) it gives
// up with KafkaJSGroupCoordinatorNotFound, which is not, and the consumer stays down: the
// records stay in the log, never consumed. This is how the broker-SIGKILL restart test lost
// messages after the producer was fixed. The proxy here forwards everything, but when armed
// cuts the connection that carries the next FindCoordinator request; a second member joining
// makes the first rejoin, and so look its coordinator up again.
import { createServer, connect as tcpConnect, type Server, type Socket } from 'node:net';
import { deferred, eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery } from '@courier/core';
import { Kafka, logLevel, type Consumer, type ConsumerConfig } from 'kafkajs';
import { afterEach, describe, expect, it } from 'vitest';
import { KafkaTransport } from '../src/index.js';
import { TEST_CONFIG, assertBrokerAnswers, deleteTestObjects, kafkaBrokers, plainClient } from './support/fixture.js';

const FIND_COORDINATOR = 10;

/** A loopback proxy to the broker that, once armed, cuts the connection of the next FindCoordinator request. */
class CoordinatorCuttingProxy {
  armed = false;
  /** FindCoordinator requests cut so far. */
  cuts = 0;
  readonly #server: Server;
  readonly #pairs = new Set<[Socket, Socket]>();

  private constructor(server: Server) {
    this.#server = server;
  }

  static async start(target: { host: string; port: number }): Promise<CoordinatorCuttingProxy> {
    const server = createServer((client) => {
      const upstream = tcpConnect(target);
      const pair: [Socket, Socket] = [client, upstream];
      proxy.#pairs.add(pair);
      const end = (): void => {
        client.destroy();
        upstream.destroy();
        proxy.#pairs.delete(pair);
      };
      // Requests are framed (int32 size, then int16 api key): forward whole frames, so an
      // armed proxy can drop the connection before a FindCoordinator reaches the broker.
      let pending = Buffer.alloc(0);
      client.on('data', (chunk: Buffer) => {
        pending = Buffer.concat([pending, chunk]);
        while (pending.length >= 6 && pending.length >= 4 + pending.readInt32BE(0)) {
          const size = 4 + pending.readInt32BE(0);
          const frame = pending.subarray(0, size);
          pending = pending.subarray(size);
          if (proxy.armed && frame.readInt16BE(4) === FIND_COORDINATOR) {
            proxy.armed = false;
            proxy.cuts += 1;
            end();
            return;
          }
          upstream.write(frame);
        }
      });
      upstream.on('data', (chunk) => client.write(chunk));
      for (const socket of pair) {
        socket.on('error', end);
        socket.on('close', end);
      }
    });
    // Connections arrive only after listen(), when `proxy` is set.
    const proxy = new CoordinatorCuttingProxy(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    const address = this.#server.address();
    return typeof address === 'object' && address ? address.port : 0;
  }

  async close(): Promise<void> {
    for (const [client, upstream] of [...this.#pairs]) {
      client.destroy();
      upstream.destroy();
    }
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

/** A member whose client goes through a {@link CoordinatorCuttingProxy}, and the `CRASH` events of the consumers the transport creates. */
async function crashableMember(testId: string): Promise<{ client: Kafka; proxy: CoordinatorCuttingProxy; crashes: { error: string; restart: boolean }[] }> {
  const [host, port] = kafkaBrokers[0]!.split(':');
  const proxy = await CoordinatorCuttingProxy.start({ host: host!, port: Number(port) });
  cleanups.push(() => proxy.close());
  const client = new Kafka({
    clientId: testId,
    brokers: kafkaBrokers,
    connectionTimeout: 2_000,
    requestTimeout: 10_000,
    retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1_000 },
    logLevel: logLevel.NOTHING,
    socketFactory: ({ onConnect }) => tcpConnect({ host: '127.0.0.1', port: proxy.port }, onConnect),
  });
  // The crash itself is kafkajs' to report: watch the consumer the transport creates.
  const crashes: { error: string; restart: boolean }[] = [];
  const consumerOf = client.consumer.bind(client);
  client.consumer = (config: ConsumerConfig): Consumer => {
    const consumer = consumerOf(config);
    consumer.on(consumer.events.CRASH, (event) => crashes.push({ error: event.payload.error.name, restart: event.payload.restart }));
    return consumer;
  };
  return { client, proxy, crashes };
}

describe('KafkaTransport consumer crashes', () => {
  it('a consumer crashed by an error kafkajs does not restart after is started again and commits what it consumes', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const { client, proxy, crashes } = await crashableMember(testId);
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, partitions: 2 });
    cleanups.push(() => transport.close());
    const topic = 'crash';
    const endpoint = { consumer: 'c', topics: [topic], ordered: false, concurrency: 4 };
    const seen = new Set<string>();
    await transport.subscribe(endpoint, async (delivery: Delivery) => {
      seen.add(delivery.envelope.messageId);
      await delivery.ack();
    });
    const envelope = (name: string) => makeEnvelope({ topic, key: name, type: 'kafka.ConsumerCrash', payload: JSON.stringify({ name }) });
    const before = envelope('before');
    expect((await transport.publish([before]))[0]!.ok).toBe(true);
    await eventually(() => expect(seen.has(before.messageId)).toBe(true), { timeoutMs: 20_000 });

    // A second member (straight to the broker) makes the first rejoin; its coordinator lookup is cut.
    proxy.armed = true;
    const other = new KafkaTransport({ client: plainClient(`${testId}-other`), prefix: `${testId}.`, ...TEST_CONFIG, partitions: 2 });
    cleanups.push(() => other.close());
    const otherSubscription = await other.subscribe(endpoint, async (delivery: Delivery) => {
      await delivery.ack();
    });
    await eventually(() => expect(crashes.filter((crash) => !crash.restart), `crashes: ${JSON.stringify(crashes)}`).not.toHaveLength(0), { timeoutMs: 30_000, intervalMs: 50 });
    // Only the first member is left: what the group consumes now, it consumes.
    await otherSubscription.close();

    const after = ['a', 'b', 'c', 'd', 'e', 'f'].map(envelope);
    const results = await transport.publish(after);
    expect(results.every((result) => result.ok)).toBe(true);
    await eventually(() => expect(after.filter((e) => !seen.has(e.messageId)).length, `not consumed after a crash kafkajs did not restart from (${JSON.stringify(crashes)})`).toBe(0), {
      timeoutMs: 45_000,
    });
    // What it consumed is committed: the group's offsets reach the end of every partition.
    const admin = plainClient(`${testId}-offsets`).admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());
    const name = transport.topicName(topic);
    await eventually(
      async () => {
        const ends = await admin.fetchTopicOffsets(name);
        const [committed] = await admin.fetchOffsets({ groupId: transport.groupId('c'), topics: [name] });
        const at = new Map(committed!.partitions.map((p) => [p.partition, Number(p.offset)]));
        expect(ends.map((end) => at.get(end.partition) ?? -1)).toEqual(ends.map((end) => Number(end.high)));
      },
      { timeoutMs: 20_000, intervalMs: 200 },
    );
    expect(proxy.cuts).toBe(1);
  });
  it('a record in hand when its consumer crashed comes again after the restart, and its partition is committed to the end', async () => {
    await assertBrokerAnswers();
    const testId = uniqueId();
    cleanups.push(() => deleteTestObjects(testId));
    const { client, proxy, crashes } = await crashableMember(testId);
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, partitions: 1 });
    cleanups.push(() => transport.close());
    const topic = 'held';
    const endpoint = { consumer: 'c', topics: [topic], ordered: false, concurrency: 4 };
    const held = makeEnvelope({ topic, key: 'held', type: 'kafka.ConsumerCrash', payload: JSON.stringify({ name: 'held' }) });
    const release = deferred();
    const running = deferred();
    const runs: boolean[] = [];
    await transport.subscribe(endpoint, async (delivery: Delivery) => {
      runs.push(delivery.redelivered);
      if (runs.length === 1) {
        running.resolve();
        await release.promise;
      }
      await delivery.ack();
    });
    expect((await transport.publish([held]))[0]!.ok).toBe(true);
    await running.promise;

    proxy.armed = true;
    // The other member takes the record while the first is down and returns without settling it: nothing commits it there.
    const other = new KafkaTransport({ client: plainClient(`${testId}-other`), prefix: `${testId}.`, ...TEST_CONFIG, partitions: 1 });
    cleanups.push(() => other.close());
    const otherSubscription = await other.subscribe(endpoint, async () => undefined);
    await eventually(() => expect(crashes.filter((crash) => !crash.restart), `crashes: ${JSON.stringify(crashes)}`).not.toHaveLength(0), { timeoutMs: 30_000, intervalMs: 50 });
    await otherSubscription.close();
    // The first run finishes after the crash: its acknowledgement commits nothing for a member that is gone.
    release.resolve();
    await eventually(() => expect(runs.length, `runs (redelivered flags): ${JSON.stringify(runs)}`).toBeGreaterThanOrEqual(2), { timeoutMs: 45_000 });
    expect(runs.slice(1).every((redelivered) => redelivered)).toBe(true);
    const admin = plainClient(`${testId}-offsets`).admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());
    const name = transport.topicName(topic);
    await eventually(
      async () => {
        const [committed] = await admin.fetchOffsets({ groupId: transport.groupId('c'), topics: [name] });
        expect(committed!.partitions.map((p) => Number(p.offset))).toEqual([1]);
      },
      { timeoutMs: 20_000, intervalMs: 200 },
    );
  });
});
