import { UnrecoverableError, type Bus } from '@courier/core';
import type { CatalogOrder } from './catalog.js';
import { OrderPlaced, OrderPlacedV1, PaymentCaptured } from './messages.js';
import type { ShopStorage } from './shop-storage.js';

/** The consumer (group) name of the orders service. */
export const ORDERS_CONSUMER = 'orders';

/**
 * Subscribes the orders service to `payments.PaymentCaptured`: the order is marked paid
 * in the handler's transaction, so the mark and the inbox record commit together and a
 * redelivered PaymentCaptured is never applied twice.
 */
export function subscribeOrders<Tx>(bus: Bus<Tx>, storage: ShopStorage<Tx>, options: { maxCrashes?: number } = {}): void {
  bus.subscribe(
    ORDERS_CONSUMER,
    PaymentCaptured,
    async (message, ctx) => {
      const { orderId, paymentId } = message.payload;
      const found = await storage.markPaid(ctx.tx, orderId, {
        paymentId,
        causationId: message.causationId,
        correlationId: message.correlationId,
      });
      if (!found) throw new UnrecoverableError(`payment '${paymentId}' is for order '${orderId}', which does not exist`);
    },
    { concurrency: 8, retry: { maxAttempts: 5, initialDelayMs: 200, maxDelayMs: 2_000 }, ...options },
  );
}

/** Options of {@link placeOrders}. */
export interface PlaceOrdersOptions {
  /** Orders placed at once (each in its own transaction). Default 8. */
  readonly concurrency?: number;
  readonly signal?: AbortSignal;
}

/**
 * Places every order of `orders` that is not committed yet, each in its own transaction
 * that saves the order and appends its `orders.OrderPlaced` to the outbox: both commit,
 * or neither. Safe to call again after a crash: committed orders are skipped (and the
 * order's primary key refuses a second copy). Returns how many it placed.
 */
export async function placeOrders<Tx>(bus: Bus<Tx>, storage: ShopStorage<Tx>, orders: readonly CatalogOrder[], options: PlaceOrdersOptions = {}): Promise<number> {
  const existing = await storage.orderIds();
  const queue = orders.filter((order) => !existing.has(order.orderId));
  let placed = 0;
  const worker = async (): Promise<void> => {
    for (let order = queue.shift(); order !== undefined && !options.signal?.aborted; order = queue.shift()) {
      const current = order;
      await storage.transaction(async (tx) => {
        const outbox = bus.outbox(tx);
        const placedMessageId = current.legacy
          ? outbox.publish(OrderPlacedV1, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents }, { key: current.orderId })
          : outbox.publish(
              OrderPlaced,
              { orderId: current.orderId, customerId: current.customerId, total: { amountCents: current.totalCents, currency: 'EUR' } },
              { key: current.orderId },
            );
        storage.addOrder(tx, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents, currency: 'EUR', placedMessageId });
      });
      placed += 1;
      // The relay may be sleeping between polls: a commit in this process wakes it.
      bus.wake();
    }
  };
  await Promise.all(Array.from({ length: options.concurrency ?? 8 }, () => worker()));
  return placed;
}
