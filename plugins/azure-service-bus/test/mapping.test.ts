// Issue 13's transport claims the shared suites do not check, each against the broker side:
// the envelope on native Service Bus properties (read back with a plain SDK receiver),
// duplicate detection by MessageId, batches split when full, capabilities from the
// configuration, the broker's MaxDeliveryCount landing in `deadLetters`, and the mapping of
// ServiceBusError codes.
import { ServiceBusClient, ServiceBusError } from '@azure/service-bus';
import { ConfigError, type Delivery, type Envelope } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ServiceBusStandIn } from '../standin/service-bus-standin.js';
import { ServiceBusTransport, toTransportError } from '../src/index.js';
import { createServiceBusFixture } from './support/fixture.js';
import { cleanupNamespace, onRealNamespace, REAL_CONNECTION_STRING, realProvisioner, skipOnRealNamespace } from './support/namespace.js';
import { STANDIN_LOCK_MS, standIn, standInConnectionString } from './support/standin-server.js';

afterAll(cleanupNamespace);

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** A plain SDK client of the broker the fixture uses (the stand-in directly, or the namespace). */
const rawClient = async (): Promise<ServiceBusClient> => {
  const client = new ServiceBusClient(REAL_CONNECTION_STRING ?? standInConnectionString((await standIn()).port));
  closers.push(() => client.close());
  return client;
};

/** A subscription that exists before anything is sent (the stand-in makes it on the receiver's first request). */
const plainReceiver = async (client: ServiceBusClient, entity: string, name: string) => {
  await realProvisioner()?.ensureSubscription(entity, name, false);
  const receiver = client.createReceiver(entity, name, { skipParsingBodyAsJson: true });
  closers.push(() => receiver.close());
  await receiver.peekMessages(1);
  return receiver;
};

describe('ServiceBusTransport on the wire', { timeout: onRealNamespace ? 120_000 : 30_000 }, () => {
  it('maps the envelope onto native properties: MessageId, CorrelationId, Subject = type, ContentType, SessionId = key (keyless: messageId), the rest as application properties', async () => {
    const fixture = await createServiceBusFixture({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const transport = fixture.transport as ServiceBusTransport;
    const topic = 'orders.placed';
    const client = await rawClient();
    const receiver = await plainReceiver(client, transport.entityOf(topic), 'raw');
    const keyed: Envelope = { ...makeEnvelope({ topic, key: 'customer-7' }), causationId: 'cause-1', headers: { tenant: 't1' } };
    const keyless = makeEnvelope({ topic, key: null });
    expect((await transport.publish([keyed, keyless])).every((result) => result.ok)).toBe(true);
    const got = [];
    while (got.length < 2) got.push(...(await receiver.receiveMessages(2 - got.length, { maxWaitTimeInMs: 2_000 })));
    const byId = new Map(got.map((message) => [message.messageId, message]));
    const first = byId.get(keyed.messageId)!;
    expect(first).toMatchObject({ messageId: keyed.messageId, correlationId: keyed.correlationId, subject: keyed.type, contentType: 'application/json', sessionId: 'customer-7' });
    expect(Buffer.from(first.body as Uint8Array).toString('utf8')).toBe(keyed.payload);
    expect(first.applicationProperties).toMatchObject({ 'courier-key': 'customer-7', 'courier-causation-id': 'cause-1', 'courier-topic': topic, 'courier-version': keyed.version, 'courier-headers': '{"tenant":"t1"}' });
    expect(first.applicationProperties?.['courier-attempt'], 'attempt 1 travels as no property').toBeUndefined();
    expect(byId.get(keyless.messageId)).toMatchObject({ sessionId: keyless.messageId });
    expect(byId.get(keyless.messageId)!.applicationProperties?.['courier-key']).toBeUndefined();
    // What the transport reads back is the envelope it sent.
    expect(transport.fromMessage(first)).toEqual(keyed);
    for (const message of got) await receiver.completeMessage(message);
  });

  it('a re-published envelope (same messageId) is dropped by duplicate detection: the subscription gets it once', async () => {
    const fixture = await createServiceBusFixture({ testId: uniqueId() });
    closers.push(() => fixture.close());
    const transport = fixture.transport as ServiceBusTransport;
    const topic = 'orders.placed';
    const receiver = await plainReceiver(await rawClient(), transport.entityOf(topic), 'dedup');
    const envelope = makeEnvelope({ topic, key: 'k' });
    const marker = makeEnvelope({ topic, key: 'k' });
    expect((await transport.publish([envelope]))[0]?.ok).toBe(true);
    // A relay that died before marking the row sends it again: the send is accepted.
    expect((await transport.publish([envelope]))[0]?.ok).toBe(true);
    expect((await transport.publish([marker]))[0]?.ok).toBe(true);
    const got: string[] = [];
    await eventually(async () => {
      for (const message of await receiver.receiveMessages(3, { maxWaitTimeInMs: 500 })) {
        got.push(String(message.messageId));
        await receiver.completeMessage(message);
      }
      expect(got).toContain(marker.messageId);
    }, { timeoutMs: 10_000 });
    expect(await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 })).toEqual([]);
    expect(got).toEqual([envelope.messageId, marker.messageId]);
  });

  it('publish splits a topic\'s messages into several createMessageBatch batches when one is full, and answers every message in input order', async () => {
    const { port } = await standIn();
    const target = REAL_CONNECTION_STRING ?? standInConnectionString(port);
    let batches = 0;
    let sends = 0;
    // Counts the batches the transport opens and the sends it makes, on the SDK's own sender.
    const counted = () => {
      const client = new ServiceBusClient(target);
      const createSender = client.createSender.bind(client);
      client.createSender = ((entity: string) => {
        const sender = createSender(entity);
        const createMessageBatch = sender.createMessageBatch.bind(sender);
        const sendMessages = sender.sendMessages.bind(sender);
        sender.createMessageBatch = (options) => ((batches += 1), createMessageBatch(options));
        sender.sendMessages = (messages, options) => ((sends += 1), sendMessages(messages, options));
        return sender;
      }) as typeof client.createSender;
      return client;
    };
    const prefix = `${uniqueId()}.`;
    const transport = new ServiceBusTransport({ client: counted, prefix, maxMessageBytes: 200 * 1024 });
    closers.push(() => transport.close());
    const topic = 'orders.placed';
    await realProvisioner()?.ensureTopic(transport.entityOf(topic));
    const receiver = await plainReceiver(await rawClient(), transport.entityOf(topic), 'split');
    // 100 KiB each: two fit in one 256 KiB batch, not three.
    const envelopes = Array.from({ length: 5 }, () => ({ ...makeEnvelope({ topic, key: null }), payload: JSON.stringify('x'.repeat(100 * 1024)) }));
    const results = await transport.publish(envelopes);
    expect(results.map((result) => [result.messageId, result.ok])).toEqual(envelopes.map((envelope) => [envelope.messageId, true]));
    expect(batches, 'batches opened').toBe(3);
    expect(sends, 'one send per batch').toBe(3);
    const got: string[] = [];
    await eventually(async () => {
      for (const message of await receiver.receiveMessages(5, { maxWaitTimeInMs: 500 })) {
        got.push(String(message.messageId));
        await receiver.completeMessage(message);
      }
      expect(got).toHaveLength(5);
    }, { timeoutMs: 15_000 });
    expect(got).toEqual(envelopes.map((envelope) => envelope.messageId));
  });

  it('capabilities follow the configuration: per-key order only with sessions, and an ordered subscribe without them is refused by name', async () => {
    const client = await rawClient();
    const plain = new ServiceBusTransport({ client });
    const sessions = new ServiceBusTransport({ client, sessions: true });
    expect(plain.capabilities).toMatchObject({ orderingByKey: false, orderedPipelining: false, nativeDelay: true, nativeDeadLetter: true });
    expect(sessions.capabilities.orderingByKey).toBe(true);
    await expect(plain.subscribe({ consumer: 'ordered', topics: ['t'], ordered: true, concurrency: 1 }, async () => undefined)).rejects.toSatisfy(
      (error: unknown) => error instanceof ConfigError && /sessions: true/.test(error.message),
    );
    await plain.close();
    await sessions.close();
    // A client instance passed in is never closed by the transport: it still sends.
    const queue = uniqueId();
    await realProvisioner()?.ensureQueue(queue, false, false);
    const sender = client.createSender(queue);
    await sender.sendMessages({ messageId: 'still-open', body: 'x' });
    await sender.close();
  });
});

// The broker's own MaxDeliveryCount is a backstop behind Courier's attempts: a message it
// dead-letters must be visible (and replayable) through `deadLetters`, as the README promises.
describe.skipIf(skipOnRealNamespace('a stand-in of its own with MaxDeliveryCount 2; provision such a subscription to try it on a namespace'))('the broker\'s MaxDeliveryCount', () => {
  let server: ServiceBusStandIn | undefined;
  afterAll(async () => {
    await server?.close();
  });

  it(`a message the broker dead-letters after MaxDeliveryCount deliveries is listed by deadLetters with reason MaxDeliveryCountExceeded, and replays (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues#maximum-delivery-count)`, async () => {
    server = await ServiceBusStandIn.start({ isTopic: () => true, entityDefaults: () => ({ lockDurationMs: STANDIN_LOCK_MS, maxDeliveryCount: 2 }) });
    const client = new ServiceBusClient(server.connectionString);
    closers.push(() => client.close());
    const transport = new ServiceBusTransport({ client, prefix: `${uniqueId()}.` });
    closers.push(() => transport.close());
    const topic = 'orders.placed';
    const seen: string[] = [];
    let refuse = true;
    const subscription = await transport.subscribe({ consumer: 'tired', topics: [topic], ordered: false, concurrency: 1 }, async (delivery: Delivery) => {
      seen.push(`${delivery.envelope.messageId}@${delivery.attempt}`);
      if (refuse) return delivery.retry(0, { code: 'TEST_RETRY', message: 'retried by the test' });
      return delivery.ack();
    });
    closers.push(() => subscription.close());
    const envelope = makeEnvelope({ topic, key: null });
    expect((await transport.publish([envelope]))[0]?.ok).toBe(true);
    const [letter] = await eventually(async () => {
      const letters = await transport.deadLetters.list('tired');
      expect(letters).toHaveLength(1);
      return letters;
    }, { timeoutMs: 15_000 });
    expect(seen).toEqual([`${envelope.messageId}@1`, `${envelope.messageId}@2`]);
    expect(letter!.envelope).toEqual(envelope);
    expect(letter!.reason.code).toBe('MaxDeliveryCountExceeded');
    refuse = false;
    expect(await transport.deadLetters.replay('tired', [letter!.id])).toBe(1);
    await eventually(() => expect(seen).toHaveLength(3), { timeoutMs: 10_000 });
    expect(seen[2]).toBe(`${envelope.messageId}@1`);
    expect(await transport.deadLetters.list('tired')).toEqual([]);
  });
});

describe('toTransportError', () => {
  const failure = (code: string, retryable: boolean): ServiceBusError => {
    const error = new ServiceBusError(`${code} happened`, code as ServiceBusError['code']);
    error.retryable = retryable;
    return error;
  };

  it('throttling and connection codes are retriable TRANSPORT errors (the relay pauses, no attempt counted)', () => {
    for (const code of ['ServiceBusy', 'ServiceCommunicationProblem', 'ServiceTimeout']) {
      expect(toTransportError(failure(code, true), 'send'), code).toMatchObject({ code: 'TRANSPORT', retriable: true });
    }
    // Socket failures come as GeneralError.
    expect(toTransportError(failure('GeneralError', true), 'send')).toMatchObject({ code: 'PUBLISH_REJECTED' });
    expect(toTransportError(new ServiceBusError('connect ECONNREFUSED 127.0.0.1:1', 'GeneralError'), 'send')).toMatchObject({ code: 'TRANSPORT', retriable: true });
  });

  it('MessageSizeExceeded is PAYLOAD_TOO_LARGE; other codes are PUBLISH_REJECTED, retriable exactly as the SDK says', () => {
    expect(toTransportError(failure('MessageSizeExceeded', false), 'send')).toMatchObject({ code: 'PAYLOAD_TOO_LARGE', retriable: false });
    expect(toTransportError(failure('MessagingEntityNotFound', false), 'send')).toMatchObject({ code: 'PUBLISH_REJECTED', retriable: false });
    expect(toTransportError(failure('QuotaExceeded', true), 'send')).toMatchObject({ code: 'PUBLISH_REJECTED', retriable: true });
    const error = toTransportError(failure('UnauthorizedAccess', false), 'send to orders');
    expect(error.message).toBe('send to orders: [UnauthorizedAccess] UnauthorizedAccess happened');
  });

  it('an AggregateError of the SDK\'s retries is judged by its last attempt', () => {
    const aggregate = new AggregateError([failure('MessagingEntityNotFound', false), failure('ServiceBusy', true)], 'retries exhausted');
    expect(toTransportError(aggregate, 'send')).toMatchObject({ code: 'TRANSPORT', retriable: true });
  });
});
