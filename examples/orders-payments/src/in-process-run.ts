import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  createBus,
  describeError,
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  type Bus,
  type InMemoryTransaction,
  type Logger,
} from '@courier/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import type { EntityManager } from '@mikro-orm/core';
import { catalog } from './catalog.js';
import { ConciseLogger } from './concise-logger.js';
import { courierTables, openSqliteOrm, prepareDatabase, TABLE_PREFIXES } from './databases.js';
import { DuplicateRecordingInbox } from './duplicate-recording-inbox.js';
import { InMemoryShop } from './in-memory-shop.js';
import { inMemoryInspector, patientInspector, sqlInspector, type Inspector } from './inspectors.js';
import { MikroOrmShop } from './mikro-orm-shop.js';
import type { ExampleOptions } from './options.js';
import { placeOrders, subscribeOrders } from './orders-service.js';
import { subscribePayments } from './payments-service.js';
import { progressLine } from './progress.js';
import { formatReport, reconcile } from './reconciliation.js';
import { DEMO_RELAY, serviceCounters, sleep, type RunResult } from './run-result.js';
import type { ShopStorage } from './shop-storage.js';
import { SettleWatch } from './snapshot.js';

/** Both services' buses and tables in this process, on one setup. */
interface InProcessEnvironment<Tx> {
  readonly description: string;
  readonly orders: Bus<Tx>;
  readonly payments: Bus<Tx>;
  readonly shop: ShopStorage<Tx>;
  readonly inspector: Inspector;
  /** Closes transports, stores and the database; the buses are stopped before. */
  close(): Promise<void>;
}

/** Courier's in-memory reference database, stores and broker: no dependency beyond core. */
function inMemoryEnvironment(logger: Logger): InProcessEnvironment<InMemoryTransaction> {
  const database = new InMemoryDatabase({ name: 'example' });
  const broker = new InMemoryBroker({ name: 'example' });
  const shop = new InMemoryShop(database);
  const ordersOutbox = new InMemoryOutboxStore({ database });
  const paymentsOutbox = new InMemoryOutboxStore({ database });
  const ordersTransport = broker.connect();
  const paymentsTransport = broker.connect();
  const common = { relay: DEMO_RELAY, logger };
  return {
    description: 'in-memory database, stores and broker (@courier/core only)',
    orders: createBus({ ...common, outbox: ordersOutbox, inbox: new DuplicateRecordingInbox(new InMemoryInboxStore({ database }), shop), transport: ordersTransport }),
    payments: createBus({ ...common, outbox: paymentsOutbox, inbox: new DuplicateRecordingInbox(new InMemoryInboxStore({ database }), shop), transport: paymentsTransport }),
    shop,
    inspector: inMemoryInspector({ shop, outboxes: { orders: ordersOutbox, payments: paymentsOutbox }, deadLetters: ordersTransport.deadLetters }),
    async close() {
      await Promise.all([ordersTransport.close(), paymentsTransport.close()]);
      await broker.close();
    },
  };
}

/** MikroORM on a SQLite file in a temporary folder (libsql: no server, no native build), in-memory broker. */
async function sqliteEnvironment(logger: Logger, keep: boolean, write: (line: string) => void) {
  const folder = await mkdtemp(join(tmpdir(), 'courier-example-'));
  const file = join(folder, 'shop.db');
  const orm = await openSqliteOrm(file);
  try {
    await prepareDatabase(orm, undefined);
  } catch (error) {
    await orm.close(true);
    throw error;
  }
  const broker = new InMemoryBroker({ name: 'example' });
  const shop = new MikroOrmShop(orm);
  const stores = {
    orders: { outbox: new MikroOrmOutboxStore({ orm, tablePrefix: TABLE_PREFIXES.orders, logger }), inbox: new MikroOrmInboxStore({ orm, tablePrefix: TABLE_PREFIXES.orders }) },
    payments: { outbox: new MikroOrmOutboxStore({ orm, tablePrefix: TABLE_PREFIXES.payments, logger }), inbox: new MikroOrmInboxStore({ orm, tablePrefix: TABLE_PREFIXES.payments }) },
  };
  const ordersTransport = broker.connect();
  const paymentsTransport = broker.connect();
  const common = { relay: DEMO_RELAY, logger };
  return {
    description: `MikroORM + SQLite (${keep ? file : 'temporary file'}), in-memory broker`,
    orders: createBus({ ...common, outbox: stores.orders.outbox, inbox: new DuplicateRecordingInbox(stores.orders.inbox, shop), transport: ordersTransport }),
    payments: createBus({ ...common, outbox: stores.payments.outbox, inbox: new DuplicateRecordingInbox(stores.payments.inbox, shop), transport: paymentsTransport }),
    shop,
    inspector: sqlInspector({ orm, shop, tables: courierTables(undefined), deadLetters: ordersTransport.deadLetters }),
    async close() {
      await Promise.all([ordersTransport.close(), paymentsTransport.close()]);
      await broker.close();
      await Promise.all([stores.orders.outbox.close(), stores.orders.inbox.close(), stores.payments.outbox.close(), stores.payments.inbox.close()]);
      await orm.close();
      if (keep) write(`kept the SQLite database: ${file}`);
      else await rm(folder, { recursive: true, force: true });
    },
  } satisfies InProcessEnvironment<EntityManager>;
}

/**
 * Runs the in-memory or SQLite setup: both services' buses in this process, the orders
 * placed, then waits until the counts settle (or the timeout) and reconciles.
 */
export async function runInProcess(options: ExampleOptions, write: (line: string) => void): Promise<RunResult> {
  const logger = new ConciseLogger('  courier', write, options.verbose);
  if (options.setup === 'in-memory') return run(inMemoryEnvironment(logger), options, logger, write);
  return run(await sqliteEnvironment(logger, options.keep, write), options, logger, write);
}

async function run<Tx>(env: InProcessEnvironment<Tx>, options: ExampleOptions, logger: ConciseLogger, write: (line: string) => void): Promise<RunResult> {
  const started = Date.now();
  write(`setup ${options.setup}: ${env.description}; ${options.orders} orders`);
  try {
    subscribeOrders(env.orders, env.shop);
    subscribePayments(env.payments, env.shop);
    await env.payments.start();
    await env.orders.start();
    let placingError: unknown;
    let placing = true;
    placeOrders(env.orders, env.shop, catalog(options.orders)).then(
      () => {
        placing = false;
      },
      (error: unknown) => {
        placingError = error;
        placing = false;
      },
    );
    const inspector = patientInspector(env.inspector, write);
    let snapshot = await inspector.snapshot();
    let lastPrint = Date.now();
    const watch = new SettleWatch({ started, stallMs: options.stallMs, maxMs: options.timeoutMs });
    for (;;) {
      snapshot = await inspector.snapshot();
      if (Date.now() - lastPrint >= 1_000) {
        write(progressLine(Date.now() - started, snapshot, options.orders));
        lastPrint = Date.now();
      }
      if (placingError !== undefined) throw placingError;
      const verdict = watch.observe(snapshot, options.orders, !placing);
      if (verdict === 'settled') break;
      if (verdict !== 'moving') {
        write(watch.describe(verdict));
        break;
      }
      await sleep(100);
    }
    await Promise.all([env.orders.stop({ timeoutMs: 5_000 }), env.payments.stop({ timeoutMs: 5_000 })]);
    snapshot = await inspector.snapshot();
    write(progressLine(Date.now() - started, snapshot, options.orders, 'stopped'));
    const counters = { orders: serviceCounters(env.orders.health().counters), payments: serviceCounters(env.payments.health().counters) };
    const report = reconcile(snapshot, options.orders, counters);
    const footnotes = [
      `retries: payments ${counters.payments.retries} (flaky gateway), orders ${counters.orders.retries}`,
      ...(snapshot.processed.orders === null ? ['processed counts come from the buses\' counters (the in-memory inbox cannot be read from outside)'] : []),
      ...logger.summary(),
    ];
    write(formatReport(report, `reconciliation — setup ${options.setup}, ${options.orders} orders, ${((Date.now() - started) / 1000).toFixed(1)}s`, footnotes));
    return { ok: report.ok, report, snapshot };
  } catch (error) {
    write(`run failed: ${describeError(error)}`);
    throw error;
  } finally {
    await Promise.all([env.orders.stop({ timeoutMs: 1_000 }), env.payments.stop({ timeoutMs: 1_000 })]);
    await env.close();
  }
}
