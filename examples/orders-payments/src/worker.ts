import { serveCourierMetrics, type CourierMetricsServer, type CourierMetricsSources } from '@courier/cli';
import { createBus, describeError, type Bus, type BusHealth, type Logger } from '@courier/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { PgLogicalOutboxStore } from '@courier/pg-logical';
import type { EntityManager } from '@mikro-orm/core';
import { catalog, type CatalogOrder } from './catalog.js';
import { ConciseLogger } from './concise-logger.js';
import { TABLE_PREFIXES } from './databases.js';
import { logSlotName, openBackend, rabbitMqTransport, type RunnerMessage, type WorkerConfig, type WorkerMessage } from './distributed-config.js';
import { DuplicateRecordingInbox } from './duplicate-recording-inbox.js';
import { MikroOrmShop } from './mikro-orm-shop.js';
import type { DataLayer, WorkerRole } from './options.js';
import { placeOrders, subscribeOrders } from './orders-service.js';
import { subscribePayments } from './payments-service.js';
import { DEMO_RELAY } from './run-result.js';

function send(message: WorkerMessage): void {
  // The runner may be gone (or killing us); a lost progress report does not matter.
  if (process.connected) process.send?.(message, undefined, {}, () => undefined);
}

/**
 * One service as a process of its own (sqlite-sql and postgres-rabbitmq setups), with its own bus:
 * - `orders`: places the run's orders (those not committed yet: it may be a restart),
 *   relays OrderPlaced, and consumes PaymentCaptured;
 * - `payments`: consumes OrderPlaced and relays PaymentCaptured.
 * Reports its counters to the runner every second; on `stop` it drains and exits 0.
 * If the runner goes away it exits too.
 */
export async function runWorker(role: WorkerRole, configText: string): Promise<number> {
  const config = JSON.parse(configText) as WorkerConfig;
  const logger = new ConciseLogger(`  [${role}#${config.incarnation}]`, (line) => process.stderr.write(`${line}\n`), config.verbose);
  // --metrics-port: before the bus is built (it takes its instruments from the meter provider
  // serveCourierMetrics registers). A restarted worker binds the same port again. One
  // collection answers scrapes for 1 s (default 5 s): a demo run lasts only seconds.
  const metrics: CourierMetricsServer | undefined =
    config.metricsPort === null
      ? undefined
      : await serveCourierMetrics({ port: config.metricsPort === 0 ? 0 : config.metricsPort + (role === 'payments' ? 1 : 0), serviceName: `courier-example-${role}`, logger, metricsMaxAgeMs: 1_000 });
  const service = config.dataLayers[role] === 'prisma' ? await prismaService(role, config, logger) : await mikroOrmService(role, config, logger);
  metrics?.watch({ bus: service, ...service.metricsSources });
  const { logTail } = service;

  const abort = new AbortController();
  let stopping: Promise<void> | undefined;
  let placing: Promise<unknown> = Promise.resolve();
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      abort.abort();
      clearInterval(reporter);
      await placing.catch(() => undefined);
      await service.close();
      await metrics?.close();
      const claimed = logTail ? { logTail: { slot: logTail.slot, ...logTail.claimed } } : {};
      send({ kind: 'stopped', counters: service.health().counters, ...claimed });
    })());
  const reporter = setInterval(() => send({ kind: 'progress', counters: service.health().counters }), 1_000);
  process.on('disconnect', () => process.exit(1));
  // Ctrl-C reaches the whole process group; the runner decides when workers stop.
  process.on('SIGINT', () => undefined);

  const stopped = new Promise<void>((resolve, reject) => {
    process.on('message', (message: RunnerMessage) => {
      if (message.kind === 'stop') stop().then(resolve, reject);
    });
  });
  await service.start();
  // --relay log: ready once the relay reads its slot, so the orders placed next come from the log (rows committed before
  // a slot exists are its sweep's). A slot that cannot be read leaves the relay polling, which the log says. A stop ends the wait.
  for (const until = Date.now() + 30_000; logTail && !logTail.streaming && !abort.signal.aborted && Date.now() < until; ) await new Promise((resolve) => setTimeout(resolve, 50));
  if (logTail && !logTail.streaming && !abort.signal.aborted) logger.warn('log-tail relay does not read its slot yet; claiming as a polling relay meanwhile', { slot: logTail.slot });
  send({ kind: 'ready', dataLayer: service.dataLayer, ...(metrics ? { metricsUrl: `http://127.0.0.1:${metrics.address.port}/metrics` } : {}) });
  if (role === 'orders') {
    placing = service.placeOrders(catalog(config.orders), abort.signal).then(
      (placed) => send({ kind: 'placed', placed }),
      (error: unknown) => {
        if (!abort.signal.aborted) logger.error('placing orders failed', { error: describeError(error) });
        throw error;
      },
    );
    // A failure to place is fatal for this process: the runner restarts it, and the
    // restart places what is missing.
    placing.catch(() => {
      if (!abort.signal.aborted) process.exit(3);
    });
  }
  await stopped;
  return 0;
}

/** One service of a worker process, whatever its data layer. */
interface WorkerService {
  /** What the service writes its rows and Courier's tables through. */
  readonly dataLayer: DataLayer;
  /** `--relay log`: the store whose relay tails this role's replication slot (MikroORM services only). */
  readonly logTail?: PgLogicalOutboxStore<EntityManager>;
  health(): BusHealth;
  /** What the worker's /metrics reports gauges of besides the bus (--metrics-port): its outbox and inbox where the service has them in hand. */
  readonly metricsSources?: Omit<CourierMetricsSources, 'bus'>;
  /** Starts the bus (a NestJS application has started it already). */
  start(): Promise<void>;
  /** Drains the bus, then closes the stores, the transport and the database client. */
  close(): Promise<void>;
  /** The orders service: places the orders not committed yet (see placeOrders). */
  placeOrders(orders: readonly CatalogOrder[], signal: AbortSignal): Promise<number>;
}

/** The service on MikroORM (every setup; the orders service of postgres-rabbitmq-nest as a NestJS application). */
async function mikroOrmService(role: WorkerRole, config: WorkerConfig, logger: Logger): Promise<WorkerService> {
  // A worker comes up while the database restarts (the runner checked it before starting any).
  const { orm, transport, schema } = await openBackend(config, logger, 8, { waitForServer: true });
  if (config.setup === 'postgres-rabbitmq-nest' && role === 'orders') {
    // The orders service as a NestJS application: CourierModule starts the bus, and app.close() drains it and closes the rest.
    const nest = await (await import('./nest-orders-app.js')).startNestOrders({ orm, transport, schema }, logger, config.maxCrashes);
    return { dataLayer: 'mikro-orm', health: () => nest.bus.health(), start: async () => undefined, close: () => nest.close(), placeOrders: (orders, signal) => placeOrders(nest.bus, nest.shop, orders, { signal }) };
  }
  const tables = { orm, tablePrefix: TABLE_PREFIXES[role], schema };
  const polling = new MikroOrmOutboxStore({ ...tables, logger });
  // --relay log: the relay learns of committed rows from this role's replication slot (the polling store appends, completes and sweeps).
  const logTail =
    config.relay === 'log'
      ? new PgLogicalOutboxStore({ store: polling, connection: { connectionString: config.pgUrl }, slot: logSlotName(config.schema, role), tables: { tablePrefix: TABLE_PREFIXES[role], ...(schema === undefined ? {} : { schema }) }, logger })
      : undefined;
  const outbox = logTail ?? polling;
  const inbox = new MikroOrmInboxStore(tables);
  const shop = new MikroOrmShop(orm);
  const bus: Bus<EntityManager> = createBus({ outbox, inbox: new DuplicateRecordingInbox(inbox, shop), transport, relay: DEMO_RELAY, logger });
  if (role === 'orders') subscribeOrders(bus, shop, { maxCrashes: config.maxCrashes });
  else subscribePayments(bus, shop, { maxCrashes: config.maxCrashes });
  return {
    dataLayer: 'mikro-orm',
    ...(logTail ? { logTail } : {}),
    health: () => bus.health(),
    // The backlog, dead rows, halted keys and the inbox of this role (a log-tailing outbox adds its slot's lag).
    metricsSources: { outbox, inbox },
    // --relay-once: this process only consumes; the runner drains its outbox with relayOnce on a schedule.
    start: () => bus.start(config.relayOnce ? { relay: false } : {}),
    close: async () => {
      await bus.stop({ timeoutMs: 5_000 });
      await transport.close();
      await Promise.all([outbox.close(), inbox.close()]);
      await orm.close();
    },
    placeOrders: (orders, signal) => placeOrders(bus, shop, orders, { signal }),
  };
}

/**
 * The service on Prisma (postgres-rabbitmq `--data-layer prisma`): the example's generated
 * Prisma Client on the run's schema, the run's RabbitMQ transport, and no MikroORM at all.
 */
async function prismaService(role: WorkerRole, config: WorkerConfig, logger: Logger): Promise<WorkerService> {
  const { openShopPrisma } = await import('./prisma-shop-client.js');
  const { createPrismaService, placeOrdersOnPrisma } = await import('./prisma-services.js');
  // The client connects on first use: a worker started while PostgreSQL restarts still comes up.
  const prisma = await openShopPrisma(config.pgUrl, config.schema, 8);
  const transport = rabbitMqTransport(config.rabbitMqUrl, config.prefix, logger);
  const { bus, close } = createPrismaService(role, prisma, transport, { schema: config.schema, logger, maxCrashes: config.maxCrashes });
  return {
    dataLayer: 'prisma',
    health: () => bus.health(),
    start: () => bus.start(),
    close: async () => {
      await close();
      await transport.close();
      await prisma.$disconnect();
    },
    placeOrders: (orders, signal) => placeOrdersOnPrisma(bus, prisma, orders, { signal }),
  };
}
