// A courier.config.ts whose outbox is the log-tailing store (@courier/pg-logical) around a
// @courier/pg outbox: `courier stats` finds the slot through the store's optional members.
// The table prefix, the slot and the broker prefix (for `courier relay`) come from env vars set by the test.
import { defineCourierConfig } from '@courier/cli';
import { PgOutboxStore } from '@courier/pg';
import { PgLogicalOutboxStore } from '@courier/pg-logical';
import { RabbitMqTransport } from '@courier/rabbitmq';
import pg from 'pg';

const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
const AMQP_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';

export default defineCourierConfig(() => {
  const tablePrefix = process.env['CLI_TEST_PREFIX'] ?? 'cli_';
  const slot = process.env['CLI_TEST_SLOT'] ?? 'cli_slot';
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
  const outbox = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix }), connection: { connectionString: PG_URL }, slot, tables: { tablePrefix } });
  const brokerPrefix = process.env['CLI_TEST_BROKER_PREFIX'];
  return {
    outbox,
    // The relay's own store on the same slot: another instance than the operator one above,
    // as a config whose relay builds its wiring afresh has.
    relay: () => {
      if (!brokerPrefix) throw new Error('CLI_TEST_BROKER_PREFIX is not set');
      const relayOutbox = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix }), connection: { connectionString: PG_URL }, slot, tables: { tablePrefix } });
      return { outbox: relayOutbox, transport: new RabbitMqTransport({ connection: AMQP_URL, prefix: brokerPrefix, connectTimeoutMs: 3_000 }), relay: { batchSize: 50, pollIntervalMs: 200 } };
    },
    async close() {
      await outbox.close();
      await pool.end();
    },
  };
});
