// The stand-in held to the Service Bus behaviour it claims, through the real, unmodified
// @azure/service-bus client. Each case names the Microsoft documentation page it follows.
// With COURIER_ASB_CONNECTION_STRING set, the same cases run against that namespace (its
// queues and subscriptions provisioned per case, deleted after the file); what only the
// stand-in can show (its message counts, throttling on demand) is left out there, saying so.
import { isServiceBusError, ServiceBusAdministrationClient, ServiceBusClient, type ServiceBusReceivedMessage } from '@azure/service-bus';
import { eventually, uniqueId } from '@courier/conformance';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import rhea from 'rhea';
import { ServiceBusStandIn } from '../standin/service-bus-standin.js';
import { REAL_CONNECTION_STRING, onRealNamespace, skipOnRealNamespace } from './support/namespace.js';
import { Provisioner, namespaceLockMs } from './support/provisioning.js';
import { standInAdministration } from './support/standin-server.js';

const DOCS = 'https://learn.microsoft.com/azure/service-bus-messaging';
/** A namespace takes no lock under 5 s. */
const LOCK_MS = onRealNamespace ? namespaceLockMs(1_000) : 1_000;
/** The link's max-message-size: the stand-in is set to 64 KiB; a Standard namespace has 256 KiB. */
const MAX_BYTES = onRealNamespace ? 256 * 1024 : 64 * 1024;

let server: ServiceBusStandIn;
let client: ServiceBusClient;
let target: string;
const provisioner = REAL_CONNECTION_STRING
  ? new Provisioner(new ServiceBusAdministrationClient(REAL_CONNECTION_STRING), { lockDurationMs: LOCK_MS, maxDeliveryCount: 3, duplicateDetection: false, autoDeleteOnIdleMs: 10 * 60_000 })
  : undefined;

/** A fresh queue (`-sessions`: session-enabled, `-dedup`: duplicate detection); the stand-in makes it on first use. */
const queueNamed = async (suffix: '' | '-sessions' | '-dedup' = ''): Promise<string> => {
  const name = `${uniqueId()}${suffix}`;
  await provisioner?.ensureQueue(name, suffix === '-sessions', suffix === '-dedup');
  return name;
};

/** Makes a subscription exist now on a real namespace (the stand-in makes it when a receiver first attaches). */
const subscriptionNamed = async (topic: string, name: string): Promise<string> => {
  await provisioner?.ensureSubscription(topic, name, false);
  return name;
};

beforeAll(async () => {
  if (REAL_CONNECTION_STRING) {
    target = REAL_CONNECTION_STRING;
    client = new ServiceBusClient(target, { retryOptions: { maxRetries: 0, timeoutInMs: 10_000 } });
    return;
  }
  server = await ServiceBusStandIn.start({
    maxMessageBytes: 64 * 1024,
    entityDefaults: (path) => ({
      lockDurationMs: LOCK_MS,
      maxDeliveryCount: 3,
      requiresSession: path.includes('-sessions'),
      duplicateDetection: path.includes('-dedup'),
    }),
  });
  target = server.connectionString;
  client = new ServiceBusClient(target, { retryOptions: { maxRetries: 0, timeoutInMs: 5_000 } });
});

afterAll(async () => {
  await client?.close();
  await server?.close();
  for (const failure of (await provisioner?.cleanup()) ?? []) console.warn(`[azure-service-bus] could not delete ${failure}`);
});

const receiveAll = async (entity: string, count: number, options: { subQueueType?: 'deadLetter'; wait?: number } = {}): Promise<ServiceBusReceivedMessage[]> => {
  const receiver = client.createReceiver(entity, options.subQueueType ? { subQueueType: options.subQueueType } : {});
  const received: ServiceBusReceivedMessage[] = [];
  const deadline = Date.now() + (options.wait ?? 5_000);
  while (received.length < count && Date.now() < deadline) received.push(...(await receiver.receiveMessages(count - received.length, { maxWaitTimeInMs: 500 })));
  for (const message of received) await receiver.completeMessage(message);
  await receiver.close();
  return received;
};

describe('Service Bus stand-in', { timeout: onRealNamespace ? 120_000 : 30_000 }, () => {
  it(`sends and receives every message property (${DOCS}/service-bus-messages-payloads)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const receiver = client.createReceiver(queue);
    await sender.sendMessages({
      messageId: 'm-1',
      correlationId: 'c-1',
      subject: 'orders.OrderPlaced',
      contentType: 'application/json',
      body: '{"a":1}',
      applicationProperties: { 'courier-version': 2, text: 'é' },
    });
    const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(message).toMatchObject({ messageId: 'm-1', correlationId: 'c-1', subject: 'orders.OrderPlaced', contentType: 'application/json', body: '{"a":1}', deliveryCount: 1 });
    expect(message!.applicationProperties).toEqual({ 'courier-version': 2, text: 'é' });
    expect(message!.sequenceNumber?.toNumber()).toBeGreaterThan(0);
    expect(message!.lockedUntilUtc!.getTime()).toBeGreaterThan(Date.now());
    await receiver.completeMessage(message!);
    await sender.close();
    await receiver.close();
  });

  it(`a batch from createMessageBatch arrives whole and in order; its size limit is the link's (${DOCS}/service-bus-quotas)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const batch = await sender.createMessageBatch();
    expect(batch.maxSizeInBytes).toBe(MAX_BYTES);
    for (let index = 0; index < 50; index += 1) expect(batch.tryAddMessage({ messageId: `m-${index}`, body: `b${index}` })).toBe(true);
    expect(batch.tryAddMessage({ body: 'x'.repeat(MAX_BYTES + 6 * 1024) })).toBe(false);
    await sender.sendMessages(batch);
    const received = await receiveAll(queue, 50);
    expect(received.map((message) => message.messageId)).toEqual(Array.from({ length: 50 }, (_, index) => `m-${index}`));
    // A message over the limit sent alone is refused by the broker.
    await expect(sender.sendMessages({ messageId: 'big', body: 'x'.repeat(MAX_BYTES + 6 * 1024) })).rejects.toSatisfy((error: unknown) => isServiceBusError(error) && error.code === 'MessageSizeExceeded');
    await sender.close();
  });

  it(`peek-lock: complete removes; abandon and lock expiry make the message available again with DeliveryCount + 1 (${DOCS}/message-transfers-locks-settlement)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    // The SDK renews locks by itself unless told not to: off, so the lock can run out.
    const receiver = client.createReceiver(queue, { maxAutoLockRenewalDurationInMs: 0 });
    await sender.sendMessages([{ messageId: 'a', body: 1 }]);
    const [first] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(first?.deliveryCount).toBe(1);
    await receiver.abandonMessage(first!);
    const [second] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(second).toMatchObject({ messageId: 'a', deliveryCount: 2 });
    // Not settled: after the lock duration it comes back.
    const startedAt = Date.now();
    const [third] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(third).toMatchObject({ messageId: 'a', deliveryCount: 3 });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(LOCK_MS - 200);
    await receiver.completeMessage(third!);
    expect(await receiver.receiveMessages(1, { maxWaitTimeInMs: LOCK_MS + 500 })).toEqual([]);
    if (!onRealNamespace) expect(server.count(queue)).toBe(0);
    await sender.close();
    await receiver.close();
  });

  it(`a receiver is sent (and its locks taken for) only as many messages as its link credit; the rest stay with other receivers (${DOCS}/service-bus-amqp-protocol-guide)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    await sender.sendMessages([{ messageId: 'a', body: 1 }, { messageId: 'b', body: 2 }, { messageId: 'c', body: 3 }]);
    const one = client.createReceiver(queue);
    const two = client.createReceiver(queue);
    const taken = await one.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(taken.map((message) => message.messageId)).toEqual(['a']);
    // Well inside the lock duration: a message locked beyond the first receiver's credit would be missing here.
    const rest = await two.receiveMessages(2, { maxWaitTimeInMs: LOCK_MS / 2 });
    expect(rest.map((message) => [message.messageId, message.deliveryCount])).toEqual([['b', 1], ['c', 1]]);
    for (const message of taken) await one.completeMessage(message);
    for (const message of rest) await two.completeMessage(message);
    await Promise.all([one.close(), two.close(), sender.close()]);
  });

  it(`abandon with propertiesToModify: the message comes back with DeliveryCount + 1 and those application properties changed, the rest kept (https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusreceiver.abandonmessageasync)`, async () => {
    // The transport's retry relies on this: the raised courier-attempt travels in the abandon.
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const receiver = client.createReceiver(queue);
    await sender.sendMessages({ messageId: 'retried', body: 1, applicationProperties: { 'courier-topic': 'orders', kept: 'yes' } });
    const [first] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(first?.applicationProperties).toEqual({ 'courier-topic': 'orders', kept: 'yes' });
    await receiver.abandonMessage(first!, { 'courier-attempt': 2, kept: 'changed' });
    const [second] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(second).toMatchObject({ messageId: 'retried', deliveryCount: 2 });
    expect(second!.applicationProperties).toEqual({ 'courier-topic': 'orders', kept: 'changed', 'courier-attempt': 2 });
    await receiver.completeMessage(second!);
    await Promise.all([sender.close(), receiver.close()]);
  });

  it(`renewing the lock keeps a message from other receivers past the lock duration (${DOCS}/message-transfers-locks-settlement#renew-locks)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const holder = client.createReceiver(queue, { maxAutoLockRenewalDurationInMs: 0 });
    const other = client.createReceiver(queue);
    await sender.sendMessages({ messageId: 'held', body: 1 });
    const [message] = await holder.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    const until = Date.now() + 3 * LOCK_MS;
    while (Date.now() < until) {
      const renewed = await holder.renewMessageLock(message!);
      expect(renewed.getTime()).toBeGreaterThan(Date.now());
      expect(await other.receiveMessages(1, { maxWaitTimeInMs: LOCK_MS / 3 })).toEqual([]);
    }
    await holder.completeMessage(message!);
    // A lock that ran out cannot be renewed.
    await sender.sendMessages({ messageId: 'lapsed', body: 1 });
    const [lapsed] = await holder.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    // The scenario itself: the lock is left to run out. Counted from after the message was in
    // hand, so the lock began before; a loaded machine only makes the wait longer, the lock
    // only more surely gone, and a renewal that still succeeds fails the case at any pace.
    await new Promise((resolve) => setTimeout(resolve, LOCK_MS + 300));
    await expect(holder.renewMessageLock(lapsed!)).rejects.toSatisfy((error: unknown) => isServiceBusError(error) && error.code === 'MessageLockLost');
    // Nor can a message whose lock ran out be completed: the settlement is refused, and the
    // message comes back with its delivery count.
    await expect(holder.completeMessage(lapsed!)).rejects.toSatisfy((error: unknown) => isServiceBusError(error) && error.code === 'MessageLockLost');
    const [again] = await other.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(again).toMatchObject({ messageId: 'lapsed', deliveryCount: 2 });
    await other.completeMessage(again!);
    await sender.close();
    await holder.close();
    await other.close();
  });

  it(`dead-letter keeps reason and description in the $DeadLetterQueue sub-queue; MaxDeliveryCount dead-letters by itself (${DOCS}/service-bus-dead-letter-queues)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const receiver = client.createReceiver(queue);
    await sender.sendMessages([
      { messageId: 'poison', body: 1 },
      { messageId: 'tired', body: 2 },
    ]);
    const [poison] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    await receiver.deadLetterMessage(poison!, { deadLetterReason: 'HANDLER_FAILED', deadLetterErrorDescription: 'boom' });
    // MaxDeliveryCount is 3 here: three deliveries abandoned, then it goes to the dead-letter queue.
    for (let delivery = 1; delivery <= 3; delivery += 1) {
      const [tired] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
      expect(tired).toMatchObject({ messageId: 'tired', deliveryCount: delivery });
      await receiver.abandonMessage(tired!);
    }
    expect(await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 })).toEqual([]);
    const dead = await receiveAll(queue, 2, { subQueueType: 'deadLetter' });
    expect(dead.map((message) => [message.messageId, message.deadLetterReason, message.deadLetterErrorDescription])).toEqual([
      ['poison', 'HANDLER_FAILED', 'boom'],
      ['tired', 'MaxDeliveryCountExceeded', 'Message could not be consumed after 3 delivery attempts.'],
    ]);
    if (!onRealNamespace) expect(server.count(`${queue}/$DeadLetterQueue`)).toBe(0);
    await sender.close();
    await receiver.close();
  });

  it(`peek reads without locking or counting a delivery (${DOCS}/message-browsing)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    await sender.sendMessages([
      { messageId: 'p1', body: 1 },
      { messageId: 'p2', body: 2 },
    ]);
    const receiver = client.createReceiver(queue);
    const peeked = await receiver.peekMessages(10);
    expect(peeked.map((message) => message.messageId)).toEqual(['p1', 'p2']);
    expect(await receiver.peekMessages(10)).toEqual([]);
    const received = await receiveAll(queue, 2);
    expect(received.map((message) => message.deliveryCount)).toEqual([1, 1]);
    await sender.close();
    await receiver.close();
  });

  it(`the management GET of a subscription answers its counts, or 404 for one that does not exist, and creates nothing (https://learn.microsoft.com/rest/api/servicebus/get-entity)`, async () => {
    const admin = REAL_CONNECTION_STRING ? new ServiceBusAdministrationClient(REAL_CONNECTION_STRING) : standInAdministration(server.managementPort);
    const topic = `${uniqueId()}-topic`;
    await provisioner?.ensureTopic(topic);
    const missing = await admin.getSubscriptionRuntimeProperties(topic, 'nobody').then(
      () => undefined,
      (error: { code?: string; statusCode?: number }) => error,
    );
    expect(missing).toMatchObject({ code: 'MessageEntityNotFoundError', statusCode: 404 });
    // Asking made nothing: the same answer again.
    await expect(admin.getSubscriptionRuntimeProperties(topic, 'nobody')).rejects.toMatchObject({ statusCode: 404 });
    const name = await subscriptionNamed(topic, 'counted');
    const receiver = client.createReceiver(topic, name);
    // The stand-in makes the subscription when the receiver attaches (a peek attaches it).
    await receiver.peekMessages(1);
    const sender = client.createSender(topic);
    await sender.sendMessages([
      { messageId: 'c1', body: 1 },
      { messageId: 'c2', body: 2 },
    ]);
    const [first] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    await receiver.deadLetterMessage(first!, { deadLetterReason: 'HANDLER_FAILED', deadLetterErrorDescription: 'boom' });
    await eventually(async () => {
      const counts = await admin.getSubscriptionRuntimeProperties(topic, name);
      expect([counts.subscriptionName, counts.topicName, counts.activeMessageCount, counts.deadLetterMessageCount]).toEqual([name, topic, 1, 1]);
    }, { timeoutMs: 30_000 });
    await sender.close();
    await receiver.close();
  });

  it(`topics copy each message to every subscription that exists when it is sent (${DOCS}/service-bus-queues-topics-subscriptions)`, async () => {
    const topic = uniqueId();
    const one = client.createReceiver(topic, await subscriptionNamed(topic, 'one'));
    const two = client.createReceiver(topic, await subscriptionNamed(topic, 'two'));
    await one.peekMessages(1);
    await two.peekMessages(1);
    await one.receiveMessages(1, { maxWaitTimeInMs: 100 });
    await two.receiveMessages(1, { maxWaitTimeInMs: 100 });
    const sender = client.createSender(topic);
    await sender.sendMessages({ messageId: 't1', body: 1 });
    const late = client.createReceiver(topic, await subscriptionNamed(topic, 'late'));
    for (const receiver of [one, two]) {
      const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
      expect(message?.messageId).toBe('t1');
      await receiver.completeMessage(message!);
    }
    // The stand-in copies at the send, so its count is exact at any speed (locked copies
    // included); the short receive below is what a real namespace can be asked.
    if (!onRealNamespace) expect(server.count(`${topic}/Subscriptions/late`)).toBe(0);
    expect(await late.receiveMessages(1, { maxWaitTimeInMs: 500 })).toEqual([]);
    await Promise.all([one.close(), two.close(), late.close(), sender.close()]);
  });

  it(`competing receivers of one entity share its messages, none twice (${DOCS}/service-bus-queues-topics-subscriptions#receive-modes)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    await sender.sendMessages(Array.from({ length: 20 }, (_, index) => ({ messageId: `c${index}`, body: index })));
    const a = client.createReceiver(queue);
    const b = client.createReceiver(queue);
    const [fromA, fromB] = await Promise.all([a.receiveMessages(10, { maxWaitTimeInMs: 2_000 }), b.receiveMessages(10, { maxWaitTimeInMs: 2_000 })]);
    const ids = [...fromA!, ...fromB!].map((message) => message.messageId);
    expect(new Set(ids).size).toBe(ids.length);
    await Promise.all([...fromA!.map((message) => a.completeMessage(message)), ...fromB!.map((message) => b.completeMessage(message))]);
    const rest = await receiveAll(queue, 20 - ids.length);
    expect(ids.length + rest.length).toBe(20);
    await Promise.all([a.close(), b.close(), sender.close()]);
  });

  it(`sessions: a receiver locks one session and gets its messages in order; another cannot lock it meanwhile (${DOCS}/message-sessions)`, async () => {
    const queue = await queueNamed('-sessions');
    const sender = client.createSender(queue);
    await expect(sender.sendMessages({ body: 'no session' })).rejects.toThrow();
    await sender.sendMessages([
      ...Array.from({ length: 5 }, (_, index) => ({ messageId: `a${index}`, sessionId: 'a', body: index })),
      ...Array.from({ length: 5 }, (_, index) => ({ messageId: `b${index}`, sessionId: 'b', body: index })),
    ]);
    const first = await client.acceptNextSession(queue);
    expect(first.sessionId).toBe('a');
    expect(first.sessionLockedUntilUtc!.getTime()).toBeGreaterThan(Date.now());
    await expect(client.acceptSession(queue, 'a', { maxAutoLockRenewalDurationInMs: 0 })).rejects.toSatisfy((error: unknown) => isServiceBusError(error) && error.code === 'SessionCannotBeLocked');
    const second = await client.acceptNextSession(queue);
    expect(second.sessionId).toBe('b');
    const got: string[] = [];
    for (const receiver of [first, second]) {
      while (got.filter((id) => id.startsWith(receiver.sessionId)).length < 5) {
        for (const message of await receiver.receiveMessages(5, { maxWaitTimeInMs: 2_000 })) {
          got.push(message.messageId as string);
          await receiver.completeMessage(message);
        }
      }
    }
    expect(got).toEqual([...Array.from({ length: 5 }, (_, index) => `a${index}`), ...Array.from({ length: 5 }, (_, index) => `b${index}`)]);
    await first.renewSessionLock();
    await Promise.all([first.close(), second.close(), sender.close()]);
  });

  it(`a session lock renewed keeps the session from other receivers past the lock duration; one left to lapse hands the session on, its unsettled message with DeliveryCount + 1 (${DOCS}/message-sessions)`, async () => {
    // Ordered endpoints rely on both: the SDK renews the session lock while a handler runs,
    // and the session of a receiver that stopped renewing (a dead process) goes to the next.
    const queue = await queueNamed('-sessions');
    const sender = client.createSender(queue);
    await sender.sendMessages({ messageId: 's1', sessionId: 'held', body: 1 });
    const holder = await client.acceptSession(queue, 'held', { maxAutoLockRenewalDurationInMs: 0 });
    const [message] = await holder.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(message).toMatchObject({ messageId: 's1', deliveryCount: 1 });
    const until = Date.now() + 2.5 * LOCK_MS;
    let refused = 0;
    let stalled = false;
    let lockedUntil = Date.now() + LOCK_MS;
    while (Date.now() < until) {
      let renewed: Date;
      try {
        renewed = await holder.renewSessionLock();
      } catch (error) {
        // A stall between two renewals longer than the lock (a loaded machine: seen in a CI
        // run) lets it lapse, and the renewal is refused. That is right only where the last
        // renewed lock had really run out; the lapse half below is then already under way.
        if (!isServiceBusError(error) || error.code !== 'SessionLockLost') throw error;
        expect(Date.now(), `the renewal was refused before the renewed lock ran out: ${String(error)}`).toBeGreaterThanOrEqual(lockedUntil);
        stalled = true;
        break;
      }
      lockedUntil = renewed.getTime();
      const other = await client.acceptSession(queue, 'held', { maxAutoLockRenewalDurationInMs: 0 }).catch((error: unknown) => error);
      if (isServiceBusError(other) && other.code === 'SessionCannotBeLocked') refused += 1;
      else {
        // Only a lock that ran out may be taken: a stalled test (a loaded machine) can let it.
        expect(other, String(other)).not.toBeInstanceOf(Error);
        expect(Date.now(), 'another receiver locked the session before its renewed lock ran out').toBeGreaterThanOrEqual(renewed.getTime());
        await (other as { close(): Promise<void> }).close();
        stalled = true;
        break;
      }
      // Pacing, not synchronisation: a renewal every third of the lock keeps it held with room
      // to spare. A stall longer than the lock lets it lapse, which the branch above accepts
      // only where the renewed lock had really run out.
      await new Promise((resolve) => setTimeout(resolve, LOCK_MS / 3));
    }
    // Only a stall (checked above against the renewed lock) may end the renewals before any
    // accept was refused.
    if (refused === 0) expect(stalled, 'no accept was refused while the lock was renewed').toBe(true);
    // No more renewals: once the lock lapsed the next receiver gets the session and the message again.
    const next = await eventually(() => client.acceptSession(queue, 'held', { maxAutoLockRenewalDurationInMs: 0 }), { timeoutMs: 2 * LOCK_MS + 5_000, intervalMs: 250 });
    const [again] = await next.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(again).toMatchObject({ messageId: 's1', deliveryCount: 2 });
    await next.completeMessage(again!);
    await Promise.all([holder.close().catch(() => undefined), next.close(), sender.close()]);
  });

  it(`acceptNextSession waits for a session with messages until the client's timeout, then fails with ServiceTimeout (https://learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusclient.acceptnextsessionasync)`, async () => {
    const queue = await queueNamed('-sessions');
    // The SDK sends its operation timeout as the link's com.microsoft:timeout: the broker waits that long.
    const waiting = new ServiceBusClient(target, { retryOptions: { maxRetries: 0, timeoutInMs: 1_500 } });
    const patient = new ServiceBusClient(target, { retryOptions: { maxRetries: 0, timeoutInMs: 20_000 } });
    const sender = client.createSender(queue);
    try {
      const emptyFrom = Date.now();
      const failure = await waiting.acceptNextSession(queue).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(isServiceBusError(failure) && failure.code, String(failure)).toBe('ServiceTimeout');
      const emptyTookMs = Date.now() - emptyFrom;
      expect(emptyTookMs, 'refused without waiting for a session').toBeGreaterThanOrEqual(1_000);
      let answered = false;
      const accepting = patient.acceptNextSession(queue);
      void accepting.then(
        () => (answered = true),
        () => (answered = true),
      );
      // The message must come while the accept waits, not before it reached the broker (then
      // any broker hands the session over at once, whether it wakes waiting accepts or not).
      // The stand-in shows the accept it holds; a namespace shows nothing, so there: ten
      // times what the empty accept above took beyond its 1.5 s wait (its client connecting
      // included), at least 400 ms; this accept may wait 20 s.
      if (server) await eventually(() => expect(server.waitingAccepts(queue), 'accepts the stand-in holds').toBe(1), { timeoutMs: 10_000 });
      else await new Promise((resolve) => setTimeout(resolve, Math.max(400, 10 * (emptyTookMs - 1_500))));
      expect(answered, 'the accept was answered before any session had messages').toBe(false);
      await sender.sendMessages({ messageId: 'late', sessionId: 'late-session', body: 'x' });
      const receiver = await accepting;
      expect(receiver.sessionId).toBe('late-session');
      const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 2_000 });
      expect(message?.messageId).toBe('late');
      await receiver.completeMessage(message!);
      await receiver.close();
    } finally {
      await sender.close();
      await waiting.close();
      await patient.close();
    }
  });

  it(`scheduled messages stay invisible until their ScheduledEnqueueTimeUtc (${DOCS}/message-sequencing#scheduled-messages)`, async () => {
    const queue = await queueNamed();
    const sender = client.createSender(queue);
    const at = new Date(Date.now() + 1_500);
    const [sequenceNumber] = await sender.scheduleMessages({ messageId: 'later', body: 1 }, at);
    expect(sequenceNumber!.toNumber()).toBeGreaterThan(0);
    await sender.sendMessages({ messageId: 'now', body: 2 });
    const receiver = client.createReceiver(queue);
    const [now] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(now?.messageId).toBe('now');
    await receiver.completeMessage(now!);
    const [later] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 5_000 });
    expect(later?.messageId).toBe('later');
    expect(Date.now()).toBeGreaterThanOrEqual(at.getTime() - 50);
    await receiver.completeMessage(later!);
    await Promise.all([receiver.close(), sender.close()]);
  });

  it(`duplicate detection drops a MessageId sent again within the window, and accepts the send (${DOCS}/duplicate-detection)`, async () => {
    const queue = await queueNamed('-dedup');
    const receiver = client.createReceiver(queue);
    await receiver.peekMessages(1);
    const sender = client.createSender(queue);
    await sender.sendMessages({ messageId: 'same', body: 1 });
    await sender.sendMessages({ messageId: 'same', body: 2 });
    await sender.sendMessages({ messageId: 'other', body: 3 });
    if (!onRealNamespace) await eventually(() => expect(server.count(queue)).toBe(2));
    const received = await receiveAll(queue, 2);
    expect(received.map((message) => [message.messageId, message.body])).toEqual([
      ['same', 1],
      ['other', 3],
    ]);
    await Promise.all([receiver.close(), sender.close()]);
  });

  it.skipIf(skipOnRealNamespace('a raw put-token needs a real SAS token'))(`CBS: a put-token request is answered with status-code 202 on the link named by its reply-to (${DOCS}/service-bus-amqp-protocol-guide#claims-based-authorization)`, async () => {
    // The SDK needs this before any link; spelled out here with a bare AMQP client, so the
    // exchange itself is checked and not only that the SDK got through.
    const container = rhea.create_container();
    const replyTo = `cbs-reply-${uniqueId()}`;
    const connection = container.connect({ host: '127.0.0.1', port: server.port, reconnect: false });
    try {
      const reply = await new Promise<rhea.Message>((resolve, reject) => {
        connection.on('connection_error', (context) => reject(context.connection.error ?? new Error('connection error')));
        const receiver = connection.open_receiver({ source: { address: '$cbs' }, name: replyTo, target: { address: replyTo } });
        receiver.on('message', (context) => resolve(context.message!));
        const sender = connection.open_sender({ target: { address: '$cbs' } });
        sender.once('sendable', () => {
          sender.send({
            message_id: 'put-1',
            reply_to: replyTo,
            body: 'SharedAccessSignature sr=x&sig=y&se=9999999999&skn=RootManageSharedAccessKey',
            application_properties: { operation: 'put-token', type: 'servicebus.windows.net:sastoken', name: `amqp://127.0.0.1:${server.port}/some-queue` },
          });
        });
      });
      expect(reply.correlation_id).toBe('put-1');
      expect(reply.application_properties?.['status-code']).toBe(202);
    } finally {
      connection.close();
    }
  });

  it.skipIf(skipOnRealNamespace('throttling is the stand-in\'s throttle() switch'))(`a throttled entity refuses sends with the ServiceBusy code (${DOCS}/service-bus-throttling)`, async () => {
    const queue = await queueNamed();
    const receiver = client.createReceiver(queue);
    await receiver.peekMessages(1);
    const sender = client.createSender(queue);
    server.throttle(queue, true);
    await expect(sender.sendMessages({ messageId: 'busy', body: 1 })).rejects.toSatisfy((error: unknown) => isServiceBusError(error) && error.code === 'ServiceBusy' && error.retryable);
    server.throttle(queue, false);
    await sender.sendMessages({ messageId: 'fine', body: 2 });
    expect((await receiveAll(queue, 1)).map((message) => message.body)).toEqual([2]);
    await Promise.all([receiver.close(), sender.close()]);
  });
});
