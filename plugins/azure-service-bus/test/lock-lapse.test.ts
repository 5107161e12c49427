// An ack that comes after the delivery's lock lapsed (an event-loop stall longer than the
// lock, a lock renewal that failed or ran out): Service Bus refuses the complete with
// MessageLockLost and hands the message out again. The effects were committed already, so
// the copy must be absorbed by the inbox: applied once, nothing dead-lettered or lost, and
// the consumer keeps running.
import { ServiceBusClient, isServiceBusError } from '@azure/service-bus';
import { TransportError, createBus, defineMessage, type Delivery, type FaultPoint, type Logger, type RetryPolicy } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { ServiceBusTransport } from '../src/index.js';
import { LOCK_MS, skipOnRealNamespace } from './support/namespace.js';
import { standIn } from './support/standin-server.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/**
 * A transport on the shared stand-in whose lock is never renewed: the SDK renews only
 * within `maxLockRenewalMs` of the receive, and 1 ms ends before the first renewal is due,
 * so the lock lapses after the entity's lock duration wherever the handler then is.
 */
const unrenewedTransport = async (): Promise<ServiceBusTransport> => {
  const { server } = await standIn();
  const transport = new ServiceBusTransport({
    // Short SDK retries, as the fixture has: a failure surfaces within the test's waits.
    client: () => new ServiceBusClient(server!.connectionString, { retryOptions: { maxRetries: 1, retryDelayInMs: 200, timeoutInMs: 3_000 } }),
    prefix: `${uniqueId()}.`,
    maxLockRenewalMs: 1,
  });
  closers.push(() => transport.close());
  return transport;
};

/** Whether `error` is the transport's failed settle caused by Service Bus refusing a lapsed lock. */
const isLockLost = (error: unknown): boolean => error instanceof TransportError && isServiceBusError(error.cause) && error.cause.code === 'MessageLockLost';

// The stand-in's lock state (`locked`) is what the handler waits on; a real namespace shows
// no such thing, and a fixed sleep instead would only guess when the lock has gone.
describe.skipIf(skipOnRealNamespace('the handler waits on the stand-in\'s lock state (locked())'))('ServiceBusTransport: an ack after the lock lapsed', () => {
  it('is refused: ack() rejects with a TransportError naming MessageLockLost, and the message comes back flagged redelivered at the same attempt; its ack then completes it, and the subscription keeps receiving', async () => {
    const { server } = await standIn();
    const transport = await unrenewedTransport();
    const topic = 'orders.placed';
    const consumer = 'lapsing';
    const subscription = `${transport.entityOf(topic)}/Subscriptions/${consumer}`;
    const lapsing = makeEnvelope({ topic, key: null });
    const later = makeEnvelope({ topic, key: null });
    const seen: string[] = [];
    const acks: string[] = [];
    let refused: unknown;
    // One handler slot: while the message is in hand the receiver asks for nothing more, so
    // once its lock lapses the message waits in the subscription instead of being handed to
    // a second slot of this same subscription beside the first (another scenario: a
    // concurrent duplicate).
    const handle = await transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async (delivery: Delivery) => {
      const { messageId } = delivery.envelope;
      seen.push(`${messageId === lapsing.messageId ? 'lapsing' : 'later'}@${delivery.attempt}${delivery.redelivered ? ' redelivered' : ''}`);
      if (messageId === lapsing.messageId && seen.length === 1) {
        // The scenario: whatever the handler committed, its ack comes only once the lock has
        // run out (waited on, not slept: a loaded machine makes the wait longer, never wrong).
        await eventually(() => expect(server!.locked(subscription), 'the delivery\'s lock still holds').toBe(0), { timeoutMs: LOCK_MS + 20_000, intervalMs: 50 });
        await delivery.ack().then(
          () => acks.push('lapsing: acked'),
          (error: unknown) => {
            refused = error;
            acks.push('lapsing: refused');
          },
        );
        return;
      }
      await delivery.ack();
      acks.push(`${messageId === lapsing.messageId ? 'lapsing' : 'later'}: acked`);
    });
    closers.push(() => handle.close());
    expect((await transport.publish([lapsing]))[0]?.ok).toBe(true);
    // Judged once the subscription is empty: the refused message stays there until a
    // later delivery of it is completed, so at 0 every hand-out has reached the handler. And
    // once that completion's answer reached the handler too: the stand-in runs in this
    // process, so the test can see the message gone before the client has its answer.
    await eventually(
      () => {
        expect(server!.count(subscription), `messages left (handed out: ${seen.join(', ')})`).toBe(0);
        expect(acks).toContain('lapsing: acked');
      },
      { timeoutMs: LOCK_MS + 30_000, intervalMs: 50 },
    );
    expect(acks).toEqual(['lapsing: refused', 'lapsing: acked']);
    expect(isLockLost(refused), `the refused ack's error: ${String(refused)}`).toBe(true);
    expect((refused as TransportError).message).toContain('MessageLockLost');
    expect((refused as TransportError).message).toContain(lapsing.messageId);
    // The broker's deliveryCount grew by the lapse while courier-attempt did not: the
    // redelivery is a lost lock, not a retry.
    expect(seen).toEqual(['lapsing@1', 'lapsing@1 redelivered']);
    expect(server!.count(`${subscription}/$DeadLetterQueue`)).toBe(0);
    // The refusal stopped nothing: the same subscription receives and completes the next one.
    expect((await transport.publish([later]))[0]?.ok).toBe(true);
    await eventually(() => expect(acks).toContain('later: acked'), { timeoutMs: 20_000 });
    await eventually(() => expect(server!.count(subscription)).toBe(0), { timeoutMs: 20_000 });
    expect(seen).toEqual(['lapsing@1', 'lapsing@1 redelivered', 'later@1']);
  }, 60_000);
});

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });
const orderOf = (payload: unknown): string => String((payload as { orderId?: unknown }).orderId);

describe.skipIf(skipOnRealNamespace('the commit is held on the stand-in\'s lock state (locked())'))('a bus (MikroORM PostgreSQL store, inbox) on Service Bus: an ack after the lock lapsed', () => {
  // The refusal lands on the first of several attempts, and on the last one: a consumer that
  // took it for a handler failure would retry the first and dead-letter the second.
  const policies: { readonly name: string; readonly retry: Partial<RetryPolicy> }[] = [
    { name: 'attempts left', retry: { initialDelayMs: 1, maxDelayMs: 1 } },
    { name: 'no attempt left (maxAttempts 1)', retry: { maxAttempts: 1, initialDelayMs: 1, maxDelayMs: 1 } },
  ];
  for (const { name, retry } of policies) {
    it(`${name}: the effects are applied once, the redelivered copy is acked as a duplicate, nothing is retried or dead-lettered, the refusal is logged as a warning naming MessageLockLost, and the consumer keeps running`, async () => {
      const { server } = await standIn();
      const testId = uniqueId();
      const store = await createPostgresFixture({ testId });
      closers.push(() => store.close());
      const transport = await unrenewedTransport();
      const consumer = 'lapsing';
      const subscription = `${transport.entityOf(Placed.topic)}/Subscriptions/${consumer}`;

      // What the core is handed and what it asks of each delivery, seen at the transport's edge.
      const deliveries: string[] = [];
      const settles: string[] = [];
      const subscribe = transport.subscribe.bind(transport);
      transport.subscribe = (endpoint, handler) =>
        subscribe(endpoint, (delivery: Delivery) => {
          const order = orderOf(JSON.parse(delivery.envelope.payload));
          deliveries.push(`${order}@${delivery.attempt}${delivery.redelivered ? ' redelivered' : ''}`);
          return handler({
            ...delivery,
            ack: () =>
              delivery.ack().then(
                () => void settles.push(`${order}: ack`),
                (error: unknown) => {
                  settles.push(`${order}: ack refused${error instanceof TransportError && error.message.includes('[MessageLockLost]') ? ' (MessageLockLost)' : `: ${String(error)}`}`);
                  throw error;
                },
              ),
            retry: (delayMs, reason) => {
              settles.push(`${order}: retry ${reason.code}`);
              return delivery.retry(delayMs, reason);
            },
            deadLetter: (reason) => {
              settles.push(`${order}: deadLetter ${reason.code}`);
              return delivery.deadLetter(reason);
            },
          });
        });

      const logs: { level: keyof Logger; message: string; fields: Readonly<Record<string, unknown>> }[] = [];
      const logger: Logger = {
        debug: (message, fields = {}) => void logs.push({ level: 'debug', message, fields }),
        info: (message, fields = {}) => void logs.push({ level: 'info', message, fields }),
        warn: (message, fields = {}) => void logs.push({ level: 'warn', message, fields }),
        error: (message, fields = {}) => void logs.push({ level: 'error', message, fields }),
      };
      let stalls = 0;
      const bus = createBus({
        outbox: store.outbox,
        inbox: store.inbox,
        transport,
        logger,
        // maxLockRenewalMs is 1 ms here so the lock can lapse; createBus refuses any retry or
        // pause longer than that (retryDelayLimit), and this scenario retries nothing.
        retry: { initialDelayMs: 1, maxDelayMs: 1 },
        relay: { pollIntervalMs: 50, pause: { initialDelayMs: 1, maxDelayMs: 1 } },
        // The scenario: the handler's unit of work has committed, and the process stalls (an
        // event loop blocked longer than the lock, a renewal that failed) before the ack, until
        // the lock has lapsed on the broker. Waited on, not slept: a loaded machine only makes
        // the stall longer. Once: the redelivered copy then goes its normal way.
        faults: async (point: FaultPoint) => {
          if (point !== 'after-handler-commit-before-ack' || stalls > 0) return;
          stalls += 1;
          await eventually(() => expect(server!.locked(subscription), 'the delivery\'s lock still holds').toBe(0), { timeoutMs: LOCK_MS + 20_000, intervalMs: 50 });
        },
      });
      closers.push(() => bus.stop({ timeoutMs: 10_000 }));
      // One handler slot: while the message is in hand the receiver asks for nothing more, so
      // the lapsed message waits in the subscription for the refused ack instead of reaching
      // a second slot beside the first (that is the concurrent-duplicate scenario).
      bus.subscribe(consumer, Placed, async (message, ctx) => store.recordEffect(ctx.tx, orderOf(message.payload)), { concurrency: 1, retry });
      await bus.start();
      const publish = (orderId: string) => store.transaction(async (tx) => void bus.outbox(tx).publish(Placed, { orderId }));

      await publish('lapsing');
      // Judged once the message was handed out and the subscription is empty again: the
      // refused message stays there until a later delivery of it is completed, so at 0 every
      // hand-out has been settled. And once that completion's answer reached the core too:
      // the stand-in runs in this process, so the message can be gone before the client knows.
      await eventually(() => expect(deliveries.length, 'hand-outs').toBeGreaterThan(0), { timeoutMs: 20_000 });
      await eventually(
        () => {
          expect(server!.count(subscription), `messages left (deliveries: ${deliveries.join(', ')}; settles: ${settles.join(', ')})`).toBe(0);
          expect(settles).toContain('lapsing: ack');
        },
        { timeoutMs: LOCK_MS + 30_000, intervalMs: 50 },
      );
      expect(stalls, 'the stall between commit and ack happened').toBe(1);
      expect(deliveries).toEqual(['lapsing@1', 'lapsing@1 redelivered']);
      expect(settles).toEqual(['lapsing: ack refused (MessageLockLost)', 'lapsing: ack']);
      expect(await store.readEffects()).toEqual(['lapsing']);
      expect(bus.health().counters).toMatchObject({ processed: 1, duplicates: 1, retries: 0, deadLettered: 0 });
      expect(await transport.deadLetters.list(consumer)).toEqual([]);
      // The refusal is neither swallowed nor taken for the handler's failure: one warning
      // that names it, and nothing at error level.
      const refusals = logs.filter((entry) => JSON.stringify(entry.fields).includes('MessageLockLost'));
      expect(refusals.map((entry) => entry.level), `logged: ${JSON.stringify(logs)}`).toEqual(['warn']);
      expect(logs.filter((entry) => entry.level === 'error'), 'errors logged').toEqual([]);
      expect(logs.filter((entry) => /handler failed|dead-lettered/.test(entry.message)), 'logged as a handler failure or a dead letter').toEqual([]);

      // The consumer keeps running: the next message is applied and acknowledged.
      await publish('later');
      await eventually(() => expect(settles).toContain('later: ack'), { timeoutMs: 20_000 });
      expect(await store.readEffects()).toEqual(['lapsing', 'later']);
      expect(bus.health().consumers.map((entry) => entry.connected)).toEqual([true]);
    }, 90_000);
  }
});
