// A courier.config.ts built on @courier/pg (node-postgres), as a service that uses `pg`
// directly writes it: no ORM anywhere, so the CLI is shown to take any adapter. The test's
// table prefix, broker prefix and consumers come from env vars, as in courier.config.ts.
import { defineCourierConfig } from '@courier/cli';
import { PgInboxStore, PgOutboxStore } from '@courier/pg';
import { RabbitMqTransport } from '@courier/rabbitmq';
import pg from 'pg';

const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
const AMQP_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';

export default defineCourierConfig(() => {
  const tablePrefix = process.env['CLI_TEST_PREFIX'] ?? 'cli_';
  const brokerPrefix = process.env['CLI_TEST_BROKER_PREFIX'];
  const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
  const outbox = new PgOutboxStore({ pool, tablePrefix });
  const inbox = new PgInboxStore({ pool, tablePrefix });
  const openTransport = () => new RabbitMqTransport({ connection: AMQP_URL, prefix: brokerPrefix!, connectTimeoutMs: 3_000 });
  const transport = brokerPrefix ? openTransport() : undefined;
  return {
    outbox,
    inbox,
    ...(transport ? { transport, consumers: (process.env['CLI_TEST_CONSUMERS'] ?? '').split(',').filter(Boolean) } : {}),
    relay: () => {
      if (!brokerPrefix) throw new Error('CLI_TEST_BROKER_PREFIX is not set');
      return { outbox, transport: openTransport(), relay: { batchSize: 50, pollIntervalMs: 200 } };
    },
    async close() {
      await transport?.close();
      await outbox.close();
      await inbox.close();
      await pool.end();
    },
  };
});
