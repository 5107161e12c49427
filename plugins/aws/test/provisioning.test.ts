// What lies beyond the transport contract: provisioning (idempotent; off = a ConfigError
// naming every missing queue), the redrive policy, the attribute budget, batching limits.
import { GetQueueAttributesCommand, GetQueueUrlCommand, ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import { ConfigError, type Envelope } from '@courier/core';
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, describe, expect, it } from 'vitest';
import { ATTRIBUTES, SqsTransport } from '../src/index.js';
import { TEST_CONFIG, assertSqsAnswers, deleteTestQueues, sqsClient } from './support/fixture.js';

const client = sqsClient();
const testIds: string[] = [];
function prefix(): string {
  const id = uniqueId();
  testIds.push(id);
  return `${id}-`;
}
afterAll(async () => {
  await Promise.all(testIds.map((id) => deleteTestQueues(id)));
  client.destroy();
});

function envelopeOn(topic: string, overrides: Partial<Envelope> = {}): Envelope {
  return { ...makeEnvelope({ topic }), ...overrides };
}

describe('provisioning', () => {
  it('with provisioning off, publish and subscribe fail with a ConfigError naming each missing queue, and create nothing', async () => {
    await assertSqsAnswers();
    const p = prefix();
    const transport = new SqsTransport({ client, prefix: p, provision: false, ...TEST_CONFIG });
    const [result] = await transport.publish([envelopeOn('orders')]);
    expect(result?.ok).toBe(false);
    expect(result && !result.ok && result.error).toBeInstanceOf(ConfigError);
    expect(result && !result.ok && result.error.message).toContain(`'${p}orders'`);
    const refused = await transport.subscribe({ consumer: 'billing', topics: ['orders'], ordered: false, concurrency: 1 }, async () => undefined).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as Error).message).toContain(`'${p}orders'`);
    expect((refused as Error).message).toContain(`'${p}billing-dlq'`);
    await expect(client.send(new GetQueueUrlCommand({ QueueName: `${p}orders` }))).rejects.toThrow();
    expect(await transport.deadLetters.list('billing')).toEqual([]);
    await transport.close();
  });

  it('provision() is idempotent; subscribe sets the redrive policy to the consumer dead-letter queue once', async () => {
    const p = prefix();
    const transport = new SqsTransport({ client, prefix: p, ...TEST_CONFIG, maxReceiveCount: 7 });
    await transport.provision({ topics: ['orders'], consumers: ['billing'] });
    await transport.provision({ topics: ['orders'], consumers: ['billing'] });
    const subscription = await transport.subscribe({ consumer: 'billing', topics: ['orders'], ordered: false, concurrency: 1 }, async () => undefined);
    await subscription.close();
    await transport.close();
    const url = (await client.send(new GetQueueUrlCommand({ QueueName: `${p}orders` }))).QueueUrl!;
    const dlq = (await client.send(new GetQueueUrlCommand({ QueueName: `${p}billing-dlq` }))).QueueUrl!;
    const arn = (await client.send(new GetQueueAttributesCommand({ QueueUrl: dlq, AttributeNames: ['QueueArn'] }))).Attributes!['QueueArn'];
    const policy = (await client.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['RedrivePolicy', 'VisibilityTimeout'] }))).Attributes!;
    expect(JSON.parse(policy['RedrivePolicy']!)).toMatchObject({ deadLetterTargetArn: arn, maxReceiveCount: 7 });
    expect(policy['VisibilityTimeout']).toBe(String(TEST_CONFIG.visibilityTimeoutSeconds));
  });

  it('a queue deleted after its first publish is created again (provisioning on) or named in a ConfigError (off), never a message refusal', async () => {
    const p = prefix();
    const transport = new SqsTransport({ client, prefix: p, ...TEST_CONFIG });
    const checking = new SqsTransport({ client, prefix: p, provision: false, ...TEST_CONFIG });
    const publishOne = async (via: SqsTransport) => (await via.publish([envelopeOn('orders')]))[0]!;
    expect((await publishOne(transport)).ok).toBe(true);
    expect((await publishOne(checking)).ok).toBe(true);
    await deleteTestQueues(p.slice(0, -1));
    // Before the fix each message failed PUBLISH_REJECTED (QueueDoesNotExist is a client fault), burning its attempts in a relay.
    const refused = await publishOne(checking);
    expect(refused.ok === false && refused.error).toBeInstanceOf(ConfigError);
    expect(refused.ok === false && refused.error.message).toContain(`sqs queue '${p}orders' does not exist`);
    expect((await publishOne(transport)).ok).toBe(true);
    await transport.close();
    await checking.close();
  });

  it('an ordered consumer on standard queues is a ConfigError; bad settings are listed at once', async () => {
    const transport = new SqsTransport({ client, prefix: prefix(), ...TEST_CONFIG });
    await expect(transport.subscribe({ consumer: 'c', topics: ['t'], ordered: true, concurrency: 1 }, async () => undefined)).rejects.toThrow(/fifo: true/);
    expect(() => new SqsTransport({ client, prefix: 'bad prefix', waitTimeSeconds: 21, visibilityTimeoutSeconds: 1 })).toThrow(/3 problems/);
    await transport.close();
  });
});

describe('mapping', () => {
  it('the envelope takes two attributes of the ten; the body is the payload byte for byte', async () => {
    const p = prefix();
    const transport = new SqsTransport({ client, prefix: p, ...TEST_CONFIG });
    const headers = Object.fromEntries(Array.from({ length: 40 }, (_, index) => [`h${index}`, `v${index}`]));
    const envelope = envelopeOn('orders', { headers, payload: '{"a": 1,  "b":"é"}' });
    const [result] = await transport.publish([envelope]);
    expect(result?.ok).toBe(true);
    const url = (await client.send(new GetQueueUrlCommand({ QueueName: `${p}orders` }))).QueueUrl!;
    const { Messages = [] } = await client.send(new ReceiveMessageCommand({ QueueUrl: url, MessageAttributeNames: ['All'], WaitTimeSeconds: 2 }));
    expect(Messages).toHaveLength(1);
    expect(Object.keys(Messages[0]!.MessageAttributes ?? {}).sort()).toEqual([ATTRIBUTES.envelope, ATTRIBUTES.type].sort());
    expect(Messages[0]!.Body).toBe(envelope.payload);
    await transport.close();
  });

  it('more than 10 messages or 256 KiB go in several batches, every one confirmed; a message over SQS limits with its attributes is refused alone', async () => {
    const transport = new SqsTransport({ client, prefix: prefix(), ...TEST_CONFIG });
    const big = JSON.stringify('x'.repeat(100 * 1024));
    const envelopes = [...Array.from({ length: 23 }, () => envelopeOn('orders')), ...Array.from({ length: 4 }, () => envelopeOn('orders', { payload: big }))];
    const headers = Object.fromEntries(Array.from({ length: 20 }, (_, index) => [`h${index}`, 'v'.repeat(1000)]));
    const overAll = envelopeOn('orders', { headers, payload: JSON.stringify('y'.repeat(239 * 1024)) });
    const results = await transport.publish([...envelopes, overAll]);
    expect(results.slice(0, -1).every((result) => result.ok)).toBe(true);
    const last = results.at(-1)!;
    expect(last.ok === false && last.error.code).toBe('PAYLOAD_TOO_LARGE');
    await transport.close();
  });

  it('characters SQS refuses are refused at validate and in the result, alone', async () => {
    const transport = new SqsTransport({ client, prefix: prefix(), ...TEST_CONFIG });
    const bad = envelopeOn('orders', { payload: JSON.stringify('\uFFFF') });
    expect(transport.validate(bad)).toHaveLength(1);
    const results = await transport.publish([envelopeOn('orders'), bad, envelopeOn('orders')]);
    expect(results.map((result) => result.ok)).toEqual([true, false, true]);
    await transport.close();
  });
});
