// Opens the stores and transport the CLI tests use, the same way from the test process
// and from the child's courier.config.ts (which reads the test's choices from env vars).
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { courierSchemaAdmin } from '@courier/mikro-orm/migrations';
import type { RabbitMqTransport, RabbitMqTransportConfig } from '@courier/rabbitmq';
import type { MikroORM, Options } from '@mikro-orm/core';

export type Dialect = 'postgresql' | 'mariadb' | 'sqlite';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
/**
 * The mariadb connector gives up on a new socket after 1 s by default: a loaded machine
 * (CPU-starved event loop) can take longer than that to see a local connection open.
 */
const MARIADB_DRIVER_OPTIONS = { connection: { connectTimeout: 10_000 } };
export const AMQP_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-cli-sqlite');

const HOW_TO_START: Record<Dialect, string> = {
  postgresql: `start PostgreSQL (see docs/ and scripts/services.sh) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (see scripts/services.sh) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** Opens a MikroORM for `dialect`; `name` picks the SQLite file. Fails loudly, saying how to start the server. */
export async function openOrm(dialect: Dialect, name: string, url?: string): Promise<MikroORM> {
  const common = { entities: [], debug: false, discovery: { warnWhenNoEntities: false }, allowGlobalContext: true };
  let orm: MikroORM;
  try {
    if (dialect === 'postgresql') {
      const { MikroORM: Orm } = await import('@mikro-orm/postgresql');
      orm = await Orm.init({ clientUrl: url ?? PG_URL, pool: { min: 0, max: 6 }, ...common } as Options);
    } else if (dialect === 'mariadb') {
      const { MikroORM: Orm } = await import('@mikro-orm/mariadb');
      orm = await Orm.init({ clientUrl: url ?? MARIADB_URL, pool: { min: 0, max: 6 }, driverOptions: MARIADB_DRIVER_OPTIONS, ...common } as Options);
    } else {
      mkdirSync(SQLITE_DIR, { recursive: true });
      const { MikroORM: Orm } = await import('@mikro-orm/libsql');
      orm = await Orm.init({ dbName: join(SQLITE_DIR, `${name}.db`), ...common } as Options);
    }
  } catch (error) {
    throw new Error(`the ${dialect} database cannot be opened: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  return orm;
}

/** What one test (or the child's config) works with. */
export interface CliTestSetup {
  readonly orm: MikroORM;
  readonly outbox: MikroOrmOutboxStore;
  readonly inbox: MikroOrmInboxStore;
  readonly schema: ReturnType<typeof courierSchemaAdmin>;
  close(): Promise<void>;
}

/** Stores with tables `<prefix>…` on `dialect` (the schema is not created here). */
export async function openStores(dialect: Dialect, prefix: string, url?: string): Promise<CliTestSetup> {
  const orm = await openOrm(dialect, prefix, url);
  const outbox = new MikroOrmOutboxStore({ orm, tablePrefix: prefix });
  const inbox = new MikroOrmInboxStore({ orm, tablePrefix: prefix });
  return {
    orm,
    outbox,
    inbox,
    schema: courierSchemaAdmin({ orm, tablePrefix: prefix }),
    async close() {
      await outbox.close();
      await inbox.close();
      await orm.close();
    },
  };
}

/**
 * A RabbitMQ transport whose names start with `prefix`, with the consumers' `queueLimits`
 * (message TTL, max length) when given: the test and its binary's config must pass the same
 * ones, as a user's app and courier.config.ts do.
 */
export async function openTransport(prefix: string, queueLimits?: RabbitMqTransportConfig['queueLimits']): Promise<RabbitMqTransport> {
  // Imported on demand: the CLI's child processes that need no broker skip loading amqplib.
  const { RabbitMqTransport: Transport } = await import('@courier/rabbitmq');
  return new Transport({ connection: AMQP_URL, prefix, connectTimeoutMs: 3_000, ...(queueLimits ? { queueLimits } : {}) });
}

/** The `queueLimits` a test hands to its binary's config: JSON in CLI_TEST_QUEUE_LIMITS, none when unset. */
export function queueLimitsFromEnv(): RabbitMqTransportConfig['queueLimits'] {
  const text = process.env['CLI_TEST_QUEUE_LIMITS'];
  return text ? (JSON.parse(text) as RabbitMqTransportConfig['queueLimits']) : undefined;
}

/**
 * Deletes the queues {@link openTransport}'s transport declared for `consumers` (each consumer's
 * queue, dead-letter queue and retry tiers) and the prefix's topic exchange. The broker keeps
 * durable queues forever otherwise: hundreds left by earlier runs made a RabbitMQ restart test
 * time out in `rabbitmqctl start_app`.
 */
export async function deleteBrokerObjects(prefix: string, consumers: readonly string[]): Promise<void> {
  const [{ connect }, { rabbitMqNames }] = await Promise.all([import('amqplib'), import('@courier/rabbitmq')]);
  const connection = await connect(AMQP_URL);
  try {
    const channel = await connection.createChannel();
    for (const consumer of consumers) {
      const names = rabbitMqNames(prefix, consumer);
      for (const queue of [names.queue, names.deadLetterQueue, ...names.retryQueues.map((tier) => tier.name)]) await channel.deleteQueue(queue);
    }
    await channel.deleteExchange(`${prefix}.topics`);
    await channel.close();
  } finally {
    await connection.close();
  }
}
