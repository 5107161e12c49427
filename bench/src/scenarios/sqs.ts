// 13. SQS: the relay draining PostgreSQL → SQS (@courier/aws, SQS-only mode, a standard
// queue) against a raw SendMessageBatch loop on the same server: batches of 10 (SQS's most),
// one call in flight as the transport sends them, and the same body and message attributes
// the transport writes, so the raw loop does not win by sending less. Needs an SQS server:
// ElasticMQ from scripts/elasticmq.sh, or COURIER_SQS_ENDPOINT.
import { DeleteQueueCommand, GetQueueUrlCommand, ListQueuesCommand, SendMessageBatchCommand, SQSClient, type MessageAttributeValue } from '@aws-sdk/client-sqs';
import { ATTRIBUTES, SqsTransport } from '@courier/aws';
import { newMessageId, type Envelope, type PublishResult, type Transport } from '@courier/core';
import { anyPending, benchBus, openDb, OrderPlaced, orderPayload, seedBacklog, TOPIC, until, warmRelay, type BenchDb } from '../setup.js';
import type { Scenario } from './context.js';

/** The relay's batch: 10 SendMessageBatch calls of 10 per relay batch. */
const RELAY_BATCH = 100;
/** SendMessageBatch takes at most 10 entries. */
const SQS_BATCH = 10;
const ENDPOINT = process.env['COURIER_SQS_ENDPOINT'] ?? 'http://127.0.0.1:9324';

function client(): SQSClient {
  return new SQSClient({ endpoint: ENDPOINT, region: 'us-east-1', credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' }, maxAttempts: 3 });
}

/** Fails loudly, with how to start one, when no SQS server answers. */
async function checkSqs(sqs: SQSClient): Promise<void> {
  try {
    await sqs.send(new ListQueuesCommand({ QueueNamePrefix: 'courier-bench-probe-' }));
  } catch (error) {
    throw new Error(`no SQS server answers on ${ENDPOINT} (${(error as Error).message}): start ElasticMQ with \`bash scripts/elasticmq.sh start\`, or point COURIER_SQS_ENDPOINT at one`, {
      cause: error,
    });
  }
}

/** Counts the relay's confirmed messages. */
class CountingTransport implements Transport {
  confirmed = 0;
  constructor(readonly inner: SqsTransport) {}
  get capabilities() {
    return this.inner.capabilities;
  }
  get deadLetters() {
    return this.inner.deadLetters;
  }
  validate(envelope: Envelope): readonly string[] {
    return this.inner.validate(envelope);
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

/**
 * The attributes the transport writes for a seeded row: `courier-envelope` (every envelope
 * field but the payload, as one JSON object) and `courier-type`.
 */
function attributesFor(orderId: string): Record<string, MessageAttributeValue> {
  const messageId = newMessageId();
  const metadata = {
    messageId,
    type: OrderPlaced.type,
    version: 1,
    topic: TOPIC,
    occurredAt: new Date().toISOString(),
    key: orderId,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
  };
  return {
    [ATTRIBUTES.envelope]: { DataType: 'String', StringValue: JSON.stringify(metadata) },
    [ATTRIBUTES.type]: { DataType: 'String', StringValue: OrderPlaced.type },
  };
}

/** The raw ceiling: `count` messages in SendMessageBatch calls of 10, one in flight; messages per second. */
async function rawSendLoop(sqs: SQSClient, queueUrl: string, count: number): Promise<number> {
  const started = performance.now();
  for (let from = 0; from < count; from += SQS_BATCH) {
    const entries = Array.from({ length: Math.min(SQS_BATCH, count - from) }, (_, offset) => {
      const id = `order-${from + offset}`;
      return { Id: String(offset), MessageBody: JSON.stringify(orderPayload(id)), MessageAttributes: attributesFor(id) };
    });
    const answer = await sqs.send(new SendMessageBatchCommand({ QueueUrl: queueUrl, Entries: entries }));
    if ((answer.Failed ?? []).length > 0) throw new Error(`the raw loop's SendMessageBatch refused ${answer.Failed!.length} entries: ${answer.Failed![0]!.Code}`);
  }
  return count / ((performance.now() - started) / 1000);
}

/** Courier's relay draining `count` seeded rows to SQS; messages per second from the wake-up to the last completed row. */
async function relayDrain(db: BenchDb, transport: CountingTransport, count: number): Promise<number> {
  const bus = benchBus(db, transport, { batchSize: RELAY_BATCH, pollIntervalMs: 600_000 });
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

export const sqsScenario: Scenario = {
  id: 13,
  name: 'SQS: relay drain PostgreSQL → SQS vs a raw SendMessageBatch loop',
  services: ['postgresql'],
  async run({ quick, prefix, report }) {
    const sqs = client();
    await checkSqs(sqs);
    const count = quick ? 1_000 : 20_000;
    const name = prefix.replace(/[^A-Za-z0-9_-]/g, '_');
    const transport = new SqsTransport({ client: client(), prefix: `${name}-` });
    const counting = new CountingTransport(transport);
    const db = await openDb('postgresql', { prefix, wakeups: false });
    try {
      // The raw loop sends to the queue the transport publishes the topic to (created by its first publish).
      const [warm] = await transport.publish([{ ...envelopeFor('order-warm') }]);
      if (!warm?.ok) throw new Error(`creating the queue failed: ${warm && !warm.ok ? warm.error.message : 'no result'}`);
      const queueUrl = (await sqs.send(new GetQueueUrlCommand({ QueueName: transport.queueName(TOPIC) }))).QueueUrl!;
      await rawSendLoop(sqs, queueUrl, Math.min(count, 500)); // warm-up: connections, JIT
      const rawBefore = await rawSendLoop(sqs, queueUrl, count);
      const drain = await relayDrain(db, counting, count);
      const rawAfter = await rawSendLoop(sqs, queueUrl, count);
      const raw = (rawBefore + rawAfter) / 2;
      const rawLine = `raw SendMessageBatch loop, ${SQS_BATCH} a call, one in flight`;
      report.measure(rawLine, raw, 'msg/s', { note: `mean of ${Math.round(rawBefore)} before and ${Math.round(rawAfter)} after` });
      report.measure(`Courier relay drain of ${count.toLocaleString('en-US')} (relay batch ${RELAY_BATCH})`, drain, 'msg/s', { vs: rawLine });
      report.note(
        `SQS server ${ENDPOINT} (ElasticMQ unless COURIER_SQS_ENDPOINT names another), a standard queue, SQS-only mode; distinct keys; both sides send the same body and ` +
          `the same two message attributes, ${SQS_BATCH} entries a call, one call in flight. No target: issue 34 asks for the comparison.`,
      );
    } finally {
      await transport.close();
      await db.close();
      const { QueueUrls = [] } = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${name}-` })).catch(() => ({ QueueUrls: [] as string[] }));
      await Promise.all(QueueUrls.map((url) => sqs.send(new DeleteQueueCommand({ QueueUrl: url })).catch(() => undefined)));
      sqs.destroy();
    }
  },
};

function envelopeFor(orderId: string): Envelope {
  const messageId = newMessageId();
  return {
    messageId,
    type: OrderPlaced.type,
    version: 1,
    topic: TOPIC,
    occurredAt: new Date().toISOString(),
    key: orderId,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: JSON.stringify(orderPayload(orderId)),
  };
}
