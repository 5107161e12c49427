import { randomUUID } from 'node:crypto';
import { UnrecoverableError, type Bus, type SubscribeOptions } from '@courier/core';
import { isFlaky } from './catalog.js';
import { OrderPlaced, PaymentCaptured } from './messages.js';
import type { ShopStorage } from './shop-storage.js';

/** The consumer (group) name of the payments service. */
export const PAYMENTS_CONSUMER = 'payments';

/**
 * Subscribes the payments service to `orders.OrderPlaced` (any version; version 1 is
 * upcast). The handler saves a Payment through `ctx.tx` and publishes
 * `payments.PaymentCaptured` with `ctx.publish` — both in the transaction that records
 * the message in the inbox, so a redelivered OrderPlaced never takes a second payment,
 * and PaymentCaptured inherits the correlationId and names OrderPlaced as its cause.
 *
 * A non-positive total is refused with `UnrecoverableError` (dead-lettered at once); a
 * flaky order's first attempt fails like a gateway timeout and is retried later.
 */
export function subscribePayments<Tx>(bus: Bus<Tx>, storage: ShopStorage<Tx>, options: { maxCrashes?: number } = {}): void {
  bus.subscribe(
    PAYMENTS_CONSUMER,
    OrderPlaced,
    async (message, ctx) => {
      const { orderId, total } = message.payload;
      refuseUnpayable(orderId, total, ctx.attempt);
      const paymentId = randomUUID();
      const capturedMessageId = ctx.publish(
        PaymentCaptured,
        { paymentId, orderId, amountCents: total.amountCents, currency: total.currency },
        { key: orderId },
      );
      storage.addPayment(ctx.tx, {
        paymentId,
        orderId,
        amountCents: total.amountCents,
        currency: total.currency,
        orderMessageId: message.messageId,
        capturedMessageId,
      });
    },
    { ...PAYMENTS_SUBSCRIPTION, ...options },
  );
}

/** The payments consumer's subscription options (the Prisma variant subscribes with them too). */
export const PAYMENTS_SUBSCRIPTION = { concurrency: 8, retry: { maxAttempts: 5, initialDelayMs: 200, maxDelayMs: 2_000 } } as const satisfies SubscribeOptions;

/**
 * Throws what the payment gateway would for this order, before anything is written: a
 * non-positive total is refused with `UnrecoverableError` (dead-lettered at once); a flaky
 * order's first attempt fails like a gateway timeout (retried later).
 */
export function refuseUnpayable(orderId: string, total: { readonly amountCents: number; readonly currency: string }, attempt: number): void {
  if (total.amountCents <= 0) {
    throw new UnrecoverableError(`order '${orderId}' has a total of ${total.amountCents} ${total.currency} cents; nothing to capture`);
  }
  if (attempt === 1 && isFlaky(orderId)) {
    throw new Error(`payment gateway timed out for order '${orderId}' (simulated; retried)`);
  }
}
