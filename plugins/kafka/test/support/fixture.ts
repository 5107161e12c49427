// The Kafka transport fixture: every client of a transport reaches the broker through a
// TCP proxy of its own (kafkajs `socketFactory`), so a test can cut one transport (kill)
// or all of this fixture's transports (outage) without touching the shared broker.
import { connect as tcpConnect } from 'node:net';
import { consoleLogger, type Transport } from '@courier/core';
import { TcpProxy, type FixtureContext, type TransportFixture } from '@courier/conformance';
import { Kafka, logLevel } from 'kafkajs';
import { KafkaTransport, type KafkaTransportConfig } from '../../src/index.js';

process.env['KAFKAJS_NO_PARTITIONER_WARNING'] = '1';

/** The broker (scripts/services.sh starts one on 127.0.0.1:9092 and exports it). */
export const kafkaBrokers = (process.env['COURIER_KAFKA_BROKERS'] ?? '127.0.0.1:9092').split(',');

/**
 * Fast failover for tests: a crashed consumer's partitions move after its session timeout,
 * so the fixture uses 2 s when the broker allows it (scripts/kafka.sh sets
 * `group.min.session.timeout.ms=1000`) and the broker's minimum otherwise (6 s by default);
 * see {@link assertBrokerAnswers}.
 */
export const TEST_CONFIG = {
  partitions: 4,
  sessionTimeoutMs: 6_000,
  heartbeatIntervalMs: 1_000,
  rebalanceTimeoutMs: 10_000,
  connectTimeoutMs: 5_000,
  publishTimeoutMs: 8_000,
  // The broker refuses records over 256 KiB on these topics (the refusable() case); the bus refuses payloads over 200 KiB first.
  topicConfig: { 'max.message.bytes': String(256 * 1024) },
  maxMessageBytes: 200 * 1024,
} satisfies Partial<KafkaTransportConfig> as Partial<KafkaTransportConfig> & { sessionTimeoutMs: number; heartbeatIntervalMs: number };

/** A kafkajs client whose every socket goes to `proxy` (one broker: the bootstrap and the advertised address are the same). */
export function proxiedClient(proxy: TcpProxy, clientId: string): Kafka {
  return new Kafka({
    clientId,
    brokers: kafkaBrokers,
    connectionTimeout: 2_000,
    requestTimeout: 10_000,
    retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1_000 },
    logLevel: process.env['COURIER_KAFKA_LOG'] === 'debug' ? logLevel.DEBUG : logLevel.NOTHING,
    socketFactory: ({ onConnect }) => {
      const socket = tcpConnect({ host: '127.0.0.1', port: proxy.port }, onConnect);
      socket.setKeepAlive(true, 1_000);
      return socket;
    },
  });
}

/** COURIER_KAFKA_LOG=courier (or debug): the transport's own warnings (consumer crashes and restarts) on the console. */
const transportLogger = ['courier', 'debug'].includes(process.env['COURIER_KAFKA_LOG'] ?? '') ? consoleLogger('info') : undefined;

/** A plain client for test set-up and clean-up. */
export function plainClient(clientId: string): Kafka {
  return new Kafka({ clientId, brokers: kafkaBrokers, logLevel: logLevel.NOTHING, retry: { retries: 3 } });
}

const [host, port] = [kafkaBrokers[0]!.split(':')[0]!, Number(kafkaBrokers[0]!.split(':')[1] ?? 9092)];
let reachable: Promise<void> | undefined;

/**
 * Fails loudly, saying how to start one, when no broker answers (never a silent skip);
 * then reads the broker's `group.min.session.timeout.ms` and lowers the fixture's session
 * timeout to max(2 s, that minimum).
 */
export function assertBrokerAnswers(): Promise<void> {
  reachable ??= probe().then(tuneSessionTimeout);
  return reachable;
}

/** kafkajs `ConfigResourceTypes.BROKER`; Node's CommonJS export detection misses that named export in worker processes. */
const BROKER_RESOURCE = 4;

async function tuneSessionTimeout(): Promise<void> {
  const admin = plainClient('courier-test-probe').admin();
  try {
    await admin.connect();
    const { brokers } = await admin.describeCluster();
    const described = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: BROKER_RESOURCE, name: String(brokers[0]!.nodeId), configNames: ['group.min.session.timeout.ms'] }],
    });
    const minimum = Number(described.resources[0]?.configEntries.find((entry) => entry.configName === 'group.min.session.timeout.ms')?.configValue);
    if (Number.isFinite(minimum) && minimum > 0) {
      TEST_CONFIG.sessionTimeoutMs = Math.max(2_000, minimum);
      TEST_CONFIG.heartbeatIntervalMs = Math.min(1_000, Math.floor(TEST_CONFIG.sessionTimeoutMs / 4));
    }
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

function probe(): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const socket = tcpConnect({ host, port }, () => {
      socket.destroy();
      resolve();
    });
    socket.setTimeout(3_000, () => socket.destroy(new Error('timed out')));
    socket.on('error', (error) =>
      reject(new Error(`no Kafka broker answers on ${host}:${port} (${error.message}): start one with \`bash scripts/kafka.sh start\` (Java 17 + Maven), or point COURIER_KAFKA_BROKERS at yours`)),
    );
  });
}

/** Settles the fixture is to fail next, by kind (`TransportFixture.failSettles`). */
type SettleFaults = Record<'ack' | 'retry' | 'deadLetter', number>;

/** Whether one more fault of `kind` is due (and counts it off). */
function takeFault(faults: SettleFaults, kind: keyof SettleFaults): boolean {
  if (faults[kind] <= 0) return false;
  faults[kind] -= 1;
  return true;
}

/** `target` with `overrides` in place of some of its members; every other member bound to it. */
function overriding<T extends object>(target: T, overrides: Partial<T>): T {
  return new Proxy(target, {
    get(object, name, receiver) {
      if (Object.prototype.hasOwnProperty.call(overrides, name)) return overrides[name as keyof T];
      const value: unknown = Reflect.get(object, name, receiver);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(object) : value;
    },
  });
}

/**
 * `client` with settle faults, as the broker would fail them: a produce to a retry topic
 * (`retry`) or a dead-letter topic (`deadLetter`) fails without writing anything, and an
 * offset commit that moves a partition's commit point (`ack`; the in-hand mark commits
 * before a record is handed over keep the point where it is) fails without committing.
 */
function faultyClient(client: Kafka, faults: SettleFaults): Kafka {
  return overriding(client, {
    producer: (config) => {
      const producer = client.producer(config);
      return overriding(producer, {
        sendBatch: async (batch) => {
          const topics = (batch.topicMessages ?? []).map((entry) => entry.topic);
          for (const [kind, infix] of [['retry', '.courier-retry.'], ['deadLetter', '.courier-dlt.']] as const) {
            if (topics.some((topic) => topic.includes(infix)) && takeFault(faults, kind)) {
              throw new Error(`kafka fixture: the broker failed a produce to ${topics.join(', ')} (injected ${kind} fault)`);
            }
          }
          return producer.sendBatch(batch);
        },
      });
    },
    consumer: (config) => {
      const consumer = client.consumer(config);
      const last = new Map<string, { offset: bigint; metadata: string | null | undefined }>();
      // An ack's commit moves the point and keeps the in-hand mark (the metadata); the mark's
      // own commits, made before records are handed over, raise the mark.
      const isAck = (entry: { topic: string; partition: number; offset: string; metadata?: string | null }) => {
        const before = last.get(`${entry.topic}\0${entry.partition}`);
        return before !== undefined && BigInt(entry.offset) > before.offset && entry.metadata === before.metadata;
      };
      return overriding(consumer, {
        commitOffsets: async (offsets) => {
          if (offsets.some(isAck) && takeFault(faults, 'ack')) throw new Error('kafka fixture: the broker failed an offset commit (injected ack fault)');
          await consumer.commitOffsets(offsets);
          for (const entry of offsets) last.set(`${entry.topic}\0${entry.partition}`, { offset: BigInt(entry.offset), metadata: entry.metadata });
        },
      });
    },
  });
}

export async function createKafkaFixture({ testId }: FixtureContext, config: Partial<KafkaTransportConfig> = {}): Promise<TransportFixture> {
  await assertBrokerAnswers();
  const entries = new Map<Transport, { proxy: TcpProxy; killed: boolean }>();
  let down = false;
  const faults: SettleFaults = { ack: 0, retry: 0, deadLetter: 0 };

  const make = async (): Promise<KafkaTransport> => {
    const proxy = await TcpProxy.create({ host, port });
    if (!down) await proxy.open();
    const client = faultyClient(proxiedClient(proxy, testId), faults);
    const transport = new KafkaTransport({ client, prefix: `${testId}.`, ...TEST_CONFIG, ...(transportLogger ? { logger: transportLogger } : {}), ...config });
    entries.set(transport, { proxy, killed: false });
    return transport;
  };

  const transport = await make();
  return {
    transport,
    connect: () => make(),
    kill: async (target) => {
      const entry = entries.get(target);
      if (!entry) throw new Error('kill: not a transport of this fixture');
      // A crash: sockets cut, nothing settled or committed, and the proxy refuses every reconnect.
      entry.killed = true;
      await entry.proxy.close();
    },
    outage: {
      begin: async () => {
        down = true;
        await Promise.all([...entries.values()].map((entry) => entry.proxy.close()));
      },
      end: async () => {
        down = false;
        await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy.open()));
      },
    },
    failSettles: async (kind, count = 1) => {
      faults[kind] += count;
    },
    refusable: (envelope) => ({ ...envelope, payload: JSON.stringify('x'.repeat(300 * 1024)) }),
    // A plain record on the topic (the suite subscribed first, which created it), from a producer of its own.
    publishMalformed: async (topic) => {
      const producer = plainClient(`${testId}-malformed`).producer({ allowAutoTopicCreation: false });
      await producer.connect();
      try {
        await producer.send({ topic: transport.topicName(topic), messages: [{ value: 'not a courier envelope' }] });
      } finally {
        await producer.disconnect();
      }
    },
    // A space: a character a Kafka topic name cannot hold.
    refusedByValidate: (envelope) => ({ ...envelope, topic: `${envelope.topic} refused` }),
    injectDuplicate: async (envelope) => {
      // The idempotent producer drops only its own retries, so a second publish is a second record.
      const [result] = await transport.publish([envelope]);
      if (!result?.ok) throw new Error(`injectDuplicate failed: ${result && !result.ok ? result.error.message : 'no result'}`);
    },
    close: async () => {
      // A killed transport's close may wait on a handler the test never settles: not awaited.
      await Promise.all([...entries].filter(([, entry]) => !entry.killed).map(([t]) => t.close().catch(() => undefined)));
      await Promise.all([...entries.values()].map((entry) => entry.proxy.close()));
      // Workers of the process scenarios share this testId's topics with the parent: only the parent deletes them.
      if (process.env['COURIER_CONFORMANCE_WORKER'] === undefined) await deleteTestObjects(testId);
    },
  };
}

/** Deletes the topics and consumer groups whose names start with `<testId>.`. */
export async function deleteTestObjects(testId: string): Promise<void> {
  const admin = plainClient(`${testId}-cleanup`).admin();
  try {
    await admin.connect();
    const topics = (await admin.listTopics()).filter((topic) => topic.startsWith(`${testId}.`));
    const groups = (await admin.listGroups()).groups.map((group) => group.groupId).filter((group) => group.startsWith(`${testId}.`));
    if (groups.length > 0) await admin.deleteGroups(groups).catch(() => undefined);
    if (topics.length > 0) await admin.deleteTopics({ topics }).catch(() => undefined);
  } catch {
    // Clean-up is best effort: a broker restarted by a test may still be coming back.
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}
