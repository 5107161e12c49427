import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { createBus, isRetriable, UnrecoverableError, type Bus, type Logger, type Transport } from '@courier/core';
import { classifyDriverError, PrismaInboxStore, PrismaOutboxStore } from '@courier/prisma';
import type { CatalogOrder } from './catalog.js';
import { TABLE_PREFIXES } from './databases.js';
import { DuplicateRecordingInbox, type DuplicateLog } from './duplicate-recording-inbox.js';
import { OrderPlaced, OrderPlacedV1, PaymentCaptured } from './messages.js';
import type { WorkerRole } from './options.js';
import { ORDERS_CONSUMER, ORDERS_SUBSCRIPTION } from './orders-service.js';
import { PAYMENTS_CONSUMER, PAYMENTS_SUBSCRIPTION, refuseUnpayable } from './payments-service.js';
import type { ShopPrismaClient, ShopPrismaTx } from './prisma-shop-client.js';
import { DEMO_RELAY } from './run-result.js';

/**
 * A service's bus on Prisma: `bus.outbox(tx)` takes the transaction client of
 * `prisma.$transaction(async (tx) => …)`, and its `publish` returns a promise (the row is
 * written through `tx` at once), so it is awaited inside the callback.
 */
export type PrismaBus = Bus<ShopPrismaTx, Promise<void>>;

/** The stores and bus of one service on Prisma, and how to close them. */
export interface PrismaService {
  readonly bus: PrismaBus;
  /** Stops the bus (drains for up to 5 s), then closes the stores; the client and transport stay the caller's. */
  close(): Promise<void>;
}

/**
 * Builds the bus of `role` on the service's Prisma Client: its own outbox and inbox tables
 * (`TABLE_PREFIXES`, in the run's `schema`), every suppressed duplicate written to
 * `inbox_duplicates` for the report, and the service's subscription.
 */
export function createPrismaService(
  role: WorkerRole,
  prisma: ShopPrismaClient,
  transport: Transport,
  config: { readonly schema: string; readonly logger: Logger; readonly maxCrashes: number },
): PrismaService {
  const tables = { prisma, tablePrefix: TABLE_PREFIXES[role], schema: config.schema };
  const outbox = new PrismaOutboxStore({ ...tables, logger: config.logger });
  const inbox = new PrismaInboxStore(tables);
  const bus: PrismaBus = createBus({ outbox, inbox: new DuplicateRecordingInbox(inbox, prismaDuplicateLog(prisma)), transport, relay: DEMO_RELAY, logger: config.logger });
  if (role === 'orders') subscribeOrdersOnPrisma(bus, { maxCrashes: config.maxCrashes });
  else subscribePaymentsOnPrisma(bus, { maxCrashes: config.maxCrashes });
  return {
    bus,
    close: async () => {
      await bus.stop({ timeoutMs: 5_000 });
      await Promise.all([outbox.close(), inbox.close()]);
    },
  };
}

/**
 * The orders service on Prisma: a PaymentCaptured marks its order paid through `ctx.tx`, the
 * Prisma transaction client in which the inbox records the message, so the mark and the record
 * commit together and a redelivered PaymentCaptured is never applied twice (`paidCount` shows it).
 */
export function subscribeOrdersOnPrisma(bus: PrismaBus, options: { readonly maxCrashes?: number } = {}): void {
  bus.subscribe(
    ORDERS_CONSUMER,
    PaymentCaptured,
    async (message, ctx) => {
      const { orderId, paymentId } = message.payload;
      const { count } = await ctx.tx.order.updateMany({
        where: { id: orderId },
        data: { status: 'paid', paidCount: { increment: 1 }, paymentId, paidCausationId: message.causationId, paidCorrelationId: message.correlationId, paidAt: new Date() },
      });
      if (count === 0) throw new UnrecoverableError(`payment '${paymentId}' is for order '${orderId}', which does not exist`);
    },
    { ...ORDERS_SUBSCRIPTION, ...options },
  );
}

/**
 * The payments service on Prisma: an OrderPlaced (any version; version 1 is upcast) takes a
 * payment with `ctx.tx.payment.create` and announces it with `ctx.publish` — both in the
 * handler's Prisma transaction, with the inbox record — so a redelivered OrderPlaced never takes
 * a second payment. Refusals and the simulated flaky gateway are the MikroORM variant's
 * (`refuseUnpayable`).
 */
export function subscribePaymentsOnPrisma(bus: PrismaBus, options: { readonly maxCrashes?: number } = {}): void {
  bus.subscribe(
    PAYMENTS_CONSUMER,
    OrderPlaced,
    async (message, ctx) => {
      const { orderId, total } = message.payload;
      refuseUnpayable(orderId, total, ctx.attempt);
      const paymentId = randomUUID();
      const capturedMessageId = await ctx.publish(PaymentCaptured, { paymentId, orderId, amountCents: total.amountCents, currency: total.currency }, { key: orderId });
      await ctx.tx.payment.create({
        data: { id: paymentId, orderId, amountCents: total.amountCents, currency: total.currency, orderMessageId: message.messageId, capturedMessageId },
      });
    },
    { ...PAYMENTS_SUBSCRIPTION, ...options },
  );
}

/**
 * Options of the producer's own transactions: Prisma's defaults (2 s to get a pooled connection,
 * 5 s in all) are short for a loaded 2-core machine where the relay and consumers share the pool.
 */
const PLACE_TRANSACTION = { maxWait: 10_000, timeout: 20_000 } as const;

/**
 * Places every order of `orders` not committed yet, each in its own
 * `prisma.$transaction(async (tx) => …)` that appends its `orders.OrderPlaced` to the outbox
 * and creates the order row: both commit, or neither. Safe to call again after a crash:
 * committed orders are skipped, and a retry whose first try did commit meets the order's
 * primary key (P2002) and counts it placed. Failures a retry can cure (a lost connection, a
 * pool or transaction timeout, a deadlock) are retried with capped backoff for up to
 * `patienceMs` (default 60 s). Returns how many it placed.
 */
export async function placeOrdersOnPrisma(
  bus: PrismaBus,
  prisma: ShopPrismaClient,
  orders: readonly CatalogOrder[],
  options: { readonly concurrency?: number; readonly signal?: AbortSignal; readonly patienceMs?: number } = {},
): Promise<number> {
  const patienceMs = options.patienceMs ?? 60_000;
  const existing = new Set((await retryTransient(async () => prisma.order.findMany({ select: { id: true } }), patienceMs, options.signal)).map((order) => order.id));
  const queue = orders.filter((order) => !existing.has(order.orderId));
  let placed = 0;
  const worker = async (): Promise<void> => {
    for (let order = queue.shift(); order !== undefined && !options.signal?.aborted; order = queue.shift()) {
      const { orderId, customerId, totalCents, legacy } = order;
      let tries = 0;
      await retryTransient(
        async () => {
          tries += 1;
          try {
            await prisma.$transaction(async (tx) => {
              const outbox = bus.outbox(tx);
              const placedMessageId = legacy
                ? await outbox.publish(OrderPlacedV1, { orderId, customerId, totalCents }, { key: orderId })
                : await outbox.publish(OrderPlaced, { orderId, customerId, total: { amountCents: totalCents, currency: 'EUR' } }, { key: orderId });
              await tx.order.create({ data: { id: orderId, customerId, totalCents, currency: 'EUR', status: 'placed', placedMessageId } });
            }, PLACE_TRANSACTION);
          } catch (error) {
            // A try whose commit went through unnoticed makes the next one meet the primary key.
            if (tries > 1 && prismaCode(error) === 'P2002') return;
            throw error;
          }
        },
        patienceMs,
        options.signal,
      );
      placed += 1;
      // The relay may be sleeping between polls: a commit in this process wakes it.
      bus.wake();
    }
  };
  await Promise.all(Array.from({ length: options.concurrency ?? 8 }, () => worker()));
  return placed;
}

/** Writes every suppressed duplicate to `inbox_duplicates` (model `InboxDuplicate`) for the report. */
export function prismaDuplicateLog(prisma: ShopPrismaClient): DuplicateLog {
  return {
    recordDuplicate: async (messageId, consumer) => {
      await prisma.inboxDuplicate.create({ data: { messageId, consumer } });
    },
  };
}

// Prisma's codes for failures a retry can cure: database unreachable or timed out (P1001,
// P1002, P1008), connection closed (P1017), no pooled connection in time (P2024), transaction
// expired or not started in time (P2028), write conflict or deadlock (P2034).
const PRISMA_TRANSIENT = new Set(['P1001', 'P1002', 'P1008', 'P1017', 'P2024', 'P2028', 'P2034']);

function prismaCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^P\d{4}$/.test(code) ? code : undefined;
}

/**
 * Runs `work` again while it fails in a way a retry can cure (Prisma's transient codes above, or
 * a Courier error marked retriable, or a driver error Courier classifies as transient — the
 * outbox append's), until `patienceMs` passed since the first failure or `signal` aborted.
 */
async function retryTransient<T>(work: () => Promise<T>, patienceMs: number, signal: AbortSignal | undefined): Promise<T> {
  let firstFailure: number | undefined;
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await work();
    } catch (error) {
      firstFailure ??= Date.now();
      const code = prismaCode(error);
      const curable = (code !== undefined && PRISMA_TRANSIENT.has(code)) || isRetriable(error) || classifyDriverError(error) === 'transient';
      if (!curable || signal?.aborted || Date.now() - firstFailure >= patienceMs) throw error;
      await sleep(Math.min(2_000, 100 * 2 ** attempt));
    }
  }
}
