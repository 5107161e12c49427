// A courier.config.ts whose only part is one of the transports that read their consumers' lag
// beyond RabbitMQ: Kafka, Redis Streams or the SQL transport on PostgreSQL, chosen by
// CLI_TEST_LAG_TRANSPORT (plugins imported by path, their clients resolved from the plugin: the
// CLI package depends on none of them). Prefix and consumers come from env vars.
import { createRequire } from 'node:module';
import { defineCourierConfig } from '@courier/cli';
import type { Transport } from '@courier/core';
import { KafkaTransport, type KafkaTransportConfig } from '../../../../plugins/kafka/src/index.js';
import { RedisStreamsTransport, type RedisStreamsTransportConfig } from '../../../../plugins/redis-streams/src/index.js';
import { SqlTransport } from '../../../../plugins/sql-transport/src/index.js';

/** Which transport the config and the test build (`CLI_TEST_LAG_TRANSPORT`). */
export type LagTransportName = 'kafka' | 'redis-streams' | 'sql';

const fromPlugin = (plugin: string) => createRequire(new URL(`../../../../plugins/${plugin}/package.json`, import.meta.url));

/** A transport of `name` under `prefix`, how to close it with its client, and (for the test) how to remove what it made on the broker. */
export async function openLagTransport(name: LagTransportName, prefix: string): Promise<{ transport: Transport; close(): Promise<void>; drop(): Promise<void> }> {
  switch (name) {
    case 'kafka': {
      process.env['KAFKAJS_NO_PARTITIONER_WARNING'] = '1';
      const { Kafka, logLevel } = fromPlugin('kafka')('kafkajs') as {
        Kafka: new (config: { clientId: string; brokers: string[]; logLevel: number }) => KafkaTransportConfig['client'];
        logLevel: { NOTHING: number };
      };
      const client = new Kafka({ clientId: prefix, brokers: (process.env['COURIER_KAFKA_BROKERS'] ?? '127.0.0.1:9092').split(','), logLevel: logLevel.NOTHING });
      const transport = new KafkaTransport({ client, prefix: `${prefix}.`, partitions: 2, sessionTimeoutMs: 6_000 });
      const drop = async () => {
        const admin = client.admin();
        await admin.connect();
        try {
          const groups = (await admin.listGroups()).groups.map((group) => group.groupId).filter((group) => group.startsWith(`${prefix}.`));
          if (groups.length > 0) await admin.deleteGroups(groups);
          const topics = (await admin.listTopics()).filter((topic) => topic.startsWith(`${prefix}.`));
          if (topics.length > 0) await admin.deleteTopics({ topics });
        } finally {
          await admin.disconnect();
        }
      };
      return { transport, close: () => transport.close(), drop };
    }
    case 'redis-streams': {
      const { Redis } = fromPlugin('redis-streams')('ioredis') as {
        Redis: new (url: string, options: { lazyConnect: boolean; enableOfflineQueue: boolean; maxRetriesPerRequest: number }) => Awaited<ReturnType<RedisStreamsTransportConfig['connection']>>;
      };
      const url = process.env['COURIER_REDIS_URL'] ?? 'redis://127.0.0.1:6379';
      const options = { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1 };
      const transport = new RedisStreamsTransport({ prefix, connection: () => new Redis(url, options) });
      const drop = async () => {
        const client = new Redis(url, { ...options, lazyConnect: false, enableOfflineQueue: true });
        try {
          // SCAN, never KEYS: the server is shared.
          let cursor = '0';
          do {
            const [next, keys] = (await client.call('SCAN', cursor, 'MATCH', `${prefix}:*`, 'COUNT', '500')) as [string, string[]];
            if (keys.length > 0) await client.call('UNLINK', ...keys);
            cursor = next;
          } while (cursor !== '0');
        } finally {
          client.disconnect();
        }
      };
      return { transport, close: () => transport.close(), drop };
    }
    case 'sql': {
      const { MikroORM } = fromPlugin('sql-transport')('@mikro-orm/postgresql') as typeof import('@mikro-orm/postgresql');
      // Operator reads never create a database: MikroORM's ensureDatabase is off.
      const orm = await MikroORM.init({
        clientUrl: process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test',
        entities: [],
        discovery: { warnWhenNoEntities: false },
        ensureDatabase: false,
      });
      const transport = new SqlTransport({ orm, tablePrefix: `${prefix}_` });
      return {
        transport,
        close: async () => {
          await transport.close();
          await orm.close(true);
        },
        drop: async () => {
          for (const table of ['queue', 'queue_groups']) await orm.em.getConnection().execute(`DROP TABLE IF EXISTS "${prefix}_${table}"`);
        },
      };
    }
  }
}

export default defineCourierConfig(async () => {
  const { transport, close } = await openLagTransport(process.env['CLI_TEST_LAG_TRANSPORT'] as LagTransportName, process.env['CLI_TEST_LAG_PREFIX']!);
  return {
    transport,
    consumers: (process.env['CLI_TEST_CONSUMERS'] ?? '').split(',').filter(Boolean),
    close,
  };
});
