// The `courier` CLI's view of a postgres-rabbitmq run kept with `--keep`: the Courier
// tables of one service (COURIER_EXAMPLE_SERVICE, default payments) in the run's schema
// `example_<run id>`, and both consumers' dead letters under `courier-example-<run id>`.
//   COURIER_EXAMPLE_RUN=<run id> pnpm courier stats
// With COURIER_EXAMPLE_METRICS_PORT=<p> (the run's --metrics-port), `courier metrics` and the
// console's Relays and consumers read the workers' endpoints: orders on <p>, payments on <p>+1.
import { defineCourierConfig } from '@courier/cli';
import { noopLogger } from '@courier/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { courierSchemaAdmin } from '@courier/mikro-orm/migrations';
import { openPostgresOrm, TABLE_PREFIXES } from './src/databases.js';
import { rabbitMqTransport } from './src/distributed-config.js';
import { ORDERS_CONSUMER } from './src/orders-service.js';
import { PAYMENTS_CONSUMER } from './src/payments-service.js';

export default defineCourierConfig(async () => {
  const run = process.env['COURIER_EXAMPLE_RUN'];
  if (!run) throw new Error('set COURIER_EXAMPLE_RUN to the run id a `--keep` run printed (its schema is example_<run id>)');
  const service = process.env['COURIER_EXAMPLE_SERVICE'] === 'orders' ? 'orders' : 'payments';
  const schema = `example_${run}`;
  const orm = await openPostgresOrm(process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test', schema, 2);
  const tables = { orm, tablePrefix: TABLE_PREFIXES[service], schema };
  const outbox = new MikroOrmOutboxStore({ ...tables, wakeups: false });
  const metricsPort = Number(process.env['COURIER_EXAMPLE_METRICS_PORT']);
  const metrics = Number.isSafeInteger(metricsPort) && metricsPort > 0 ? [{ url: `http://127.0.0.1:${metricsPort}`, name: 'orders' }, { url: `http://127.0.0.1:${metricsPort + 1}`, name: 'payments' }] : undefined;
  const transport = rabbitMqTransport(process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672', `courier-example-${run}`, noopLogger);
  return {
    outbox,
    inbox: new MikroOrmInboxStore(tables),
    transport,
    consumers: [PAYMENTS_CONSUMER, ORDERS_CONSUMER],
    schema: courierSchemaAdmin(tables),
    relay: () => ({ outbox, transport }),
    ...(metrics ? { metrics } : {}),
    async close() {
      await transport.close();
      await outbox.close();
      await orm.close();
    },
  };
});
