// The Lambda entry points, invoked in-process: relayOnce drains a PostgreSQL outbox into
// SQS (two at once, as two scheduled invocations may overlap); the event-source handler
// gets events built from messages really received from the SQS server, as Lambda's poller
// builds them, and answers a partial batch response.
import { GetQueueUrlCommand, ReceiveMessageCommand, type Message } from '@aws-sdk/client-sqs';
import { createBus, defineMessage, UnrecoverableError, type MessageDefinition } from '@courier/core';
import { eventually, uniqueId } from '@courier/conformance';
import type { SQSBatchResponse, SQSEvent, SQSRecord } from 'aws-lambda';
import { afterAll, describe, expect, it } from 'vitest';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { SqsEventSource, SqsTransport, relayOnce } from '../src/index.js';
import { TEST_CONFIG, assertSqsAnswers, deleteTestQueues, sqsClient } from './support/fixture.js';

const client = sqsClient();
const testIds: string[] = [];
afterAll(async () => {
  await Promise.all(testIds.map((id) => deleteTestQueues(id)));
  client.destroy();
});

interface Order {
  readonly n: number;
}

/** Receives everything on `queue` (hiding it, as Lambda's poller does) until `count` messages came. */
async function receiveAll(queue: string, count: number): Promise<Message[]> {
  const url = (await client.send(new GetQueueUrlCommand({ QueueName: queue }))).QueueUrl!;
  const got = new Map<string, Message>();
  await eventually(
    async () => {
      const { Messages = [] } = await client.send(
        new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 60, MessageAttributeNames: ['All'], MessageSystemAttributeNames: ['All'] }),
      );
      for (const message of Messages) got.set(message.MessageId!, message);
      expect(got.size).toBeGreaterThanOrEqual(count);
    },
    { timeoutMs: 20_000 },
  );
  return [...got.values()];
}

/** An SQS event record as Lambda's event source builds it from a received message. */
function recordOf(message: Message, queueArn: string): SQSRecord {
  const attributes = message.Attributes ?? {};
  return {
    messageId: message.MessageId!,
    receiptHandle: message.ReceiptHandle!,
    body: message.Body!,
    attributes: {
      ApproximateReceiveCount: attributes['ApproximateReceiveCount'] ?? '1',
      SentTimestamp: attributes['SentTimestamp'] ?? '0',
      SenderId: attributes['SenderId'] ?? 'courier',
      ApproximateFirstReceiveTimestamp: attributes['ApproximateFirstReceiveTimestamp'] ?? '0',
      ...(attributes['MessageGroupId'] ? { MessageGroupId: attributes['MessageGroupId'] } : {}),
    },
    messageAttributes: Object.fromEntries(Object.entries(message.MessageAttributes ?? {}).map(([name, value]) => [name, { stringValue: value.StringValue!, dataType: value.DataType as 'String' }])),
    md5OfBody: message.MD5OfBody!,
    eventSource: 'aws:sqs',
    eventSourceARN: queueArn,
    awsRegion: 'us-east-1',
  };
}

describe('lambda', () => {
  it('relayOnce drains a PostgreSQL outbox into SQS, two calls at once, each message published once; then reports drained with nothing left', async () => {
    await assertSqsAnswers();
    const testId = uniqueId();
    testIds.push(testId);
    const store = await createPostgresFixture({ testId });
    const transport = new SqsTransport({ client, prefix: `${testId}-`, ...TEST_CONFIG });
    try {
      const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' }) as MessageDefinition<Order, Order>;
      const producer = createBus({ outbox: store.outbox, transport });
      const count = 45;
      await store.transaction(async (tx) => {
        for (let n = 0; n < count; n += 1) producer.outbox(tx).publish(Placed, { n }, { key: `k${n % 5}` });
      });
      const config = { outbox: store.outbox, transport, relay: { leaseMs: 5_000 } };
      const [a, b] = await Promise.all([relayOnce(config, { maxMs: 30_000 }), relayOnce(config, { maxMs: 30_000 })]);
      expect(a.published + b.published).toBe(count);
      expect([a.ended, b.ended]).toEqual(['drained', 'drained']);
      expect(a.left).toBe(0);
      const received = await receiveAll(`${testId}-orders`, count);
      expect(received.map((message) => (JSON.parse(message.Body!) as Order).n).sort((x, y) => x - y)).toEqual(Array.from({ length: count }, (_, n) => n));
      const again = await relayOnce(config, { maxMs: 10_000 });
      expect(again).toMatchObject({ published: 0, ended: 'drained', left: 0 });
    } finally {
      await transport.close();
      await store.close();
    }
  });

  it('relayOnce stops at maxMessages and leaves the rest pending', async () => {
    const testId = uniqueId();
    testIds.push(testId);
    const store = await createPostgresFixture({ testId });
    const transport = new SqsTransport({ client, prefix: `${testId}-`, ...TEST_CONFIG });
    try {
      const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' }) as MessageDefinition<Order, Order>;
      const producer = createBus({ outbox: store.outbox, transport });
      await store.transaction(async (tx) => {
        for (let n = 0; n < 30; n += 1) producer.outbox(tx).publish(Placed, { n });
      });
      const summary = await relayOnce({ outbox: store.outbox, transport, relay: { batchSize: 5 } }, { maxMessages: 10, maxMs: 20_000 });
      expect(summary.ended).toBe('maxMessages');
      expect(summary.published).toBeGreaterThanOrEqual(10);
      expect(summary.left).toBe(30 - summary.published);
    } finally {
      await transport.close();
      await store.close();
    }
  });

  for (const fifo of [false, true]) {
    it(`the event-source handler runs each record once through the inbox and reports failures as batchItemFailures (${fifo ? 'FIFO' : 'standard'})`, async () => {
      const testId = uniqueId();
      testIds.push(testId);
      const store = await createPostgresFixture({ testId });
      const transport = new SqsTransport({ client, prefix: `${testId}-`, ...TEST_CONFIG, fifo });
      const source = new SqsEventSource({ transport });
      const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' }) as MessageDefinition<Order, Order>;
      const bus = createBus({ outbox: store.outbox, inbox: store.inbox, transport: source, retry: { maxAttempts: 5 } });
      const runs: number[] = [];
      bus.subscribe(
        'billing',
        Placed,
        async (message, ctx) => {
          runs.push(message.payload.n);
          if (message.payload.n === 3) throw new Error('failing on purpose');
          if (message.payload.n === 4) throw new UnrecoverableError('poison on purpose');
          await store.recordEffect(ctx.tx, `n${message.payload.n}`);
        },
        { ordered: fifo },
      );
      try {
        await bus.start({ relay: false });
        const handler: (event: SQSEvent) => Promise<SQSBatchResponse> = source.handler();
        // Published straight through the transport; key 'a' holds n=3 then n=5 (FIFO: n=5 must not run after n=3 failed).
        const envelopes = [0, 1, 2, 3, 4, 5].map((n) => ({ n, key: n === 3 || n === 5 ? 'a' : `k${n}` }));
        await store.transaction(async (tx) => {
          for (const { n, key } of envelopes) bus.outbox(tx).publish(Placed, { n }, { key });
        });
        await relayOnce({ outbox: store.outbox, transport }, { maxMs: 20_000 });
        const queue = `${testId}-orders${fifo ? '.fifo' : ''}`;
        const messages = await receiveAll(queue, fifo ? 5 : 6);
        const arn = `arn:aws:sqs:us-east-1:000000000000:${queue}`;
        const event: SQSEvent = { Records: messages.map((message) => recordOf(message, arn)) };
        const byN = new Map(messages.map((message) => [(JSON.parse(message.Body!) as Order).n, message.MessageId!]));
        const response = await handler(event);
        const failed = response.batchItemFailures.map((failure) => failure.itemIdentifier);
        expect(failed).toContain(byN.get(3));
        expect(failed).not.toContain(byN.get(4));
        if (fifo && byN.has(5)) expect(failed).toContain(byN.get(5));
        // The same records again (the event source's redelivery): applied ones are not run twice.
        const before = runs.length;
        const second = await handler(event);
        expect(second.batchItemFailures.map((failure) => failure.itemIdentifier)).toContain(byN.get(3));
        const rerun = runs.slice(before);
        expect(rerun.filter((n) => n !== 3 && n !== 5 && n !== 4)).toEqual([]);
        const effects = await store.readEffects();
        expect(new Set(effects).size).toBe(effects.length);
        await eventually(async () => expect((await source.deadLetters.list('billing')).map((letter) => letter.envelope.payload)).toEqual([JSON.stringify({ n: 4 })]), { timeoutMs: 15_000 });
      } finally {
        await bus.stop();
        await store.close();
      }
    });
  }
});
