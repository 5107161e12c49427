// 11. Kafka: the relay draining PostgreSQL → Kafka against a raw kafkajs idempotent
// producer loop (same batch size, same records, same durability: idempotent, acks=all, one
// batch in flight), and Courier's consumer against a raw kafkajs consume + the same handler
// transaction + offset commit loop. Needs a broker (scripts/kafka.sh; COURIER_KAFKA_BROKERS).
import { createConnection } from 'node:net';
import { newMessageId, type Envelope, type PublishResult, type Transport } from '@courier/core';
import { KAFKA_HEADERS, KafkaTransport } from '@courier/kafka';
import type { EntityManager } from '@mikro-orm/core';
import { Kafka, logLevel } from 'kafkajs';
import { handWrittenClaimLoop } from '../ceilings.js';
import { anyPending, benchBus, openDb, OrderPlaced, orderPayload, seedBacklog, TOPIC, until, warmRelay, type BenchDb } from '../setup.js';
import type { Scenario } from './context.js';

process.env['KAFKAJS_NO_PARTITIONER_WARNING'] = '1';

const BATCH = 100;
const PARTITIONS = 8;
const CONCURRENCY = 8;
const BROKERS = (process.env['COURIER_KAFKA_BROKERS'] ?? '127.0.0.1:9092').split(',');

/** Fails loudly, with how to start one, when no broker answers. */
async function checkKafka(): Promise<void> {
  const [host, port] = BROKERS[0]!.split(':');
  await new Promise<void>((resolve, reject) => {
    const socket = createConnection({ host: host!, port: Number(port ?? 9092), timeout: 3_000 });
    socket.once('connect', () => {
      socket.end();
      resolve();
    });
    socket.once('timeout', () => socket.destroy(new Error('connect timed out')));
    socket.once('error', (error) => reject(new Error(`Kafka at ${BROKERS[0]} is unreachable (${error.message}): start it with \`bash scripts/kafka.sh start\`, or point COURIER_KAFKA_BROKERS at one`)));
  });
}

function client(): Kafka {
  return new Kafka({ clientId: 'courier-bench', brokers: BROKERS, logLevel: logLevel.NOTHING });
}

/** Counts the relay's confirmed messages. */
class CountingTransport implements Transport {
  confirmed = 0;
  constructor(readonly inner: KafkaTransport) {}
  get capabilities() {
    return this.inner.capabilities;
  }
  get deadLetters() {
    return this.inner.deadLetters;
  }
  get limits() {
    return this.inner.limits;
  }
  async publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]> {
    const results = await this.inner.publish(messages, options);
    this.confirmed += results.filter((result) => result.ok).length;
    return results;
  }
  subscribe(...args: Parameters<Transport['subscribe']>): ReturnType<Transport['subscribe']> {
    return this.inner.subscribe(...args);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

function envelope(index: number): Envelope {
  const messageId = newMessageId();
  return {
    messageId,
    type: OrderPlaced.type,
    version: 1,
    topic: TOPIC,
    occurredAt: new Date().toISOString(),
    key: `order-${index}`,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: JSON.stringify(orderPayload(`order-${index}`)),
  };
}

/**
 * The raw ceiling: an idempotent acks=all producer sending `count` records in batches of
 * BATCH, one batch in flight. Its records are the relay's byte for byte in shape: the same
 * key and value, and the same headers the transport writes for a seeded row (message id,
 * type, version, topic, occurred-at, correlation id), so it does not win by sending less.
 */
async function rawProduceLoop(kafka: Kafka, topic: string, count: number): Promise<number> {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  try {
    const started = performance.now();
    for (let from = 0; from < count; from += BATCH) {
      const messages = Array.from({ length: Math.min(BATCH, count - from) }, (_, offset) => {
        const id = `order-${from + offset}`;
        const messageId = newMessageId();
        const headers = {
          [KAFKA_HEADERS.messageId]: messageId,
          [KAFKA_HEADERS.type]: OrderPlaced.type,
          [KAFKA_HEADERS.version]: '1',
          [KAFKA_HEADERS.topic]: TOPIC,
          [KAFKA_HEADERS.occurredAt]: new Date().toISOString(),
          [KAFKA_HEADERS.correlationId]: messageId,
        };
        return { key: id, value: JSON.stringify(orderPayload(id)), headers };
      });
      await producer.sendBatch({ acks: -1, topicMessages: [{ topic, messages }] });
    }
    return count / ((performance.now() - started) / 1000);
  } finally {
    await producer.disconnect();
  }
}

/**
 * The relay a user would write by hand for Kafka, as scenario 2's hand-written relay is for
 * RabbitMQ: the bench's shared claim loop (`handWrittenClaimLoop`: SKIP LOCKED batch, mark
 * published, commit), sending each batch as one idempotent acks=all batch (the relay's key,
 * value and headers). One batch in flight, as the raw producer loop and Courier's transport
 * have. Drains the seeded backlog; resolves with rows per second.
 */
async function handWrittenRelay(db: BenchDb, kafka: Kafka, topic: string): Promise<number> {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  try {
    return await handWrittenClaimLoop(db, BATCH, async (rows) => {
      const messages = rows.map((row) => ({
        key: row['msg_key'] === null ? null : String(row['msg_key']),
        value: String(row['payload']),
        headers: {
          [KAFKA_HEADERS.messageId]: String(row['message_id']),
          [KAFKA_HEADERS.type]: String(row['message_type']),
          [KAFKA_HEADERS.version]: String(row['message_version']),
          [KAFKA_HEADERS.topic]: String(row['topic']),
          [KAFKA_HEADERS.occurredAt]: String(row['occurred_at']),
          [KAFKA_HEADERS.correlationId]: String(row['correlation_id']),
        },
      }));
      await producer.sendBatch({ acks: -1, topicMessages: [{ topic, messages }] });
    });
  } finally {
    await producer.disconnect();
  }
}

/** Courier's relay draining `count` seeded rows to Kafka; messages per second from the wake-up to the last completed row. */
async function relayDrain(db: BenchDb, transport: CountingTransport, count: number): Promise<number> {
  const bus = benchBus(db, transport, { batchSize: BATCH, pollIntervalMs: 600_000 });
  try {
    await warmRelay(db, bus, () => transport.confirmed >= 1);
    await seedBacklog(db, count);
    const started = performance.now();
    bus.wake();
    await until(() => transport.confirmed >= count + 1, 3_600_000, `${count} confirms`, 10);
    await until(async () => !(await anyPending(db)), 60_000, 'the last rows to complete', 5);
    return count / ((performance.now() - started) / 1000);
  } finally {
    await bus.stop({ timeoutMs: 10_000 });
  }
}

const effect = (db: BenchDb, id: string) => (em: EntityManager) => {
  em.persist(em.create(db.Order, { id, customerId: 'c-1', totalCents: 12_345, createdAt: new Date() }));
  return Promise.resolve();
};

/** Counts the deliveries a transport flags `redelivered` (the core runs each of those alone, with a crash count around it). */
class FlagCountingTransport extends CountingTransport {
  redelivered = 0;
  override subscribe(...[endpoint, handler]: Parameters<Transport['subscribe']>): ReturnType<Transport['subscribe']> {
    return this.inner.subscribe(endpoint, (delivery) => {
      if (delivery.redelivered) this.redelivered += 1;
      return handler(delivery);
    });
  }
}

/**
 * Courier's consumer (unordered, concurrency 8) applying `count` prepublished messages through
 * the inbox; timed from nothing connected, as `rawConsume` is. Also how many deliveries came
 * flagged `redelivered` (none should: no member of the new group had them before).
 */
async function courierConsume(db: BenchDb, transport: KafkaTransport, consumer: string, count: number): Promise<{ rate: number; redelivered: number }> {
  const counting = new FlagCountingTransport(transport);
  const bus = benchBus(db, counting);
  let handled = 0;
  bus.subscribe(
    consumer,
    OrderPlaced,
    async (message, ctx) => {
      await effect(db, `c-${message.messageId}`)(ctx.tx);
      handled += 1;
    },
    { ordered: false, concurrency: CONCURRENCY },
  );
  const started = performance.now();
  try {
    await bus.start({ relay: false, consumers: true });
    await until(() => handled >= count, 600_000, `${count} handled messages`, 10);
    return { rate: count / ((performance.now() - started) / 1000), redelivered: counting.redelivered };
  } finally {
    await bus.stop({ timeoutMs: 10_000 });
  }
}

/**
 * The raw ceiling: kafkajs eachMessage over 8 partitions at once, the same handler
 * transaction, then a commit of that offset. Timed from nothing connected, as Courier's
 * consumer is (its `bus.start` connects, joins the group and starts consuming).
 */
async function rawConsume(db: BenchDb, kafka: Kafka, topic: string, group: string, count: number): Promise<number> {
  const consumer = kafka.consumer({ groupId: group, maxWaitTimeInMs: 100 });
  let handled = 0;
  const started = performance.now();
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      partitionsConsumedConcurrently: CONCURRENCY,
      // The same one-row handler transaction as Courier's handler (order ids fit the 64-character column).
      eachMessage: async ({ topic: from, partition, message }) => {
        const id = message.headers?.['courier-message-id']?.toString() ?? message.offset;
        JSON.parse(message.value?.toString('utf8') ?? 'null');
        await db.orm.em.fork().transactional(effect(db, `r-${id}`));
        await consumer.commitOffsets([{ topic: from, partition, offset: String(Number(message.offset) + 1) }]);
        handled += 1;
      },
    });
    await until(() => handled >= count, 600_000, `${count} raw handled messages`, 10);
    return count / ((performance.now() - started) / 1000);
  } finally {
    await consumer.disconnect();
  }
}

export const kafkaScenario: Scenario = {
  id: 11,
  name: 'Kafka: relay drain PostgreSQL → Kafka, consumer vs raw kafkajs',
  services: ['postgresql'],
  async run({ quick, prefix, report }) {
    await checkKafka();
    const count = quick ? 2_000 : 50_000;
    const consumeCount = quick ? 1_000 : 10_000;
    const kafka = client();
    const name = prefix.replace(/[^A-Za-z0-9._-]/g, '_');
    const transport = new KafkaTransport({ client: kafka, prefix: `${name}.`, partitions: PARTITIONS });
    const counting = new CountingTransport(transport);
    // The consumer side on topics of its own (the drain's messages stay out of it).
    const consumeTransport = new KafkaTransport({ client: kafka, prefix: `${name}.c.`, partitions: PARTITIONS });
    const db = await openDb('postgresql', { prefix, wakeups: false });
    const admin = kafka.admin();
    await admin.connect();
    try {
      const rawTopic = `${name}.raw`;
      await admin.createTopics({ waitForLeaders: true, topics: [{ topic: rawTopic, numPartitions: PARTITIONS }] });
      await rawProduceLoop(kafka, rawTopic, Math.min(count, 1_000)); // warm-up: connection, metadata, JIT
      const rawBefore = await rawProduceLoop(kafka, rawTopic, count);
      const drain = await relayDrain(db, counting, count);
      await seedBacklog(db, count);
      const hand = await handWrittenRelay(db, kafka, rawTopic);
      const rawAfter = await rawProduceLoop(kafka, rawTopic, count);
      const raw = (rawBefore + rawAfter) / 2;
      report.measure(`raw kafkajs idempotent producer, batches of ${BATCH}`, raw, 'msg/s', { note: `mean of ${Math.round(rawBefore)} before and ${Math.round(rawAfter)} after` });
      const handLine = `hand-written relay: SKIP LOCKED batch ${BATCH} → sendBatch → mark published → commit`;
      report.measure(handLine, hand, 'msg/s', { vs: `raw kafkajs idempotent producer, batches of ${BATCH}`, note: 'no per-key order across failures, no lease, no fencing; the same records and durability' });
      const courier = report.measure(`Courier relay drain of ${count.toLocaleString('en-US')}`, drain, 'msg/s', { vs: `raw kafkajs idempotent producer, batches of ${BATCH}` });
      report.measure(`Courier relay drain of ${count.toLocaleString('en-US')} vs the hand-written relay`, drain, 'msg/s', { vs: handLine });
      report.target('relay drain ≥ 0.70 × raw producer loop', `${courier.ratio?.toFixed(3)}`, (courier.ratio ?? 0) >= 0.7);

      // Consumers: the same prepublished messages on two topics (one per side), the same handler transaction.
      const envelopes = Array.from({ length: consumeCount }, (_, index) => envelope(index));
      for (let from = 0; from < envelopes.length; from += 500) {
        const results = await consumeTransport.publish(envelopes.slice(from, from + 500));
        if (!results.every((result) => result.ok)) throw new Error('prepublishing for the consumer benchmark failed');
      }
      const rawConsumeTopic = `${name}.raw-consume`;
      await admin.createTopics({ waitForLeaders: true, topics: [{ topic: rawConsumeTopic, numPartitions: PARTITIONS }] });
      const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
      await producer.connect();
      for (let from = 0; from < envelopes.length; from += 500) {
        await producer.sendBatch({
          acks: -1,
          topicMessages: [{ topic: rawConsumeTopic, messages: envelopes.slice(from, from + 500).map((e) => ({ key: e.key, value: e.payload, headers: { 'courier-message-id': e.messageId } })) }],
        });
      }
      await producer.disconnect();
      const rawRate = await rawConsume(db, kafka, rawConsumeTopic, `${name}.raw-group`, consumeCount);
      const { rate: consumeRate, redelivered } = await courierConsume(db, consumeTransport, `consumer`, consumeCount);
      report.measure('raw kafkajs consume + handler tx + commit, 8 partitions at once', rawRate, 'msg/s', { note: `${consumeCount.toLocaleString('en-US')} messages` });
      const consumer = report.measure('Courier consumer (inbox + handler tx + commit), concurrency 8', consumeRate, 'msg/s', {
        vs: 'raw kafkajs consume + handler tx + commit, 8 partitions at once',
        note: `${consumeCount.toLocaleString('en-US')} messages, ${redelivered} flagged redelivered`,
      });
      report.note(
        `${PARTITIONS} partitions, single local KRaft broker; producer side: distinct keys, relay batch ${BATCH}, idempotent acks=all on both sides, ` +
          `one batch in flight; the raw loop's records carry the relay's headers. Consumer side: unordered, the same one-row handler transaction; Courier adds the inbox row to the handler's transaction ` +
          `and commits offsets below unfinished work with its in-hand mark (one more commit per fetched batch, before the batch's records are handed over); both sides are timed ` +
          `from nothing connected to the last record handled (ratio ${consumer.ratio?.toFixed(3)}).`,
      );
    } finally {
      await transport.close();
      await consumeTransport.close();
      const topics = (await admin.listTopics().catch(() => [] as string[])).filter((topic) => topic.startsWith(`${name}.`));
      if (topics.length > 0) await admin.deleteTopics({ topics }).catch(() => undefined);
      const groups = (await admin.listGroups().catch(() => ({ groups: [] as { groupId: string }[] }))).groups.map((g) => g.groupId).filter((g) => g.startsWith(`${name}.`));
      if (groups.length > 0) await admin.deleteGroups(groups).catch(() => undefined);
      await admin.disconnect();
      await db.close();
    }
  },
};
