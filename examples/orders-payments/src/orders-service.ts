import { setTimeout as sleep } from 'node:timers/promises';
import { isRetriable, UnrecoverableError, type Bus } from '@courier/core';
import { classifyDriverError } from '@courier/mikro-orm';
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
      await retryTransient(() => storage.transaction(async (tx) => {
        const outbox = bus.outbox(tx);
        const placedMessageId = current.legacy
          ? outbox.publish(OrderPlacedV1, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents }, { key: current.orderId })
          : outbox.publish(
              OrderPlaced,
              { orderId: current.orderId, customerId: current.customerId, total: { amountCents: current.totalCents, currency: 'EUR' } },
              { key: current.orderId },
            );
        storage.addOrder(tx, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents, currency: 'EUR', placedMessageId });
      }));
      placed += 1;
      // The relay may be sleeping between polls: a commit in this process wakes it.
      bus.wake();
    }
  };
  await Promise.all(Array.from({ length: options.concurrency ?? 8 }, () => worker()));
  return placed;
}

/**
 * Runs `work` again (up to 5 tries, with backoff) when it failed in a way a retry can cure:
 * a lock the database could not grant in time (a SQLite file busy with another process's
 * writer, a deadlock) or a lost connection. Nothing of a failed try was committed, and
 * the order's id is its primary key, so a try that did commit unnoticed cannot place it twice.
 */
async function retryTransient<T>(work: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await work();
    } catch (error) {
      if (attempt >= 5 || !(isRetriable(error) || classifyDriverError(error) === 'transient')) throw error;
      await sleep(100 * 2 ** attempt);
    }
  }
}
