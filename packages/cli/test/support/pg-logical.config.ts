// A courier.config.ts whose outbox is the log-tailing store (@courier/pg-logical) around a
// @courier/pg outbox: `courier stats` finds the slot through the store's optional members.
// The table prefix and the slot come from env vars set by the test.
import { defineCourierConfig } from '@courier/cli';
import { PgOutboxStore } from '@courier/pg';
import { PgLogicalOutboxStore } from '@courier/pg-logical';
import pg from 'pg';

const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';

export default defineCourierConfig(() => {
  const tablePrefix = process.env['CLI_TEST_PREFIX'] ?? 'cli_';
  const slot = process.env['CLI_TEST_SLOT'] ?? 'cli_slot';
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
  const outbox = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix }), connection: { connectionString: PG_URL }, slot, tables: { tablePrefix } });
  return {
    outbox,
    async close() {
      await outbox.close();
      await pool.end();
    },
  };
});
