// The courier.config.ts of the CLI README, as an operator writes it (MikroORM with
// `ensureDatabase: false` and `connect: false`, a RabbitMQ transport), with its addresses
// from env vars so a test can point it at a wrong database, user, vhost or prefix.
import { defineCourierConfig } from '@courier/cli';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { courierSchemaAdmin } from '@courier/mikro-orm/migrations';
import { RabbitMqTransport } from '@courier/rabbitmq';
import { MikroORM } from '@mikro-orm/postgresql';

export default defineCourierConfig(async () => {
  const prefix = process.env['README_CONFIG_PREFIX'] ?? 'courier_';
  const orm = await MikroORM.init({
    clientUrl: process.env['README_CONFIG_DB_URL'],
    entities: [],
    discovery: { warnWhenNoEntities: false },
    allowGlobalContext: true,
    ensureDatabase: false,
    connect: false,
  });
  const amqp = process.env['README_CONFIG_AMQP_URL'];
  const transport = amqp ? new RabbitMqTransport({ connection: amqp, prefix: process.env['README_CONFIG_BROKER_PREFIX'] ?? 'courier', connectTimeoutMs: 3_000 }) : undefined;
  const outbox = new MikroOrmOutboxStore({ orm, tablePrefix: prefix });
  return {
    outbox,
    inbox: new MikroOrmInboxStore({ orm, tablePrefix: prefix }),
    ...(transport ? { transport, consumers: (process.env['README_CONFIG_CONSUMERS'] ?? '').split(',').filter(Boolean) } : {}),
    schema: courierSchemaAdmin({ orm, tablePrefix: prefix }),
    close: async () => {
      await transport?.close();
      await orm.close();
    },
  };
});
