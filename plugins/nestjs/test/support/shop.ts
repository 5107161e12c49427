// A small NestJS shop on MikroORM (PostgreSQL) and RabbitMQ, wired the way the README shows:
// an ORM module of its own (what @mikro-orm/nestjs provides: MikroORM, the EntityManager and
// a RequestContext per HTTP request), CourierModule.forRootAsync on that ORM, a producer
// service that publishes inside its transaction, and a handler provider with injected
// dependencies. Each test gets its own PostgreSQL schema and RabbitMQ prefix.
import { randomBytes } from 'node:crypto';
import type { Bus, HandlerContext, ReceivedMessage } from '@courier/core';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import { rabbitMqNames } from '@courier/rabbitmq';
import { EntityManager, MikroORM, RequestContext, Transactional, type Options } from '@mikro-orm/core';
import { MikroORM as PostgresOrm } from '@mikro-orm/postgresql';
import {
  Body,
  Controller,
  Global,
  Inject,
  Injectable,
  Module,
  Post,
  type BeforeApplicationShutdown,
  type DynamicModule,
  type INestApplication,
  type MiddlewareConsumer,
  type NestMiddleware,
  type NestModule,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { connect } from 'amqplib';
import { CourierModule, InjectBus, OnMessage, type CourierStartOptions } from '../../src/index.js';
import { ENTITIES, OrderPlaced, ShopOrder, ShopPayment } from './shop-model.js';
import { DELAY_TIERS_MS, RABBITMQ_URL, shopCourierOptions } from './courier-options.js';

export { OrderPlaced, ShopOrder, ShopPayment } from './shop-model.js';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const PAYMENTS = 'payments';

/** One test's names: its PostgreSQL schema and RabbitMQ prefix. */
export interface ShopEnv {
  readonly id: string;
  readonly schema: string;
  readonly prefix: string;
}

export function shopEnv(): ShopEnv {
  const id = randomBytes(5).toString('hex');
  return { id, schema: `nest_${id}`, prefix: `nest-${id}` };
}

function ormOptions(env: ShopEnv): Options {
  return { clientUrl: PG_URL, schema: env.schema, entities: ENTITIES, pool: { min: 0, max: 6 }, debug: false } as Options;
}

/** Opens an ORM on the test's schema; fails loudly with how to start PostgreSQL. */
export async function openOrm(env: ShopEnv): Promise<MikroORM> {
  const orm = (await PostgresOrm.init(ormOptions(env))) as unknown as MikroORM;
  const check = await orm.em.getConnection().checkConnection();
  if (!check.ok) {
    await orm.close(true);
    throw new Error(`PostgreSQL is unreachable at ${PG_URL} (${check.reason}): run 'bash scripts/services.sh' or set COURIER_PG_URL`);
  }
  return orm;
}

/** Creates the test's schema: the shop's tables and Courier's. */
export async function prepareSchema(env: ShopEnv): Promise<void> {
  const orm = await openOrm(env);
  try {
    await orm.em.getConnection().execute(`CREATE SCHEMA IF NOT EXISTS "${env.schema}"`, [], 'run');
    await orm.schema.createSchema();
    const outbox = new MikroOrmOutboxStore({ orm, schema: env.schema, wakeups: false });
    await outbox.ensureSchema();
    await outbox.close();
  } finally {
    await orm.close();
  }
}

/** Drops the test's schema and its RabbitMQ exchange and queues. */
export async function dropEnv(env: ShopEnv): Promise<void> {
  const orm = await openOrm(env);
  try {
    await orm.em.getConnection().execute(`DROP SCHEMA IF EXISTS "${env.schema}" CASCADE`, [], 'run');
  } finally {
    await orm.close();
  }
  const connection = await connect(RABBITMQ_URL);
  try {
    const channel = await connection.createChannel();
    const names = rabbitMqNames(env.prefix, PAYMENTS, DELAY_TIERS_MS);
    for (const queue of [...names.retryQueues.map((tier) => tier.name), names.queue, names.deadLetterQueue]) await channel.deleteQueue(queue);
    await channel.deleteExchange(`${env.prefix}.topics`);
  } finally {
    await connection.close();
  }
}

/** Messages ready in the payments queue (not acknowledged, waiting to be delivered again). */
export async function readyInPaymentsQueue(env: ShopEnv): Promise<number> {
  const connection = await connect(RABBITMQ_URL);
  try {
    const channel = await connection.createChannel();
    return (await channel.checkQueue(rabbitMqNames(env.prefix, PAYMENTS, DELAY_TIERS_MS).queue)).messageCount;
  } finally {
    await connection.close();
  }
}

/** Reads one column of rows with SQL, outside any Nest application. */
export async function query<T>(env: ShopEnv, sql: string): Promise<T[]> {
  const orm = await openOrm(env);
  try {
    return (await orm.em.getConnection().execute(sql.replaceAll('$schema', `"${env.schema}"`), [], 'all')) as T[];
  } finally {
    await orm.close();
  }
}

// ---- the application -------------------------------------------------------------------

export const SHOP_ENV = 'SHOP_ENV';

/** What @mikro-orm/nestjs's RequestContext middleware does: one EntityManager fork per request. */
@Injectable()
class RequestContextMiddleware implements NestMiddleware {
  constructor(private readonly orm: MikroORM) {}
  use(_request: unknown, _response: unknown, next: () => void): void {
    RequestContext.create(this.orm.em, next);
  }
}

/** MikroORM for the application, as an ORM module provides it (closed last, at shutdown). */
@Global()
@Module({})
class OrmModule implements OnApplicationShutdown {
  constructor(private readonly orm: MikroORM) {}
  static forRoot(env: ShopEnv): DynamicModule {
    return {
      module: OrmModule,
      providers: [
        { provide: MikroORM, useFactory: () => openOrm(env) },
        { provide: EntityManager, useFactory: (orm: MikroORM) => orm.em, inject: [MikroORM] },
        RequestContextMiddleware,
      ],
      exports: [MikroORM, EntityManager, RequestContextMiddleware],
    };
  }
  async onApplicationShutdown(): Promise<void> {
    await this.orm.close();
  }
}

/** Holds chosen orders' handlers until released: a handler in flight on demand. */
@Injectable()
export class HandlerGate {
  readonly #held = new Map<string, { readonly entered: Deferred; readonly release: Deferred }>();
  hold(orderId: string): { readonly entered: Promise<void>; release(): void } {
    const entry = { entered: deferred(), release: deferred() };
    this.#held.set(orderId, entry);
    return { entered: entry.entered.promise, release: entry.release.resolve };
  }
  async pass(orderId: string): Promise<void> {
    const entry = this.#held.get(orderId);
    if (!entry) return;
    entry.entered.resolve();
    await entry.release.promise;
  }
}

interface Deferred {
  readonly promise: Promise<void>;
  readonly resolve: () => void;
}

function deferred(): Deferred {
  let resolve!: () => void;
  const promise = new Promise<void>((done) => (resolve = done));
  return { promise, resolve };
}

/** A dependency of the handler: proves the handler runs on the injected provider instance. */
@Injectable()
export class PaymentsLedger {
  readonly runs: string[] = [];
  record(orderId: string): void {
    this.runs.push(orderId);
  }
}

@Injectable()
export class PaymentsHandler {
  constructor(
    private readonly ledger: PaymentsLedger,
    private readonly gate: HandlerGate,
  ) {}

  @OnMessage(OrderPlaced, { consumer: PAYMENTS, ordered: true, concurrency: 4 })
  async capture(message: ReceivedMessage<{ orderId: string; total: number }>, ctx: HandlerContext<EntityManager>): Promise<void> {
    await this.gate.pass(message.payload.orderId);
    ctx.tx.persist(new ShopPayment(message.messageId, message.payload.orderId));
    this.ledger.record(message.payload.orderId);
  }
}

@Injectable()
export class OrdersService {
  constructor(
    private readonly em: EntityManager,
    @InjectBus() private readonly bus: Bus<EntityManager>,
  ) {}

  /** The idiom: MikroORM's @Transactional(); the publish joins the method's transaction. */
  @Transactional()
  async place(orderId: string, total: number, fail = false): Promise<void> {
    this.em.persist(new ShopOrder(orderId, total));
    this.bus.outbox(this.em).publish(OrderPlaced, { orderId, total }, { key: orderId });
    if (fail) throw new Error(`order '${orderId}' refused after its message was published`);
  }

  /**
   * The request-context idiom, no explicit transaction: in a request, the injected
   * EntityManager is the request's fork; the flush commits the order and the outbox row in
   * one implicit transaction.
   */
  async placeByFlush(orderId: string, total: number): Promise<void> {
    this.em.persist(new ShopOrder(orderId, total));
    this.bus.outbox(this.em).publish(OrderPlaced, { orderId, total }, { key: orderId });
    await this.em.flush();
  }

  /** The same with em.transactional(): publish on the EntityManager the callback gets. */
  async placeExplicitly(orderId: string, total: number): Promise<void> {
    await this.em.transactional(async (em) => {
      em.persist(new ShopOrder(orderId, total));
      this.bus.outbox(em).publish(OrderPlaced, { orderId, total }, { key: orderId });
    });
  }
}

/** What the application's second shutdown phase finds: the bus's state and the committed payments. */
@Injectable()
export class ShutdownProbe implements BeforeApplicationShutdown {
  seen: { readonly status: string; readonly payments: number } | undefined;
  constructor(
    @InjectBus() private readonly bus: Bus<EntityManager>,
    private readonly orm: MikroORM,
  ) {}
  async beforeApplicationShutdown(): Promise<void> {
    this.seen = { status: this.bus.health().status, payments: await this.orm.em.fork().count(ShopPayment) };
  }
}

@Controller('orders')
export class OrdersController {
  constructor(@Inject(OrdersService) private readonly orders: OrdersService) {}
  @Post()
  async place(@Body() body: { orderId: string; total: number; fail?: boolean }): Promise<{ orderId: string }> {
    await this.orders.place(body.orderId, body.total, body.fail ?? false);
    return { orderId: body.orderId };
  }
  @Post('by-flush')
  async placeByFlush(@Body() body: { orderId: string; total: number }): Promise<{ orderId: string }> {
    await this.orders.placeByFlush(body.orderId, body.total);
    return { orderId: body.orderId };
  }
}

@Module({
  controllers: [OrdersController],
  providers: [OrdersService, PaymentsHandler, PaymentsLedger, HandlerGate, ShutdownProbe],
})
class ShopModule implements NestModule {
  configure(consumer: MiddlewareConsumer): void {
    consumer.apply(RequestContextMiddleware).forRoutes(OrdersController);
  }
}

export interface ShopAppOptions {
  readonly start?: CourierStartOptions | false;
  readonly stopTimeoutMs?: number;
}

/** The shop as a Nest application (initialised: the bus runs what `start` asks for). */
export async function createShopApp(env: ShopEnv, options: ShopAppOptions = {}): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      OrmModule.forRoot(env),
      CourierModule.forRootAsync({
        inject: [MikroORM],
        useFactory: (orm: MikroORM) => ({
          ...shopCourierOptions(orm, env),
          ...(options.start !== undefined ? { start: options.start } : {}),
          stop: { timeoutMs: options.stopTimeoutMs ?? 10_000 },
        }),
      }),
      ShopModule,
    ],
  }).compile();
  const app = moduleRef.createNestApplication({ logger: ['error', 'warn'] });
  await app.init();
  return app;
}
