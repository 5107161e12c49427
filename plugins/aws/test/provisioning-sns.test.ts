// SNS → SQS provisioning, beyond the transport contract: with provisioning off a ConfigError
// names every missing topic, queue and subscription and nothing is created; provision() is
// idempotent and leaves each group's queue subscribed with raw delivery, a queue policy
// letting its topics send, and the redrive policy to its dead-letter queue.
import { GetSubscriptionAttributesCommand, ListSubscriptionsByTopicCommand, ListTopicsCommand, type SNSClient } from '@aws-sdk/client-sns';
import { GetQueueAttributesCommand, GetQueueUrlCommand } from '@aws-sdk/client-sqs';
import { ConfigError } from '@courier/core';
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SqsTransport } from '../src/index.js';
import { POLICY_SID, queuePolicy } from '../src/sns-topics.js';
import { TEST_CONFIG, assertSqsAnswers, deleteTestQueues, deleteTestTopics, onRealAws, snsClient, snsEndpoint, sqsClient } from './support/fixture.js';

const sqs = sqsClient();
let sns: SNSClient;
const testIds: string[] = [];
function prefix(): string {
  const id = uniqueId();
  testIds.push(id);
  return `${id}-`;
}
beforeAll(async () => {
  await assertSqsAnswers();
  sns = snsClient(onRealAws ? '' : (await snsEndpoint()).href);
});
afterAll(async () => {
  await Promise.all(testIds.flatMap((id) => [deleteTestQueues(id), deleteTestTopics(id)]));
  sns?.destroy();
  sqs.destroy();
});

async function topicNames(p: string): Promise<string[]> {
  const { Topics = [] } = await sns.send(new ListTopicsCommand({}));
  return Topics.map((topic) => topic.TopicArn!.split(':').at(-1)!).filter((name) => name.startsWith(p));
}

describe('sns → sqs provisioning', () => {
  it('with provisioning off, publish and subscribe fail with a ConfigError naming every missing topic, queue and subscription, and create nothing', async () => {
    const p = prefix();
    const transport = new SqsTransport({ client: sqs, sns, prefix: p, provision: false, ...TEST_CONFIG });
    const [result] = await transport.publish([{ ...makeEnvelope({ topic: 'orders' }) }]);
    expect(result?.ok === false && result.error).toBeInstanceOf(ConfigError);
    expect(result?.ok === false && result.error.message).toContain(`sns topic '${p}orders'`);
    const refused = (await transport.subscribe({ consumer: 'billing', topics: ['orders', 'refunds'], ordered: false, concurrency: 1 }, async () => undefined).catch((error: unknown) => error)) as ConfigError;
    expect(refused).toBeInstanceOf(ConfigError);
    expect(refused.problems).toEqual(
      expect.arrayContaining([
        expect.stringContaining(`sns topic '${p}orders'`),
        expect.stringContaining(`sns topic '${p}refunds'`),
        expect.stringContaining(`sqs queue '${p}billing'`),
        expect.stringContaining(`sqs queue '${p}billing-dlq'`),
        expect.stringContaining(`subscription of queue '${p}billing' to topic '${p}orders'`),
        expect.stringContaining(`subscription of queue '${p}billing' to topic '${p}refunds'`),
      ]),
    );
    expect(refused.problems).toHaveLength(6);
    expect(await topicNames(p)).toEqual([]);
    await expect(sqs.send(new GetQueueUrlCommand({ QueueName: `${p}billing` }))).rejects.toThrow();
    await transport.close();
  });

  it('provision() is idempotent: topics, queues, one raw subscription per topic, the queue policy for the topics and the redrive policy; then provisioning off finds it all', async () => {
    const p = prefix();
    // ElasticMQ takes a queue Policy and keeps none (GetQueueAttributes answers without it),
    // so the policy is read where the transport sends it.
    const policies: string[] = [];
    const watched = sqsClient();
    watched.middlewareStack.add(
      (next) => async (args) => {
        const policy = (args.input as { Attributes?: Record<string, string> }).Attributes?.['Policy'];
        if (policy !== undefined) policies.push(policy);
        return next(args);
      },
      { step: 'initialize', name: 'watchPolicy' },
    );
    const transport = new SqsTransport({ client: watched, sns, prefix: p, ...TEST_CONFIG, maxReceiveCount: 7 });
    const plan = { subscriptions: { billing: ['orders', 'refunds'], shipping: ['orders'] } };
    await transport.provision(plan);
    await transport.provision(plan);
    expect((await topicNames(p)).sort()).toEqual([`${p}orders`, `${p}refunds`]);
    const url = (await sqs.send(new GetQueueUrlCommand({ QueueName: `${p}billing` }))).QueueUrl!;
    const attributes = (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['All'] }))).Attributes!;
    const { Topics = [] } = await sns.send(new ListTopicsCommand({}));
    const arnOf = (name: string) => Topics.find((topic) => topic.TopicArn!.endsWith(`:${p}${name}`))!.TopicArn!;
    const policy = JSON.parse(attributes['Policy'] ?? policies.find((sent) => sent.includes(`"${attributes['QueueArn']}"`))!) as { Statement: { Sid: string; Resource: string; Condition: { ArnEquals: { 'aws:SourceArn': string[] } } }[] };
    const ours = policy.Statement.find((statement) => statement.Sid === POLICY_SID)!;
    expect(ours.Resource).toBe(attributes['QueueArn']);
    expect(ours.Condition.ArnEquals['aws:SourceArn']).toEqual([arnOf('orders'), arnOf('refunds')].sort());
    expect(JSON.parse(attributes['RedrivePolicy']!)).toMatchObject({ maxReceiveCount: 7 });
    const subscriptions = (await sns.send(new ListSubscriptionsByTopicCommand({ TopicArn: arnOf('orders') }))).Subscriptions ?? [];
    expect(subscriptions.map((subscription) => subscription.Endpoint!.split(':').at(-1)).sort()).toEqual([`${p}billing`, `${p}shipping`]);
    for (const subscription of subscriptions) {
      const raw = (await sns.send(new GetSubscriptionAttributesCommand({ SubscriptionArn: subscription.SubscriptionArn! }))).Attributes!['RawMessageDelivery'];
      expect(raw).toBe('true');
    }
    await transport.close();
    watched.destroy();
    const checking = new SqsTransport({ client: sqs, sns, prefix: p, provision: false, ...TEST_CONFIG });
    await checking.provision(plan);
    const subscription = await checking.subscribe({ consumer: 'billing', topics: ['orders', 'refunds'], ordered: false, concurrency: 1 }, async () => undefined);
    await subscription.close();
    await checking.close();
  });

  it('a topic deleted after its first publish is created again (provisioning on) or named in a ConfigError (off), never a message refusal', async () => {
    const p = prefix();
    const transport = new SqsTransport({ client: sqs, sns, prefix: p, ...TEST_CONFIG });
    const checking = new SqsTransport({ client: sqs, sns, prefix: p, provision: false, ...TEST_CONFIG });
    const publishOne = async (via: SqsTransport) => (await via.publish([{ ...makeEnvelope({ topic: 'orders' }) }]))[0]!;
    expect((await publishOne(transport)).ok).toBe(true);
    expect((await publishOne(checking)).ok).toBe(true);
    await deleteTestTopics(p.slice(0, -1));
    // Before the fix both failed with "TransportError: publishing to topic '…' failed" (PUBLISH_REJECTED: SNS NotFound is a
    // client fault), so a relay would have burned the messages' attempts on a deleted topic.
    const refused = await publishOne(checking);
    expect(refused.ok === false && refused.error).toBeInstanceOf(ConfigError);
    expect(refused.ok === false && refused.error.message).toContain(`sns topic '${p}orders' does not exist`);
    expect((await publishOne(transport)).ok).toBe(true);
    expect(await topicNames(p)).toEqual([`${p}orders`]);
    await transport.close();
    await checking.close();
  });

  it('the queue policy keeps statements that are not Courier\'s and adds topics to its own', () => {
    const other = { Sid: 'ops', Effect: 'Allow', Principal: { AWS: 'arn:aws:iam::1:root' }, Action: 'sqs:*', Resource: 'q' };
    const first = queuePolicy(JSON.stringify({ Version: '2012-10-17', Statement: [other] }), 'q', ['arn:t2']);
    const second = JSON.parse(queuePolicy(first, 'q', ['arn:t1', 'arn:t2'])) as { Statement: { Sid: string; Condition?: { ArnEquals: { 'aws:SourceArn': string[] } } }[] };
    expect(second.Statement.map((statement) => statement.Sid)).toEqual(['ops', POLICY_SID]);
    expect(second.Statement[1]!.Condition!.ArnEquals['aws:SourceArn']).toEqual(['arn:t1', 'arn:t2']);
    expect(queuePolicy(JSON.stringify(second), 'q', ['arn:t1'])).toBe(JSON.stringify(second));
  });

  it('the SNS mode declares fan-out; names and limits follow SNS topics and one SQS queue per group', () => {
    const transport = new SqsTransport({ client: sqs, sns, prefix: 'shop-', fifo: true });
    expect(transport.capabilities.fanOut).toBe(true);
    expect(transport.capabilities.orderingByKey).toBe(true);
    expect(transport.topicName('orders.v1')).toBe('shop-orders_v1.fifo');
    expect(transport.queuesOf({ consumer: 'billing', topics: ['orders', 'refunds'] })).toEqual(['shop-billing.fifo']);
    expect(transport.limits.topic?.chars).toBe(256 - 'shop-'.length - '.fifo'.length);
    expect(new SqsTransport({ client: sqs, prefix: 'shop-' }).capabilities.fanOut).toBe(false);
  });
});
