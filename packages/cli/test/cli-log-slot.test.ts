// `courier stats` on a config whose outbox is the log-tailing store (@courier/pg-logical):
// the slot is shown (reader, lag, WAL status) and, when it does not exist, said so — and
// reading creates neither the slot nor its publication (operator commands never create as a
// side effect of reading). One slot is created by the test itself and dropped after.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { eventually } from '@courier/conformance';
import { createBus, defineMessage } from '@courier/core';
import { PgOutboxStore, withTransaction } from '@courier/pg';
import { dropReplicationSlot, ensureReplicationSlot, PgLogicalOutboxStore } from '@courier/pg-logical';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { serveCourierMetrics } from '../src/index.js';
import { PACKAGE_DIR, runCli, startCli } from './support/run-cli.js';
import { deleteBrokerObjects, openTransport, PG_URL } from './support/setup.js';

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
      // No gauge for the missing slot; only its read-failure counter, at 0 (a missing slot is not a failed read).
      expect(scraped.split('\n').filter((line) => line.includes(missingSlot))).toEqual([
        `courier_metrics_read_failures_total{courier_log_slot="${missingSlot}",courier_metrics_source="log_slot"} 0`,
      ]);
      expect((await pool.query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1', [missingSlot])).rowCount).toBe(0);
    } finally {
      await server.close();
      // Ends each store's own small pool; the wrapped PgOutboxStore leaves the test's pool to afterAll.
      await store.close();
      await missing.close();
    }
  });

  // Runs after the cases above (the slot exists). ~5 s: one relay process, one message.
  it('courier relay reads the slot: stats shows its reader, /metrics its gauges from the relay\'s own store', { timeout: 120_000 }, async () => {
    const sinkName = `${prefix}sink`;
    const relayEnv = { ...env, CLI_TEST_BROKER_PREFIX: prefix };
    const transport = await openTransport(prefix);
    const Work = defineMessage('cli.SlotWork', { version: 1, topic: `${prefix}work` });
    const received: string[] = [];
    const subscription = await transport.subscribe({ consumer: sinkName, topics: [Work.topic], ordered: false, concurrency: 4 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    const child = startCli(['relay', '--port', '0', '--stop-timeout', '20s'], relayEnv, CONFIG);
    const logs: Record<string, unknown>[] = [];
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        logs.push(JSON.parse(line) as Record<string, unknown>);
      } catch {
        logs.push({ message: 'not json', line });
      }
    });
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    try {
      await eventually(() => expect(logs.find((entry) => entry['message'] === 'relay http listening'), JSON.stringify(logs)).toBeDefined(), { timeoutMs: 60_000 });
      const port = Number(logs.find((entry) => entry['message'] === 'relay http listening')!['port']);
      const producer = createBus({ outbox, transport });
      const id = await withTransaction(pool, (client) => producer.outbox(client).publish(Work, { n: 1 }));
      await eventually(() => expect(received).toContain(id), { timeoutMs: 60_000 });
      await eventually(async () => expect((await runCli(['stats', '--json'], env, 60_000, CONFIG)).stdout).toMatch(/"active": ?true/), { timeoutMs: 60_000 });
      const shown = (JSON.parse((await runCli(['stats', '--json'], env, 60_000, CONFIG)).stdout) as { logSlot: { active: boolean; activePid: number | null } }).logSlot;
      expect(shown.activePid).toBeGreaterThan(0);
      const scraped = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      const series = scraped.split('\n').filter((line) => line.startsWith('courier_outbox_log_slot_lag_bytes{'));
      expect(series, scraped).toEqual([expect.stringContaining(`courier_log_slot="${slot}"`)]);
      expect(scraped).toMatch(new RegExp(`^courier_outbox_log_slot_unacknowledged_age_seconds\\{[^}]*courier_log_slot="${slot}"[^}]*\\} \\d`, 'm'));
    } finally {
      child.kill('SIGTERM');
      await exited;
      await subscription.close();
      await transport.close();
      await deleteBrokerObjects(prefix, [sinkName]).catch(() => undefined);
    }
  });
});
