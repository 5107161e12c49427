// An ack that comes after the delivery's lock lapsed (an event-loop stall longer than the
// lock, a lock renewal that failed or ran out): Service Bus refuses the complete with
// MessageLockLost and hands the message out again. The effects were committed already, so
// the copy must be absorbed by the inbox: applied once, nothing dead-lettered or lost, and
// the consumer keeps running.
import { ServiceBusClient, isServiceBusError } from '@azure/service-bus';
import { TransportError, type Delivery } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
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
    // later delivery of it is completed, so at 0 every hand-out has reached the handler.
    await eventually(() => expect(server!.count(subscription), `messages left (handed out: ${seen.join(', ')})`).toBe(0), { timeoutMs: LOCK_MS + 30_000, intervalMs: 50 });
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
