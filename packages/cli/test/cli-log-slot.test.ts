// `courier stats` on a config whose outbox is the log-tailing store (@courier/pg-logical):
// the slot is shown (reader, lag, WAL status) and, when it does not exist, said so — and
// reading creates neither the slot nor its publication (operator commands never create as a
// side effect of reading). One slot is created by the test itself and dropped after.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { PgOutboxStore } from '@courier/pg';
import { dropReplicationSlot, ensureReplicationSlot, PgLogicalOutboxStore } from '@courier/pg-logical';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { serveCourierMetrics } from '../src/index.js';
import { PACKAGE_DIR, runCli } from './support/run-cli.js';
import { PG_URL } from './support/setup.js';

const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'pg-logical.config.ts');

describe('courier stats with a log-tailing outbox (postgresql)', () => {
  const prefix = `clislot${randomBytes(4).toString('hex')}_`;
  const slot = `${prefix}logical`;
  const env = { CLI_TEST_PREFIX: prefix, CLI_TEST_SLOT: slot };
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
  pool.on('error', () => undefined);
  const outbox = new PgOutboxStore({ pool, tablePrefix: prefix });
  afterAll(async () => {
    await dropReplicationSlot(pool, slot, { publication: `${slot}_pub` }).catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${prefix}outbox" CASCADE`).catch(() => undefined);
    await outbox.close();
    await pool.end();
  });
  const exists = async () => ({
    slot: (await pool.query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1', [slot])).rowCount,
    publication: (await pool.query('SELECT 1 FROM pg_publication WHERE pubname = $1', [`${slot}_pub`])).rowCount,
  });

  it('says the slot does not exist and creates nothing; once it exists, shows it unread with its lag and WAL status', { timeout: 120_000 }, async () => {
    await outbox.ensureSchema();

    const missing = await runCli(['stats', '--json'], env, 60_000, CONFIG);
    expect(missing.code, missing.stderr).toBe(0);
    expect(JSON.parse(missing.stdout)).toMatchObject({ outbox: { pending: 0 }, logSlot: { slot, exists: false, active: false, lagBytes: 0 }, unavailable: [] });
    const text = await runCli(['stats'], env, 60_000, CONFIG);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain(`slot '${slot}' does not exist on the server`);
    expect(await exists()).toEqual({ slot: 0, publication: 0 });

    // A slot left behind by a relay that stopped: nobody reads it, and WAL written since is held for it.
    await ensureReplicationSlot(pool, { slot, publication: `${slot}_pub`, table: `"${prefix}outbox"` });
    await pool.query("SELECT pg_logical_emit_message(false, 'courier-cli-test', repeat('x', 4096))");
    const present = await runCli(['stats', '--json'], env, 60_000, CONFIG);
    expect(present.code, present.stderr).toBe(0);
    const shown = (JSON.parse(present.stdout) as { logSlot: Record<string, unknown> }).logSlot;
    expect(shown).toMatchObject({ slot, exists: true, active: false, activePid: null, walStatus: 'reserved' });
    expect(shown['lagBytes']).toBeGreaterThan(0);
    const table = await runCli(['stats'], env, 60_000, CONFIG);
    expect(table.stdout).toMatch(new RegExp(`log-tail slot\\n[^\\n]*SLOT[^\\n]*READER[^\\n]*LAG[^\\n]*\\n${slot}\\s+none\\s+\\d`));
  });

  // Runs after the first case: the slot exists, unread, holding the WAL written since.
  it('the metrics endpoint exports the slot lag in bytes and the unacknowledged age, and nothing for a missing slot', { timeout: 60_000 }, async () => {
    const server = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0 });
    const connection = { connectionString: PG_URL };
    const store = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix: prefix }), connection, slot, tables: { tablePrefix: prefix } });
    const missingSlot = `${prefix}missing`;
    const missing = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix: prefix }), connection, slot: missingSlot, tables: { tablePrefix: prefix } });
    try {
      server.watch({ outbox: store });
      server.watch({ outbox: missing });
      await pool.query("SELECT pg_logical_emit_message(false, 'courier-cli-test', repeat('x', 4096))");
      const scraped = await (await fetch(`http://127.0.0.1:${server.address.port}/metrics`)).text();
      const lag = new RegExp(`^courier_outbox_log_slot_lag_bytes\\{[^}]*courier_log_slot="${slot}"[^}]*\\} (\\d+)`, 'm').exec(scraped);
      expect(lag, scraped).not.toBeNull();
      expect(Number(lag![1])).toBeGreaterThan(4096);
      expect(scraped).toMatch(new RegExp(`^courier_outbox_log_slot_unacknowledged_age_seconds\\{[^}]*courier_log_slot="${slot}"[^}]*\\} 0$`, 'm'));
      expect(scraped).not.toContain(missingSlot);
      expect((await pool.query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1', [missingSlot])).rowCount).toBe(0);
    } finally {
      await server.close();
      // Ends each store's own small pool; the wrapped PgOutboxStore leaves the test's pool to afterAll.
      await store.close();
      await missing.close();
    }
  });
});
