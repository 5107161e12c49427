// The operator console on a config whose outbox tails a replication slot (@courier/pg-logical):
// `/api/stats` carries the slot as `courier stats --json` does (`logSlot`), and the Overview shows
// it in Chromium — no reader (red), the WAL it holds, its WAL status — then the reader's server
// pid once a log-tail store reads it. A slot nobody reads fills the database's disk, so the
// console's first page must show it. The slot is created and dropped by the test.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { PgOutboxStore } from '@courier/pg';
import { dropReplicationSlot, ensureReplicationSlot, PgLogicalOutboxStore } from '@courier/pg-logical';
import pg from 'pg';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ARTIFACTS, launchChromium } from './support/browser.js';
import { startConsole, type RunningConsole } from './support/console.js';
import { PACKAGE_DIR } from './support/run-cli.js';
import { PG_URL } from './support/setup.js';

const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'pg-logical.config.ts');
const TOKEN = `tok-${randomBytes(8).toString('hex')}`;

describe('courier console with a log-tailing outbox (postgresql, Chromium)', () => {
  const prefix = `conslot${randomBytes(4).toString('hex')}_`;
  const slot = `${prefix}logical`;
  const env = { CLI_TEST_PREFIX: prefix, CLI_TEST_SLOT: slot };
  const pool = new pg.Pool({ connectionString: PG_URL, max: 2 });
  pool.on('error', () => undefined);
  const outbox = new PgOutboxStore({ pool, tablePrefix: prefix });
  let browser: Browser | undefined;
  let app: RunningConsole | undefined;
  let reader: { readonly streaming: boolean; close(): Promise<void> } | undefined;

  beforeAll(async () => {
    await outbox.ensureSchema();
    browser = await launchChromium();
  });
  afterAll(async () => {
    await app?.stop();
    await browser?.close();
    await reader?.close();
    for (let attempt = 0; attempt < 50; attempt++) {
      if (await dropReplicationSlot(pool, slot, { publication: `${slot}_pub` }).then(() => true, () => false)) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await pool.query(`DROP TABLE IF EXISTS "${prefix}outbox" CASCADE`).catch(() => undefined);
    await outbox.close();
    await pool.end();
  });

  it('the API and the Overview show the slot: unread and holding WAL, then its reader', { timeout: 180_000 }, async () => {
    // A slot left behind by a relay that stopped: nobody reads it, and WAL written since is held for it.
    await ensureReplicationSlot(pool, { slot, publication: `${slot}_pub`, table: `"${prefix}outbox"` });
    await pool.query("SELECT pg_logical_emit_message(false, 'courier-console-test', repeat('x', 4096))");
    app = await startConsole(['--token', TOKEN, '--interval', '1s'], env, CONFIG);

    const response = await fetch(`${app.url}api/stats`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(response.status).toBe(200);
    const { stats } = (await response.json()) as { stats: { logSlot?: Record<string, unknown> } };
    expect(stats.logSlot).toMatchObject({ slot, exists: true, active: false, activePid: null, walStatus: 'reserved' });
    expect(stats.logSlot!['lagBytes']).toBeGreaterThan(4096);

    const page = await browser!.newPage({ viewport: { width: 1280, height: 900 } });
    page.setDefaultTimeout(60_000);
    await page.goto(app.url);
    const value = (testid: string) => page.getByTestId(testid).locator('.value').textContent();
    await expect.poll(() => value('log-slot-reader'), { timeout: 60_000 }).toBe('none');
    expect(await page.getByTestId('log-slot-reader').getAttribute('class')).toContain('alert');
    expect(await page.getByTestId('log-slot').locator('h3').textContent()).toContain(slot);
    expect(await value('log-slot-wal')).toBe('reserved');
    expect(await value('log-slot-lag')).toMatch(/^\d+(\.\d)? (B|KiB|MiB|GiB)$/);
    await page.screenshot({ path: join(ARTIFACTS, 'overview-log-slot-unread.png'), fullPage: true });

    // A log-tail relay's store starts reading the slot: the Overview names its server process.
    const store = new PgLogicalOutboxStore({ store: new PgOutboxStore({ pool, tablePrefix: prefix }), connection: { connectionString: PG_URL }, slot, tables: { tablePrefix: prefix } });
    reader = store;
    await store.watch(() => undefined);
    await expect.poll(() => store.streaming, { timeout: 60_000 }).toBe(true);
    const pid = (await pool.query<{ pid: number }>('SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1', [slot])).rows[0]!.pid;
    await expect.poll(() => value('log-slot-reader'), { timeout: 60_000 }).toBe(`server pid ${pid}`);
    expect(await page.getByTestId('log-slot-reader').getAttribute('class')).not.toContain('alert');
    await page.screenshot({ path: join(ARTIFACTS, 'overview-log-slot-read.png'), fullPage: true });
  });
});
