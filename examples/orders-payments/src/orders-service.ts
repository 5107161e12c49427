import { setTimeout as sleep } from 'node:timers/promises';
import { isRetriable, UnrecoverableError, type Bus, type DecodedOf, type HandlerContext, type ReceivedMessage, type SubscribeOptions } from '@courier/core';
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
  bus.subscribe(ORDERS_CONSUMER, PaymentCaptured, (message, ctx) => applyPaymentCaptured(storage, message, ctx), { ...ORDERS_SUBSCRIPTION, ...options });
}

/** The orders consumer's subscription options (also given to its NestJS handler's `@OnMessage`). */
export const ORDERS_SUBSCRIPTION = { concurrency: 8, retry: { maxAttempts: 5, initialDelayMs: 200, maxDelayMs: 2_000 } } as const satisfies SubscribeOptions;

/** The orders service's handling of a PaymentCaptured (see {@link subscribeOrders}). */
export async function applyPaymentCaptured<Tx>(storage: ShopStorage<Tx>, message: ReceivedMessage<DecodedOf<typeof PaymentCaptured>>, ctx: HandlerContext<Tx>): Promise<void> {
  const { orderId, paymentId } = message.payload;
  const found = await storage.markPaid(ctx.tx, orderId, {
    paymentId,
    causationId: message.causationId,
    correlationId: message.correlationId,
  });
  if (!found) throw new UnrecoverableError(`payment '${paymentId}' is for order '${orderId}', which does not exist`);
}

/** Options of {@link placeOrders}. */
export interface PlaceOrdersOptions {
  /** Orders placed at once (each in its own transaction). Default 8. */
  readonly concurrency?: number;
  readonly signal?: AbortSignal;
  /**
   * How long a database that keeps failing in a way a retry can cure (a restart, a lost
   * connection, a lock) is waited for before placing fails. Default 60 s.
   */
  readonly patienceMs?: number;
}

/**
 * Places every order of `orders` that is not committed yet, each in its own transaction
 * that saves the order and appends its `orders.OrderPlaced` to the outbox: both commit,
 * or neither. Safe to call again after a crash: committed orders are skipped (and the
 * order's primary key refuses a second copy). A database that goes away meanwhile (a
 * restart) is waited for, up to `patienceMs`, as a producer in a service would. Returns how
 * many it placed.
 */
export async function placeOrders<Tx>(bus: Bus<Tx>, storage: ShopStorage<Tx>, orders: readonly CatalogOrder[], options: PlaceOrdersOptions = {}): Promise<number> {
  const patience = { patienceMs: options.patienceMs ?? 60_000, ...(options.signal ? { signal: options.signal } : {}) };
  const existing = await retryTransient(() => storage.orderIds(), patience);
  const queue = orders.filter((order) => !existing.has(order.orderId));
  let placed = 0;
  const worker = async (): Promise<void> => {
    for (let order = queue.shift(); order !== undefined && !options.signal?.aborted; order = queue.shift()) {
      const current = order;
      await retryTransient(
        () =>
          storage.transaction(async (tx) => {
            const outbox = bus.outbox(tx);
            const placedMessageId = current.legacy
              ? outbox.publish(OrderPlacedV1, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents }, { key: current.orderId })
              : outbox.publish(
                  OrderPlaced,
                  { orderId: current.orderId, customerId: current.customerId, total: { amountCents: current.totalCents, currency: 'EUR' } },
                  { key: current.orderId },
                );
            storage.addOrder(tx, { orderId: current.orderId, customerId: current.customerId, totalCents: current.totalCents, currency: 'EUR', placedMessageId });
          }),
        // A try whose commit went through unnoticed (the connection dropped before its
        // answer) makes the next try meet the order's primary key: the order is placed.
        { ...patience, alreadyDone: (error) => (classifyDriverError(error) === 'duplicate' ? { value: undefined } : undefined) },
      );
      placed += 1;
      // The relay may be sleeping between polls: a commit in this process wakes it.
      bus.wake();
    }
  };
  await Promise.all(Array.from({ length: options.concurrency ?? 8 }, () => worker()));
  return placed;
}

/**
 * Runs `work` again, with capped backoff, while it fails in a way a retry can cure: a lock
 * the database could not grant in time (a SQLite file busy with another process's writer, a
 * deadlock) or a lost or refused connection (a restart) — until `patienceMs` passed since
 * the first failure, or `signal` aborted. Nothing of a failed try was committed unless its
 * answer was lost; `alreadyDone` recognises that on a retry and gives the result to resolve with.
 */
async function retryTransient<T>(
  work: () => Promise<T>,
  options: { readonly patienceMs: number; readonly signal?: AbortSignal; readonly alreadyDone?: (error: unknown) => { readonly value: T } | undefined },
): Promise<T> {
  let firstFailure: number | undefined;
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await work();
    } catch (error) {
      const done = attempt > 1 ? options.alreadyDone?.(error) : undefined;
      if (done) return done.value;
      firstFailure ??= Date.now();
      const curable = isRetriable(error) || classifyDriverError(error) === 'transient';
      if (!curable || options.signal?.aborted || Date.now() - firstFailure >= options.patienceMs) throw error;
      await sleep(Math.min(2_000, 100 * 2 ** attempt));
    }
  }
}
