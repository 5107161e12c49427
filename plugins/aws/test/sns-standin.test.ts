// Holds the SNS stand-in (test/support/sns-standin.ts) to the AWS behaviour it claims, through
// the real `@aws-sdk/client-sns`, delivering into ElasticMQ. On real AWS nothing here runs:
// these cases are about the stand-in itself.
import {
  CreateTopicCommand,
  GetTopicAttributesCommand,
  ListSubscriptionsByTopicCommand,
  PublishBatchCommand,
  PublishCommand,
  SNSClient,
  SubscribeCommand,
  UnsubscribeCommand,
} from '@aws-sdk/client-sns';
import { CreateQueueCommand, GetQueueAttributesCommand, ReceiveMessageCommand, type Message } from '@aws-sdk/client-sqs';
import { uniqueId } from '@courier/conformance';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { assertSqsAnswers, deleteTestQueues, sqsClient } from './support/fixture.js';
import { SnsStandIn } from './support/sns-standin.js';

const sqs = sqsClient();
let standIn: SnsStandIn;
let sns: SNSClient;
const testIds: string[] = [];

beforeAll(async () => {
  await assertSqsAnswers();
  standIn = await SnsStandIn.start({ sqs });
  sns = new SNSClient({ endpoint: standIn.endpoint, region: 'us-east-1', credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' }, maxAttempts: 1 });
});
afterAll(async () => {
  sns?.destroy();
  await standIn?.close();
  await Promise.all(testIds.map((id) => deleteTestQueues(id)));
  sqs.destroy();
});

function prefix(): string {
  const id = uniqueId();
  testIds.push(id);
  return `${id}-`;
}

async function queue(name: string, fifo = false): Promise<{ url: string; arn: string }> {
  const url = (await sqs.send(new CreateQueueCommand({ QueueName: name, Attributes: fifo ? { FifoQueue: 'true' } : {} }))).QueueUrl!;
  const arn = (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['QueueArn'] }))).Attributes!['QueueArn']!;
  return { url, arn };
}

/** Receives until `count` messages came or 5 s passed (a bounded wait, no sleep). */
async function receive(url: string, count: number): Promise<Message[]> {
  const got: Message[] = [];
  const until = Date.now() + 5_000;
  while (got.length < count && Date.now() < until) {
    const { Messages = [] } = await sqs.send(
      new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: ['All'], MessageSystemAttributeNames: ['MessageGroupId', 'MessageDeduplicationId'] }),
    );
    got.push(...Messages);
  }
  return got;
}

const errorName = (promise: Promise<unknown>) => promise.then(() => 'resolved', (error: unknown) => (error as Error).name);

describe('sns stand-in: topics and subscriptions', () => {
  it('CreateTopic is idempotent, refuses other attributes for the same name and bad FIFO names; GetTopicAttributes answers NotFound for a missing topic', async () => {
    const p = prefix();
    const first = await sns.send(new CreateTopicCommand({ Name: `${p}orders` }));
    const again = await sns.send(new CreateTopicCommand({ Name: `${p}orders` }));
    expect(again.TopicArn).toBe(first.TopicArn);
    expect(first.TopicArn).toMatch(new RegExp(`^arn:aws:sns:us-east-1:\\d{12}:${p}orders$`));
    const fifo = await sns.send(new CreateTopicCommand({ Name: `${p}orders.fifo`, Attributes: { FifoTopic: 'true', ContentBasedDeduplication: 'false' } }));
    const attributes = (await sns.send(new GetTopicAttributesCommand({ TopicArn: fifo.TopicArn! }))).Attributes!;
    expect(attributes).toMatchObject({ FifoTopic: 'true', ContentBasedDeduplication: 'false', TopicArn: fifo.TopicArn });
    expect(await errorName(sns.send(new CreateTopicCommand({ Name: `${p}orders.fifo`, Attributes: { FifoTopic: 'true', ContentBasedDeduplication: 'true' } })))).toBe('InvalidParameterException');
    expect(await errorName(sns.send(new CreateTopicCommand({ Name: `${p}plain.fifo` })))).toBe('InvalidParameterException');
    expect(await errorName(sns.send(new CreateTopicCommand({ Name: `${p}bad name` })))).toBe('InvalidParameterException');
    expect(await errorName(sns.send(new GetTopicAttributesCommand({ TopicArn: first.TopicArn!.replace('orders', 'missing') })))).toBe('NotFoundException');
  });

  it('Subscribe (sqs, raw) is idempotent, listed by topic, refused with other attributes; Unsubscribe removes it, twice is NotFound; a FIFO queue cannot subscribe to a standard topic', async () => {
    const p = prefix();
    const { TopicArn } = await sns.send(new CreateTopicCommand({ Name: `${p}orders` }));
    const { arn } = await queue(`${p}billing`);
    const subscribe = (raw: string) => sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: arn, Attributes: { RawMessageDelivery: raw }, ReturnSubscriptionArn: true }));
    const first = await subscribe('true');
    expect((await subscribe('true')).SubscriptionArn).toBe(first.SubscriptionArn);
    expect(await errorName(subscribe('false'))).toBe('InvalidParameterException');
    const listed = await sns.send(new ListSubscriptionsByTopicCommand({ TopicArn: TopicArn! }));
    expect(listed.Subscriptions).toEqual([expect.objectContaining({ SubscriptionArn: first.SubscriptionArn, Protocol: 'sqs', Endpoint: arn, TopicArn })]);
    const fifoQueue = await queue(`${p}billing.fifo`, true);
    expect(await errorName(sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: fifoQueue.arn })))).toBe('InvalidParameterException');
    await sns.send(new UnsubscribeCommand({ SubscriptionArn: first.SubscriptionArn! }));
    expect((await sns.send(new ListSubscriptionsByTopicCommand({ TopicArn: TopicArn! }))).Subscriptions ?? []).toEqual([]);
    expect(await errorName(sns.send(new UnsubscribeCommand({ SubscriptionArn: first.SubscriptionArn! })))).toBe('NotFoundException');
  });
});

describe('sns stand-in: publishing', () => {
  it('Publish fans out: a raw subscription gets the message as is with its attributes, another the JSON notification', async () => {
    const p = prefix();
    const { TopicArn } = await sns.send(new CreateTopicCommand({ Name: `${p}orders` }));
    const raw = await queue(`${p}raw`);
    const wrapped = await queue(`${p}wrapped`);
    await sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: raw.arn, Attributes: { RawMessageDelivery: 'true' } }));
    await sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: wrapped.arn }));
    const message = '{"a": 1,  "b":"é"}';
    const { MessageId } = await sns.send(new PublishCommand({ TopicArn: TopicArn!, Message: message, MessageAttributes: { kind: { DataType: 'String', StringValue: 'x' }, n: { DataType: 'Number', StringValue: '42' } } }));
    const [got] = await receive(raw.url, 1);
    expect(got?.Body).toBe(message);
    expect(got?.MessageAttributes).toEqual({ kind: expect.objectContaining({ DataType: 'String', StringValue: 'x' }), n: expect.objectContaining({ DataType: 'Number', StringValue: '42' }) });
    const [notification] = await receive(wrapped.url, 1);
    expect(JSON.parse(notification!.Body!)).toMatchObject({ Type: 'Notification', MessageId, TopicArn, Message: message, MessageAttributes: { kind: { Type: 'String', Value: 'x' } } });
  });

  it('PublishBatch: more than 10 entries, repeated ids or none fail the call; an entry SNS refuses fails alone and its neighbours are delivered', async () => {
    const p = prefix();
    const { TopicArn } = await sns.send(new CreateTopicCommand({ Name: `${p}orders` }));
    const target = await queue(`${p}billing`);
    await sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: target.arn, Attributes: { RawMessageDelivery: 'true' } }));
    const entries = (count: number) => Array.from({ length: count }, (_, index) => ({ Id: `e${index}`, Message: `m${index}` }));
    expect(await errorName(sns.send(new PublishBatchCommand({ TopicArn: TopicArn!, PublishBatchRequestEntries: entries(11) })))).toBe('TooManyEntriesInBatchRequestException');
    expect(await errorName(sns.send(new PublishBatchCommand({ TopicArn: TopicArn!, PublishBatchRequestEntries: [{ Id: 'a', Message: '1' }, { Id: 'a', Message: '2' }] })))).toBe('BatchEntryIdsNotDistinctException');
    expect(await errorName(sns.send(new PublishBatchCommand({ TopicArn: TopicArn!, PublishBatchRequestEntries: [] })))).toBe('EmptyBatchRequestException');
    const batch = entries(10);
    batch[4] = { ...batch[4]!, MessageAttributes: { bad: { DataType: 'Number', StringValue: 'not a number' } } } as (typeof batch)[number];
    const answer = await sns.send(new PublishBatchCommand({ TopicArn: TopicArn!, PublishBatchRequestEntries: batch }));
    expect(answer.Failed).toEqual([expect.objectContaining({ Id: 'e4', Code: 'InvalidParameterValue', SenderFault: true })]);
    expect(answer.Successful?.map((entry) => entry.Id).sort()).toEqual(['e0', 'e1', 'e2', 'e3', 'e5', 'e6', 'e7', 'e8', 'e9']);
    const got = await receive(target.url, 9);
    expect(got.map((message) => message.Body).sort()).toEqual(['m0', 'm1', 'm2', 'm3', 'm5', 'm6', 'm7', 'm8', 'm9']);
  });

  it('FIFO: group and de-duplication ids reach the FIFO queue; a repeated de-duplication id within 5 minutes is accepted and not delivered; a missing group id fails its entry', async () => {
    const p = prefix();
    const { TopicArn } = await sns.send(new CreateTopicCommand({ Name: `${p}orders.fifo`, Attributes: { FifoTopic: 'true' } }));
    const target = await queue(`${p}billing.fifo`, true);
    await sns.send(new SubscribeCommand({ TopicArn: TopicArn!, Protocol: 'sqs', Endpoint: target.arn, Attributes: { RawMessageDelivery: 'true' } }));
    const answer = await sns.send(
      new PublishBatchCommand({
        TopicArn: TopicArn!,
        PublishBatchRequestEntries: [
          { Id: 'a', Message: 'k1-1', MessageGroupId: 'k1', MessageDeduplicationId: 'd1' },
          { Id: 'b', Message: 'k1-2', MessageGroupId: 'k1', MessageDeduplicationId: 'd2' },
          { Id: 'c', Message: 'no group', MessageDeduplicationId: 'd3' },
          { Id: 'd', Message: 'k1-1 again', MessageGroupId: 'k1', MessageDeduplicationId: 'd1' },
        ],
      }),
    );
    expect(answer.Failed).toEqual([expect.objectContaining({ Id: 'c', Code: 'InvalidParameter', SenderFault: true })]);
    expect(answer.Successful?.map((entry) => entry.Id)).toEqual(['a', 'b', 'd']);
    expect(answer.Successful?.[2]?.MessageId).toBe(answer.Successful?.[0]?.MessageId);
    expect(BigInt(answer.Successful![1]!.SequenceNumber!)).toBeGreaterThan(BigInt(answer.Successful![0]!.SequenceNumber!));
    expect(await errorName(sns.send(new PublishCommand({ TopicArn: TopicArn!, Message: 'x', MessageGroupId: 'k' })))).toBe('InvalidParameterException');
    const got = await receive(target.url, 3);
    expect(got.map((message) => [message.Body, message.Attributes?.['MessageGroupId'], message.Attributes?.['MessageDeduplicationId']])).toEqual([
      ['k1-1', 'k1', 'd1'],
      ['k1-2', 'k1', 'd2'],
    ]);
  });
});
