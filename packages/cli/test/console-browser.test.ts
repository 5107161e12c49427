// The operator console in a real browser (Debian's Chromium through playwright-core), served
// by the compiled `courier console` over PostgreSQL: poison messages shown grouped under one
// error, the group retried from the page after a confirmation that says how many, nothing
// replayed twice (counts checked in the database, a second page's retry changes nothing),
// a halted key resumed from the page, the overview's numbers and chart moving while messages
// are written, and the token enforced (read-only without it). Screenshots of every page go
// to packages/cli/artifacts/console/ (gitignored).
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import type { Browser, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ARTIFACTS, launchChromium } from './support/browser.js';
import { startConsole, type RunningConsole } from './support/console.js';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

const LEASE = { leaseMs: 60_000, perKey: 1 } as const;
const TOKEN = `tok-${randomBytes(8).toString('hex')}`;

describe('courier console in Chromium on PostgreSQL', () => {
  const prefix = `conb${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `orders${prefix}`;
  let stores: CliTestSetup;
  let browser: Browser;
  let app: RunningConsole | undefined;
  const envelope = (key: string | null, overrides: Partial<Envelope> = {}): Envelope => makeEnvelope({ topic, key, type: 'orders.OrderPlaced', ...overrides });
  const append = (envelopes: readonly Envelope[]) =>
    stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, envelopes.map((item) => ({ envelope: item })));
    });
  const sql = async <T>(text: string): Promise<T[]> => (await stores.orm.em.fork().getConnection().execute(text)) as T[];
  const shot = (page: Page, name: string) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    browser = await launchChromium();
  });
  afterAll(async () => {
    await app?.stop();
    await browser?.close();
    for (const table of ['outbox', 'inbox', 'outbox_halts', 'inbox_halts', 'inbox_parked', 'meta']) await sql(`DROP TABLE IF EXISTS ${prefix}${table} CASCADE`).catch(() => undefined);
    await stores?.close();
  });

  it('groups poison messages, retries a group once, resumes a halted key, charts move, token enforced', async () => {
    // Five poison orders failing the same way (the order number differs: one group after
    // normalisation), one failing otherwise, and a key halted behind a poison head.
    const poison = Array.from({ length: 5 }, (_, index) => envelope(`order-${index}`, { payload: JSON.stringify({ orderId: `order-${index}`, total: -1 }) }));
    const other = envelope('order-x', { type: 'orders.Legacy' });
    const head = envelope('customer-7');
    await append([...poison, other, head]);
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    const seqOf = (item: Envelope) => batch.records.find((record) => record.envelope.messageId === item.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [
      ...poison.map((item, index) => ({ sequence: seqOf(item), error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for order ${4711 + index}`, outcome: 'dead' as const })),
      { sequence: seqOf(other), error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'dead' },
      { sequence: seqOf(head), error: 'TransportError [PUBLISH_REJECTED]: the broker refused the head', outcome: 'halt' },
    ]);
    await append([envelope('customer-7'), envelope('customer-7')]);

    app = await startConsole(['--token', TOKEN, '--interval', '1s'], env);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.setDefaultTimeout(60_000);

    // Overview: the numbers, red where an alert fires, and a chart that moves as rows arrive.
    await page.goto(app.url);
    await expect.poll(() => page.getByTestId('outbox-dead').locator('.value').textContent(), { timeout: 60_000 }).toBe('6');
    expect(await page.getByTestId('outbox-dead').getAttribute('class')).toContain('alert');
    expect(await page.getByTestId('outbox-halted').locator('.value').textContent()).toBe('1');
    const pendingBefore = Number(await page.getByTestId('outbox-pending').locator('.value').textContent());
    const pointsBefore = Number((await page.getByTestId('chart-backlog').locator('canvas').getAttribute('data-points')) ?? 0);
    await append(Array.from({ length: 10 }, () => envelope(null)));
    await expect.poll(async () => Number(await page.getByTestId('outbox-pending').locator('.value').textContent()), { timeout: 60_000 }).toBe(pendingBefore + 10);
    await expect.poll(async () => Number(await page.getByTestId('chart-backlog').locator('canvas').getAttribute('data-points')), { timeout: 60_000 }).toBeGreaterThan(pointsBefore);
    await shot(page, 'overview');

    // Failed messages: the five poison orders under one error.
    await page.goto(`${app.url}#/failed`);
    const group = page.locator('[data-testid="group"][data-count="5"]');
    await group.waitFor();
    expect(await page.getByTestId('group').count()).toBe(2);
    expect(await group.getByTestId('group-error').textContent()).toContain('no queue bound for order');
    await shot(page, 'failed');

    // Every failed message a page at a time: GET /api/dead, the keyset pages of `courier dead
    // list` — the same messages in the same order, "N of M shown" with the CLI's count.
    const cli = await runCli(['dead', 'list', '--json'], env);
    expect(cli.code, cli.stderr).toBe(0);
    const cliRefs = (JSON.parse(cli.stdout) as { ref: string }[]).map((item) => item.ref);
    expect(cliRefs.length).toBeGreaterThan(5);
    await page.getByTestId('view-all').click();
    await page.getByTestId('dead-page').waitFor();
    await page.getByTestId('page-size').selectOption('5');
    await expect.poll(() => page.getByTestId('dead-item').count()).toBe(5);
    await expect.poll(() => page.getByTestId('shown').textContent()).toBe(`5 of ${cliRefs.length} shown; more follow`);
    const refsShown = () => page.getByTestId('dead-item').evaluateAll((rows) => rows.map((row) => row.getAttribute('data-ref') ?? ''));
    const firstPage = await refsShown();
    await shot(page, 'failed-all');
    await page.getByTestId('next-page').click();
    await expect.poll(() => page.getByTestId('shown').textContent()).toBe(`${cliRefs.length} of ${cliRefs.length} shown`);
    expect([...firstPage, ...(await refsShown())]).toEqual(cliRefs);
    expect(await page.getByTestId('next-page').isDisabled()).toBe(true);
    await page.getByTestId('first-page').click();
    await expect.poll(refsShown).toEqual(firstPage);
    await page.getByTestId('view-groups').click();
    await page.locator('[data-testid="group"][data-count="5"]').waitFor();

    // One message in full.
    await group.getByText('Show messages').click();
    await group.locator('a', { hasText: `outbox:${seqOf(poison[0]!)}` }).click();
    await page.getByTestId('payload').waitFor();
    expect(await page.getByTestId('payload').textContent()).toContain('"total": -1');
    await shot(page, 'message');

    // Retry the group: the confirmation says what and how many, then it runs once.
    await page.goto(`${app.url}#/failed`);
    await page.getByTestId('operator').fill('alice');
    await page.getByTestId('token').fill(TOKEN);
    // A second page, opened before the retry, will try the same group afterwards.
    const second = await browser.newPage();
    await second.goto(`${app.url}#/failed`);
    await second.getByTestId('operator').fill('bob');
    await second.getByTestId('token').fill(TOKEN);
    await second.locator('[data-testid="group"][data-count="5"]').waitFor();

    await page.locator('[data-testid="group"][data-count="5"]').getByTestId('retry-group').click();
    await page.getByTestId('confirm').waitFor();
    expect(await page.getByTestId('confirm-detail').textContent()).toContain('these 5 message(s)');
    expect(await page.getByTestId('confirm').locator('tbody tr').count()).toBe(5);
    await shot(page, 'retry-confirm');
    await page.getByTestId('confirm-run').click();
    await expect.poll(() => page.getByTestId('flash').textContent()).toContain('replayed 5 of 5');
    await second.locator('[data-testid="group"][data-count="5"]').getByTestId('retry-group').click();
    await second.getByTestId('confirm-run').click();
    await expect.poll(() => second.getByTestId('flash').textContent()).toContain('replayed 0 of 5; 5 had already changed');

    // In the database: each poison order is one row, pending again, with its original id.
    const ids = poison.map((item) => `'${item.messageId}'`).join(', ');
    const rows = await sql<{ message_id: string; published_at: unknown; dead: unknown }>(`SELECT message_id, published_at FROM ${prefix}outbox WHERE message_id IN (${ids})`);
    expect(rows).toHaveLength(5);
    expect(await stores.outbox.stats()).toMatchObject({ dead: 1, haltedKeys: 1 });
    expect(app.stdout()).toMatch(/"operator":"alice".*"action":"replay"/);
    expect(app.stdout()).toMatch(/"operator":"bob".*"action":"replay".*"alreadyChanged":5/);

    // Halted keys: resume the key from the page.
    await page.goto(`${app.url}#/halted`);
    const key = page.locator('[data-testid="halted-key"][data-key="customer-7"]');
    await key.waitFor();
    expect(await key.textContent()).toContain('the broker refused the head');
    await shot(page, 'halted');
    await key.getByTestId('resume-retry').click();
    await page.getByTestId('confirm-run').click();
    await expect.poll(() => page.getByTestId('flash').textContent()).toContain('resumed outbox');
    await page.getByTestId('no-halted').waitFor();
    expect(await stores.outbox.stats()).toMatchObject({ haltedKeys: 0 });

    // The token is enforced: a wrong one is refused and changes nothing.
    await page.goto(`${app.url}#/failed`);
    await page.getByTestId('token').fill('not-the-token');
    await page.locator('[data-testid="group"][data-count="1"]').getByTestId('purge-group').click();
    await page.getByTestId('confirm-run').click();
    await expect.poll(() => page.getByTestId('confirm-error').textContent()).toContain('a valid operator token is required');
    expect(await stores.outbox.stats()).toMatchObject({ dead: 1 });
    await second.close();
    await page.close();
    await app.stop();

    // Without a token the console is read-only: the actions are disabled and say why.
    app = await startConsole([], env);
    const readOnly = await browser.newPage({ viewport: { width: 1280, height: 700 } });
    await readOnly.goto(`${app.url}#/failed`);
    await readOnly.getByTestId('mode').waitFor();
    expect(await readOnly.getByTestId('mode').textContent()).toContain('read-only');
    expect(await readOnly.locator('[data-testid="group"]').first().getByTestId('retry-group').isDisabled()).toBe(true);
    await shot(readOnly, 'read-only');
    await readOnly.close();
  });
});
