// 7. Ordered per key (1,000 keys) vs unordered consumption, same messages, same handler.
import { newMessageId, type Envelope } from '@courier/core';
import { toAmqpMessage } from '@courier/rabbitmq';
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

export const orderedScenario: Scenario = {
  id: 7,
  name: 'ordered per key vs unordered consumer',
  services: ['postgresql', 'rabbitmq'],
  async run({ quick, prefix, report }) {
    const count = quick ? 500 : 5_000;
    const db = await openDb('postgresql', { prefix, poolMax: 2 * CONCURRENCY + 4 });
    const broker = new BenchBroker(prefix);
    const provisioner = broker.transport();
    try {
      for (const [consumer, ordered] of [
        ['bench-unordered', false],
        ['bench-ordered', true],
      ] as const) {
        broker.track(consumer);
        await provisioner.provision({ consumer, topics: [TOPIC], ordered });
      }
      await provisioner.close();
      // Both queues are bound to the topic: each gets the same `count` messages.
      await prepublish(broker, count);
      const unordered = await consume(db, broker, 'bench-unordered', false, count);
      const ordered = await consume(db, broker, 'bench-ordered', true, count);
      const unit = `msg/s (concurrency ${CONCURRENCY})`;
      report.measure('unordered consumer', unordered.rate, unit);
      const measured = report.measure(`ordered consumer, ${KEYS.toLocaleString('en-US')} keys`, ordered.rate, unit, { vs: 'unordered consumer' });
      report.target('ordered ≥ 0.50 × unordered', `${measured.ratio?.toFixed(3)}`, (measured.ratio ?? 0) >= 0.5);
      report.note(
        `${count.toLocaleString('en-US')} messages already in each consumer's quorum queue; handler = inbox record + one business row; ` +
          `per-key order violations seen by the ordered consumer: ${ordered.outOfOrder}.`,
      );
      if (ordered.outOfOrder > 0) throw new Error(`the ordered consumer handled ${ordered.outOfOrder} messages out of key order`);
    } finally {
      await provisioner.close().catch(() => undefined);
      await broker.close();
      await db.close();
    }
  },
};
