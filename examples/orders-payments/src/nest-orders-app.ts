import type { Bus, DecodedOf, HandlerContext, Logger, ReceivedMessage } from '@courier/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { CourierModule, OnMessage, getBusToken } from '@courier/nestjs';
import type { EntityManager } from '@mikro-orm/core';
import { Inject, Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { RunBackend } from './distributed-config.js';
import { TABLE_PREFIXES } from './databases.js';
import { DuplicateRecordingInbox } from './duplicate-recording-inbox.js';
import { MikroOrmShop } from './mikro-orm-shop.js';
import { ORDERS_CONSUMER, ORDERS_SUBSCRIPTION, applyPaymentCaptured } from './orders-service.js';
import { PaymentCaptured } from './messages.js';
import { DEMO_RELAY } from './run-result.js';

/** The orders service as a NestJS application (setup `postgres-rabbitmq-nest`): what it exposes to the worker process. */
export interface NestOrdersService {
  readonly bus: Bus<EntityManager>;
  readonly shop: MikroOrmShop;
  /** `app.close()`: the module drains the bus (5 s), then closes the transport, the stores and the ORM. */
  close(): Promise<void>;
}

const SHOP = 'Shop';

/**
 * Boots the orders service as a Nest application context (no HTTP server): `CourierModule`
 * on the run's PostgreSQL schema and RabbitMQ prefix, and the PaymentCaptured handler as a
 * provider with the shop injected. Resolves once the bus has started (the module starts it
 * in `onApplicationBootstrap`). Decorators are applied as functions here because the demo
 * runs through tsx (esbuild), which emits no decorator metadata: every injection names its token.
 */
export async function startNestOrders(backend: RunBackend, logger: Logger, maxCrashes: number): Promise<NestOrdersService> {
  const { orm, transport, schema } = backend;
  const tables = { orm, tablePrefix: TABLE_PREFIXES.orders, schema };
  const outbox = new MikroOrmOutboxStore({ ...tables, logger });
  const inbox = new MikroOrmInboxStore(tables);
  const shop = new MikroOrmShop(orm);

  class PaymentCapturedHandler {
    constructor(private readonly shop: MikroOrmShop) {}
    async onPaymentCaptured(message: ReceivedMessage<DecodedOf<typeof PaymentCaptured>>, ctx: HandlerContext<EntityManager>): Promise<void> {
      await applyPaymentCaptured(this.shop, message, ctx);
    }
  }
  Injectable()(PaymentCapturedHandler);
  Inject(SHOP)(PaymentCapturedHandler, undefined, 0);
  const method = Object.getOwnPropertyDescriptor(PaymentCapturedHandler.prototype, 'onPaymentCaptured')!;
  OnMessage(PaymentCaptured, { consumer: ORDERS_CONSUMER, ...ORDERS_SUBSCRIPTION, maxCrashes })(PaymentCapturedHandler.prototype, 'onPaymentCaptured', method);

  class OrdersAppModule {}
  Module({
    imports: [
      CourierModule.forRoot<EntityManager>({
        outbox,
        inbox: new DuplicateRecordingInbox(inbox, shop),
        transport,
        relay: DEMO_RELAY,
        logger,
        stop: { timeoutMs: 5_000 },
        close: async () => {
          await transport.close();
          await Promise.all([outbox.close(), inbox.close()]);
          await orm.close();
        },
      }),
    ],
    providers: [{ provide: SHOP, useValue: shop }, PaymentCapturedHandler],
  })(OrdersAppModule);

  const app = await NestFactory.createApplicationContext(OrdersAppModule, { logger: ['error', 'warn'], abortOnError: false });
  logger.info('orders service started as a NestJS application context');
  return { bus: app.get<Bus<EntityManager>>(getBusToken()), shop, close: () => app.close() };
}
