// The shop's Courier options, in one function that both the Nest module (shop.ts,
// forRootAsync's useFactory) and the CLI (courier.config.ts, through courierCliSetup) call:
// the README's "courier.config.ts from the same options". No decorators here, so the CLI
// loads it through tsx as it is.
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { RabbitMqTransport } from '@courier/rabbitmq';
import type { EntityManager, MikroORM } from '@mikro-orm/core';
import type { CourierModuleOptions } from '../../src/index.js';

export const RABBITMQ_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';
export const DELAY_TIERS_MS = [200, 600];

/** One test's names: its PostgreSQL schema and RabbitMQ prefix. */
export interface ShopNames {
  readonly schema: string;
  readonly prefix: string;
}

/** The stores on the test's schema, the transport on its prefix, and how to close them. */
export function shopCourierOptions(orm: MikroORM, names: ShopNames): CourierModuleOptions<EntityManager> {
  const outbox = new MikroOrmOutboxStore({ orm, schema: names.schema });
  const transport = new RabbitMqTransport({ connection: RABBITMQ_URL, prefix: names.prefix, delayTiersMs: DELAY_TIERS_MS, publishTimeoutMs: 2_000 });
  return {
    outbox,
    inbox: new MikroOrmInboxStore({ orm, schema: names.schema }),
    transport,
    relay: { pollIntervalMs: 200 },
    retry: { initialDelayMs: 100, maxDelayMs: 600 },
    close: async () => {
      await transport.close();
      await outbox.close();
    },
  };
}
