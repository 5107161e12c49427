// A Nest worker process for the SIGTERM test, run through tsx (esbuild: no decorator
// metadata, so nothing here is injected by type): CourierModule with the shop's options, a
// payments handler that takes `handlerMs` before it writes, and app.enableShutdownHooks()
// as main.ts should have it. Reports 'ready' and each handler start to its parent over IPC.
import 'reflect-metadata';
import { setTimeout as sleep } from 'node:timers/promises';
import type { HandlerContext, ReceivedMessage } from '@courier/core';
import type { EntityManager, MikroORM } from '@mikro-orm/core';
import { MikroORM as PostgresOrm } from '@mikro-orm/postgresql';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { CourierModule, OnMessage } from '../../src/index.js';
import { shopCourierOptions } from './courier-options.js';
import { ENTITIES, OrderPlaced, ShopPayment } from './shop-model.js';

const config = JSON.parse(process.argv[2] ?? '{}') as { schema: string; prefix: string; pgUrl: string; handlerMs: number };

@Injectable()
class SlowPayments {
  @OnMessage(OrderPlaced, { consumer: 'payments' })
  async capture(message: ReceivedMessage<{ orderId: string; total: number }>, ctx: HandlerContext<EntityManager>): Promise<void> {
    process.send?.({ kind: 'entered', orderId: message.payload.orderId });
    await sleep(config.handlerMs);
    ctx.tx.persist(new ShopPayment(message.messageId, message.payload.orderId));
  }
}

const orm = (await PostgresOrm.init({ clientUrl: config.pgUrl, schema: config.schema, entities: ENTITIES, pool: { min: 0, max: 4 } })) as unknown as MikroORM;
const options = shopCourierOptions(orm, config);

@Module({
  imports: [
    CourierModule.forRoot({
      ...options,
      stop: { timeoutMs: 20_000 },
      close: async () => {
        await options.close?.();
        await orm.close();
      },
    }),
  ],
  providers: [SlowPayments],
})
class WorkerModule {}

const app = await NestFactory.createApplicationContext(WorkerModule, { logger: ['error', 'warn'] });
app.enableShutdownHooks();
process.send?.({ kind: 'ready' });
