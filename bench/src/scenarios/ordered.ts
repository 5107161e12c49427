// 7. Consumers through RabbitMQ, same messages, same handler transaction: a raw amqplib
// consume → handler transaction → ack loop (the ceiling of issue 14's target 9), Courier's
// unordered consumer (inbox + crash-loop accounting), and Courier ordered per key (1,000 keys).
import { newMessageId, type Envelope } from '@courier/core';
import { toAmqpMessage } from '@courier/rabbitmq';
import type { ConsumeMessage } from 'amqplib';
import { BenchBroker, benchBus, openDb, OrderPlaced, TOPIC, until, type BenchDb } from '../setup.js';
import type { Scenario } from './context.js';

const KEYS = 1_000;
const CONCURRENCY = 8;

/** Publishes `count` envelopes (key `k-<i % KEYS>`, payload carrying i) straight to the exchange, with confirms. */
async function prepublish(broker: BenchBroker, count: number): Promise<void> {
  const connection = await broker.connect();
  try {
    const channel = await connection.createConfirmChannel();
    for (let index = 0; index < count; index += 1) {
      const messageId = newMessageId();
      const envelope: Envelope = {
        messageId,
        type: OrderPlaced.type,
        version: 1,
        topic: TOPIC,
        occurredAt: new Date().toISOString(),
        key: `k-${index % KEYS}`,
        correlationId: messageId,
        causationId: null,
        traceparent: null,
        tracestate: null,
        headers: {},
        payload: JSON.stringify({ index }),
      };
      const message = toAmqpMessage(envelope);
      channel.publish(broker.exchange, TOPIC, message.content, { ...message.properties, persistent: true, mandatory: true });
      if (index % 256 === 255) await channel.waitForConfirms();
    }
    await channel.waitForConfirms();
    await channel.close();
  } finally {
    await connection.close();
  }
}

async function deleteQueue(broker: BenchBroker, queue: string): Promise<void> {
  const connection = await broker.connect().catch(() => undefined);
  if (!connection) return;
  try {
    const channel = await connection.createChannel();
    await channel.deleteQueue(queue).catch(() => undefined);
  } finally {
    await connection.close().catch(() => undefined);
  }
}

async function consume(db: BenchDb, broker: BenchBroker, consumer: string, ordered: boolean, count: number): Promise<{ rate: number; outOfOrder: number }> {
  const transport = broker.transport();
  const bus = benchBus(db, transport);
  let handled = 0;
  let outOfOrder = 0;
  const last = new Map<string, number>();
  bus.subscribe(
    consumer,
    OrderPlaced,
    async (message, ctx) => {
      const { index } = message.payload as { index: number };
      const key = message.key ?? '';
      if ((last.get(key) ?? -1) > index) outOfOrder += 1;
      last.set(key, index);
      ctx.tx.persist(ctx.tx.create(db.Order, { id: `${consumer}-${index}`, customerId: key, totalCents: index, createdAt: new Date() }));
      handled += 1;
    },
    { ordered, concurrency: CONCURRENCY },
  );
  const started = performance.now();
  try {
    await bus.start({ relay: false, consumers: true });
    await until(() => handled >= count, 600_000, `${count} handled messages on '${consumer}'`, 10);
    return { rate: count / ((performance.now() - started) / 1000), outOfOrder };
  } finally {
    await bus.stop({ timeoutMs: 10_000 });
    await transport.close();
  }
}

/**
 * The raw ceiling: amqplib consuming `queue` (prefetch 2 × concurrency, like the transport's
 * default), at most `CONCURRENCY` handlers at once, each the same business row in its own
 * MikroORM transaction, then the ack. No inbox, no deduplication, no retry policy.
 */
async function rawConsume(db: BenchDb, broker: BenchBroker, queue: string, count: number): Promise<number> {
  const connection = await broker.connect();
  try {
    const channel = await connection.createChannel();
    await channel.prefetch(2 * CONCURRENCY);
    let handled = 0;
    let running = 0;
    const waiting: ConsumeMessage[] = [];
    let failure: unknown;
    const handle = async (message: ConsumeMessage): Promise<void> => {
      running += 1;
      try {
        const { index } = JSON.parse(message.content.toString('utf8')) as { index: number };
        await db.orm.em.fork().transactional((em) => {
          em.persist(em.create(db.Order, { id: `raw-${index}`, customerId: 'raw', totalCents: index, createdAt: new Date() }));
          return Promise.resolve();
        });
        channel.ack(message);
        handled += 1;
      } catch (error) {
        failure ??= error;
      } finally {
        running -= 1;
        const next = waiting.shift();
        if (next) void handle(next);
      }
    };
    const started = performance.now();
    await channel.consume(queue, (message) => {
      if (message === null) return;
      if (running < CONCURRENCY) void handle(message);
      else waiting.push(message);
    });
    await until(() => {
      if (failure !== undefined) throw failure instanceof Error ? failure : new Error(String(failure));
      return handled >= count;
    }, 600_000, `${count} raw-consumed messages`, 10);
    const rate = count / ((performance.now() - started) / 1000);
    await channel.close();
    return rate;
  } finally {
    await connection.close();
  }
}

export const orderedScenario: Scenario = {
  id: 7,
  name: 'consumers through RabbitMQ: raw amqplib, Courier unordered, ordered per key',
  services: ['postgresql', 'rabbitmq'],
  async run({ quick, prefix, report }) {
    const count = quick ? 500 : 5_000;
    const db = await openDb('postgresql', { prefix, poolMax: 2 * CONCURRENCY + 4 });
    const broker = new BenchBroker(prefix);
    const provisioner = broker.transport();
    const rawQueue = `${broker.prefix}.raw-consume`;
    try {
      for (const [consumer, ordered] of [
        ['bench-unordered', false],
        ['bench-ordered', true],
      ] as const) {
        broker.track(consumer);
        await provisioner.provision({ consumer, topics: [TOPIC], ordered });
      }
      await provisioner.close();
      // The raw loop's own queue: a durable quorum queue bound like the consumers' queues.
      const admin = await broker.connect();
      try {
        const channel = await admin.createChannel();
        await channel.assertQueue(rawQueue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
        await channel.bindQueue(rawQueue, broker.exchange, TOPIC);
        await channel.close();
      } finally {
        await admin.close();
      }
      // All three queues are bound to the topic: each gets the same `count` messages.
      await prepublish(broker, count);
      const raw = await rawConsume(db, broker, rawQueue, count);
      const unordered = await consume(db, broker, 'bench-unordered', false, count);
      const ordered = await consume(db, broker, 'bench-ordered', true, count);
      const unit = `msg/s (concurrency ${CONCURRENCY})`;
      report.measure('raw amqplib consume → handler tx → ack', raw, unit);
      const courier = report.measure('Courier unordered consumer (inbox)', unordered.rate, unit, { vs: 'raw amqplib consume → handler tx → ack' });
      report.target('Courier consumer ≥ 0.80 × raw amqplib consume loop', `${courier.ratio?.toFixed(3)}`, (courier.ratio ?? 0) >= 0.8);
      const measured = report.measure(`ordered consumer, ${KEYS.toLocaleString('en-US')} keys`, ordered.rate, unit, { vs: 'Courier unordered consumer (inbox)' });
      report.target('ordered ≥ 0.50 × unordered', `${measured.ratio?.toFixed(3)}`, (measured.ratio ?? 0) >= 0.5);
      report.note(
        `${count.toLocaleString('en-US')} messages already in each consumer's quorum queue, run one consumer after another; Courier's handler = inbox record + one business row, ` +
          `the raw loop's = the same business row without an inbox (prefetch ${2 * CONCURRENCY}, ${CONCURRENCY} at once); ` +
          `per-key order violations seen by the ordered consumer: ${ordered.outOfOrder}.`,
      );
      if (ordered.outOfOrder > 0) throw new Error(`the ordered consumer handled ${ordered.outOfOrder} messages out of key order`);
    } finally {
      await provisioner.close().catch(() => undefined);
      await deleteQueue(broker, rawQueue);
      await broker.close();
      await db.close();
    }
  },
};
