// A publish → relay → consume round trip through the packed packages, run by
// scripts/pack-smoke.mjs inside its scratch project (it is copied there: nothing here may
// resolve to the workspace). One SQLite file (@mikro-orm/libsql) holds the business table,
// the outbox, the inbox and the queue of @courier/sql-transport, so it needs no server and
// exercises the MikroORM plugin end to end on whichever MikroORM major is installed:
//   - the producer's order row and its outbox row commit in one flush;
//   - the relay publishes the outbox rows to the SQL transport;
//   - the consumer's effect row and its inbox record commit together, once per message,
//     and its ctx.publish goes through the outbox again (a second hop);
//   - the courierMigrations classes (@mikro-orm/migrations) create the schema through
//     MikroORM's own migrator;
//   - withSqliteBusyTimeout gives the ORM's connection its busy timeout before any store
//     exists (MikroORM 6 and 7 read it from different driverOptions).
// Prints one line per check and exits non-zero when one fails.
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { createBus, defineMessage } from '@courier/core';
import { courierMigrations } from '@courier/mikro-orm/migrations';
import { MikroOrmInboxStore, MikroOrmOutboxStore, SQLITE_BUSY_TIMEOUT_MS, withSqliteBusyTimeout } from '@courier/mikro-orm';
import { SqlTransport } from '@courier/sql-transport';
import { EntitySchema } from '@mikro-orm/core';
import { MikroORM } from '@mikro-orm/libsql';
import { Migrator } from '@mikro-orm/migrations';

const mikroOrmVersion = createRequire(import.meta.url)('@mikro-orm/core/package.json').version;
console.log(`round trip on Node ${process.version}, MikroORM ${mikroOrmVersion}`);

const deadline = (ms, what) =>
  new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms).unref());

/** Waits until `check()` is true, polling; bounded. */
async function eventually(check, what, ms = 30_000) {
  const until = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

class Order {
  id;
  total;
}
class Payment {
  orderId;
}
const OrderSchema = new EntitySchema({
  class: Order,
  tableName: 'smoke_orders',
  properties: { id: { type: 'string', primary: true }, total: { type: 'number' } },
});
const PaymentSchema = new EntitySchema({
  class: Payment,
  tableName: 'smoke_payments',
  properties: { orderId: { type: 'string', primary: true, fieldName: 'order_id' } },
});

const OrderPlaced = defineMessage('orders.OrderPlaced', { version: 1 });
const PaymentCaptured = defineMessage('payments.PaymentCaptured', { version: 1 });

const directory = mkdtempSync(join(tmpdir(), 'courier-round-trip-'));
let orm;
let bus;
let transport;
try {
  orm = await MikroORM.init(
    withSqliteBusyTimeout({
      dbName: join(directory, 'shop.db'),
      entities: [OrderSchema, PaymentSchema],
      debug: false,
      discovery: { warnWhenNoEntities: false },
      extensions: [Migrator],
      migrations: { migrationsList: courierMigrations(), snapshot: false, silent: true },
    }),
  );
  const connection = orm.em.getConnection('write');
  // Before any Courier store touches the connection: the timeout must come from the options.
  const [busy] = await connection.execute('PRAGMA busy_timeout', [], 'all');
  const busyMs = Number(Object.values(busy ?? {})[0]);
  if (busyMs !== SQLITE_BUSY_TIMEOUT_MS) throw new Error(`withSqliteBusyTimeout: the ORM's connection opened with busy_timeout ${busyMs}, expected ${SQLITE_BUSY_TIMEOUT_MS}`);
  console.log(`ok withSqliteBusyTimeout: the connection opened with busy_timeout ${busyMs}`);
  await connection.execute('CREATE TABLE smoke_orders (id TEXT PRIMARY KEY, total REAL NOT NULL)', [], 'run');
  await connection.execute('CREATE TABLE smoke_payments (order_id TEXT PRIMARY KEY)', [], 'run');

  // The migration classes create the stores' tables, run by MikroORM's own migrator
  // (`orm.getMigrator()` in MikroORM 6, `orm.migrator` in 7).
  const migrator = typeof orm.getMigrator === 'function' ? orm.getMigrator() : orm.migrator;
  const applied = await migrator.up();
  const names = applied.map((migration) => migration.name).join(', ');
  if (applied.length !== courierMigrations().length) throw new Error(`the migrator applied '${names}', expected ${courierMigrations().length} migrations`);
  console.log(`ok migrations applied by the MikroORM migrator: ${names}`);

  const outbox = new MikroOrmOutboxStore({ orm });
  const inbox = new MikroOrmInboxStore({ orm });
  await outbox.checkSchema();
  transport = new SqlTransport({ orm, pollIntervalMs: 50 });
  await transport.ensureSchema();
  bus = createBus({ outbox, inbox, transport });

  const captured = [];
  bus.subscribe('payments', OrderPlaced, async (message, ctx) => {
    ctx.tx.persist(Object.assign(new Payment(), { orderId: message.payload.orderId }));
    ctx.publish(PaymentCaptured, { orderId: message.payload.orderId }, { key: message.payload.orderId });
  });
  bus.subscribe('notifications', PaymentCaptured, async (message) => {
    captured.push(message.payload.orderId);
  });
  await bus.start({ relay: true, consumers: true });

  const orders = ['o-1', 'o-2', 'o-3'];
  for (const [index, id] of orders.entries()) {
    const em = orm.em.fork();
    em.persist(Object.assign(new Order(), { id, total: 10 * (index + 1) }));
    bus.outbox(em).publish(OrderPlaced, { orderId: id }, { key: id });
    await em.flush();
  }
  console.log(`ok published ${orders.length} orders, each with its outbox row in one flush`);

  await Promise.race([
    eventually(() => captured.length >= orders.length, `${orders.length} PaymentCaptured messages (got ${captured.length})`),
    deadline(60_000, 'the round trip'),
  ]);
  const payments = await orm.em.fork().getConnection().execute('SELECT order_id FROM smoke_payments ORDER BY order_id', [], 'all');
  const paid = payments.map((row) => row.order_id).join(',');
  if (paid !== orders.join(',')) throw new Error(`payments table holds '${paid}', expected '${orders.join(',')}'`);
  if ([...captured].sort().join(',') !== orders.join(',')) throw new Error(`PaymentCaptured for '${captured.join(',')}', expected '${orders.join(',')}'`);
  console.log('ok relayed and consumed: every order paid once (inbox + effect in one transaction), PaymentCaptured relayed and consumed');
} finally {
  await bus?.stop({ timeoutMs: 10_000 });
  await transport?.close();
  await orm?.close(true);
  rmSync(directory, { recursive: true, force: true });
}
console.log('round trip passed');
