// Queue mode (`entities: 'queues'`) against the broker side, where the shared suites do not
// look: the envelope is on the queue itself (a plain SDK receiver of the queue reads it),
// the capabilities say what a queue can do, and a queue's dead letters — shared by every
// receiver of the queue — are in its `$DeadLetterQueue`, each kept for the group that
// dead-lettered it.
import { ServiceBusClient } from '@azure/service-bus';
import { ConfigError, type Delivery, type Envelope } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ServiceBusTransport } from '../src/index.js';
import { createServiceBusFixtureIn } from './support/fixture.js';
import { cleanupNamespace, onRealNamespace, REAL_CONNECTION_STRING } from './support/namespace.js';
import { standIn, standInConnectionString } from './support/standin-server.js';

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

const queueFixture = async (sessions: boolean) => {
  const fixture = await createServiceBusFixtureIn({ entities: 'queues', sessions }, { testId: uniqueId() });
  closers.push(() => fixture.close());
  return { fixture, transport: fixture.transport as ServiceBusTransport };
};

describe('ServiceBusTransport in queue mode', { timeout: onRealNamespace ? 120_000 : 30_000 }, () => {
  it('publishes into the queue itself: a plain SDK receiver of the queue reads the envelope on native properties (session-enabled queue: SessionId = key)', async () => {
    const { transport } = await queueFixture(true);
    const topic = 'orders.placed';
    const keyed: Envelope = { ...makeEnvelope({ topic, key: 'customer-7' }), causationId: 'cause-1', headers: { tenant: 't1' } };
    expect((await transport.publish([keyed]))[0]?.ok).toBe(true);
    if (!onRealNamespace) expect((await standIn()).server!.queueNames()).toContain(transport.entityOf(topic).toLowerCase());
    // The queue's own session of that key: no subscription in the path.
    const receiver = await (await rawClient()).acceptSession(transport.entityOf(topic), 'customer-7', { skipParsingBodyAsJson: true });
    closers.push(() => receiver.close());
    const [message] = await eventually(async () => {
      const got = await receiver.receiveMessages(1, { maxWaitTimeInMs: 1_000 });
      expect(got).toHaveLength(1);
      return got;
    }, { timeoutMs: 15_000 });
    expect(message).toMatchObject({ messageId: keyed.messageId, correlationId: keyed.correlationId, subject: keyed.type, contentType: 'application/json', sessionId: 'customer-7' });
    expect(message!.applicationProperties).toMatchObject({ 'courier-key': 'customer-7', 'courier-causation-id': 'cause-1', 'courier-topic': topic, 'courier-headers': '{"tenant":"t1"}' });
    expect(transport.fromMessage(message!)).toEqual(keyed);
    await receiver.completeMessage(message!);
  });

  it('a plain queue (no sessions): messages carry no SessionId and a plain SDK receiver of the queue reads them', async () => {
    const { transport } = await queueFixture(false);
    const topic = 'orders.placed';
    const envelope = makeEnvelope({ topic, key: 'customer-8' });
    expect((await transport.publish([envelope]))[0]?.ok).toBe(true);
    const receiver = (await rawClient()).createReceiver(transport.entityOf(topic), { skipParsingBodyAsJson: true });
    closers.push(() => receiver.close());
    const [message] = await eventually(async () => {
      const got = await receiver.receiveMessages(1, { maxWaitTimeInMs: 1_000 });
      expect(got).toHaveLength(1);
      return got;
    }, { timeoutMs: 15_000 });
    expect(message!.sessionId).toBeUndefined();
    expect(transport.fromMessage(message!)).toEqual(envelope);
    await receiver.completeMessage(message!);
  });

  it('capabilities follow the configuration: fanOut false on queues (true on topics), orderingByKey only with sessions, no consumer-name limit; a bad entities value is refused by name', async () => {
    const client = await rawClient();
    const queues = new ServiceBusTransport({ client, entities: 'queues' });
    const sessionQueues = new ServiceBusTransport({ client, entities: 'queues', sessions: true });
    const topics = new ServiceBusTransport({ client });
    expect(queues.capabilities).toMatchObject({ fanOut: false, orderingByKey: false, nativeDelay: true, nativeDeadLetter: true });
    expect(sessionQueues.capabilities).toMatchObject({ fanOut: false, orderingByKey: true });
    expect(topics.capabilities.fanOut).toBe(true);
    expect(queues.limits.consumer).toBeUndefined();
    expect(topics.limits.consumer).toEqual({ bytes: 50 });
    await expect(queues.subscribe({ consumer: 'ordered', topics: ['t'], ordered: true, concurrency: 1 }, async () => undefined)).rejects.toSatisfy(
      (error: unknown) => error instanceof ConfigError && /session-enabled queues/.test(error.message),
    );
    expect(() => new ServiceBusTransport({ client, entities: 'queue' as never })).toThrow(/'entities' must be 'topics' or 'queues', got "queue"/);
    await Promise.all([queues.close(), sessionQueues.close(), topics.close()]);
  });

  it("dead letters go to the queue's $DeadLetterQueue with reason and description, marked with their group: deadLetters lists, replays and purges only the group's own", async () => {
    const { fixture, transport } = await queueFixture(false);
    const topic = 'orders.placed';
    const seen: string[] = [];
    let refuse = true;
    const worker = await fixture.connect();
    await worker.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 2 }, async (delivery: Delivery) => {
      seen.push(delivery.envelope.messageId);
      if (refuse) return delivery.deadLetter({ code: 'HANDLER_UNRECOVERABLE', message: `refused ${delivery.envelope.payload}` });
      return delivery.ack();
    });
    const envelope = makeEnvelope({ topic, key: null, payload: '{"n":1}' });
    expect((await transport.publish([envelope]))[0]?.ok).toBe(true);
    const [letter] = await eventually(async () => {
      const letters = await transport.deadLetters.list('billing');
      expect(letters).toHaveLength(1);
      return letters;
    }, { timeoutMs: 15_000 });
    expect(letter).toMatchObject({ id: `${topic}:${letter!.id.split(':').pop()}`, consumer: 'billing', reason: { code: 'HANDLER_UNRECOVERABLE', message: 'refused {"n":1}' } });
    expect(letter!.envelope).toEqual(envelope);
    // The broker's own view: the queue's dead-letter sub-queue holds it.
    const dead = (await rawClient()).createReceiver(transport.entityOf(topic), { subQueueType: 'deadLetter', skipParsingBodyAsJson: true });
    closers.push(() => dead.close());
    const [peeked] = await dead.peekMessages(1);
    expect(peeked).toMatchObject({ messageId: envelope.messageId, deadLetterReason: 'HANDLER_UNRECOVERABLE', deadLetterErrorDescription: 'refused {"n":1}' });
    expect(peeked!.applicationProperties?.['courier-dead-for']).toBe('billing');
    // Another group (another process of a misconfigured deployment) neither sees nor takes it.
    expect(await transport.deadLetters.list('audit')).toEqual([]);
    expect(await transport.deadLetters.replay('audit', [letter!.id])).toBe(0);
    expect(await transport.deadLetters.purge('audit', [letter!.id])).toBe(0);
    refuse = false;
    expect(await transport.deadLetters.replay('billing', [letter!.id])).toBe(1);
    await eventually(() => expect(seen).toEqual([envelope.messageId, envelope.messageId]), { timeoutMs: 15_000 });
    expect(await transport.deadLetters.list('billing')).toEqual([]);
  });
});
