// The console's live rates, latencies and process list in Chromium, and named tokens:
// `courier console --tokens-file` (the compiled binary, PostgreSQL config) reading a real
// serveCourierMetrics endpoint (an in-memory bus relaying and handling, one topic whose
// publishes fail) and an endpoint that does not answer. The page reads nothing without a
// token, shows whose it holds, charts the rates as they move, turns the publish-failure
// number red (CourierPublishFailing would fire), lists the processes alive and dead; a
// viewer's token cannot act, an operator's can and the audit line names the token's holder
// whatever the page claims. About 25 s.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBus, defineMessage, type Bus, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, type InMemoryTransaction } from '@courier/core';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serveCourierMetrics, type CourierMetricsServer } from '../src/index.js';
import { ARTIFACTS, launchChromium } from './support/browser.js';
import { startConsole, type RunningConsole } from './support/console.js';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

const ALICE = `alice-${randomBytes(8).toString('hex')}`;
const VICTOR = `victor-${randomBytes(8).toString('hex')}`;

describe('courier console: rates, processes and named tokens', () => {
  const prefix = `conp${randomBytes(4).toString('hex')}_`;
  let stores: CliTestSetup;
  let browser: Browser;
  let metrics: CourierMetricsServer;
  let app: RunningConsole | undefined;
  const db = new InMemoryDatabase();
  const broker = new InMemoryBroker();
  // Created after serveCourierMetrics (beforeAll): a bus takes its instruments from the global meter provider when created.
  let bus: Bus<InMemoryTransaction>;
  const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' });
  const Refused = defineMessage('audit.Logged', { version: 1, topic: 'audit' });
  const Slow = defineMessage('slow.Sent', { version: 1, topic: 'slow' });
  let openSlowGate!: () => void;
  const slowGate = new Promise<void>((resolve) => (openSlowGate = resolve));
  const publish = (count: number) =>
    db.transaction(async (tx) => {
      for (let index = 0; index < count; index += 1) bus.outbox(tx).publish(Placed, { index });
    });

  beforeAll(async () => {
    metrics = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0, token: 'metrics-token-1234', serviceName: 'billing' });
    const connection = broker.connect();
    // Sends to 'slow' wait for the test (the page must show the lease the relay holds meanwhile).
    const transport = new Proxy(connection, {
      get(target, name) {
        if (name === 'publish') {
          return async (messages: Parameters<typeof connection.publish>[0], options: Parameters<typeof connection.publish>[1]) => {
            if (messages.some((message) => message.topic === 'slow')) await slowGate;
            return connection.publish(messages, options);
          };
        }
        // The connection itself as the receiver: its getters read private fields.
        const value: unknown = Reflect.get(target, name, target);
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
    bus = createBus<InMemoryTransaction>({
      outbox: new InMemoryOutboxStore({ database: db }),
      inbox: new InMemoryInboxStore({ database: db }),
      transport,
      relay: { pollIntervalMs: 20, owner: 'billing-relay', retry: { maxAttempts: 1_000_000, initialDelayMs: 50, maxDelayMs: 100 } },
    });
    bus.subscribe('billing', Placed, async () => undefined);
    metrics.watch({ bus });
    broker.failPublish((envelope) => envelope.topic === 'audit');
    await bus.start();
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    browser = await launchChromium();
  });
  afterAll(async () => {
    await app?.stop();
    await browser?.close();
    openSlowGate?.();
    await bus?.stop();
    await metrics?.close();
    for (const table of ['outbox', 'outbox_halts', 'meta']) await stores?.orm.em.getConnection().execute(`DROP TABLE IF EXISTS ${prefix}${table} CASCADE`).catch(() => undefined);
    await stores?.close();
  });

  it('tokens file errors name the line', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'courier-tokens-'));
    const file = join(dir, 'tokens');
    writeFileSync(file, `# who may do what\nalice operator ${ALICE}\nbob admin ${VICTOR}\n`);
    const bad = await runCli(['console', '--port', '0', '--tokens-file', file], { CLI_TEST_PREFIX: prefix });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/line 3: role 'admin' is neither 'viewer' nor 'operator'/);
  });

  it('charts rates, shows red where an alert fires, lists processes alive and dead; viewer reads, operator acts, audit names the holder', { timeout: 180_000 }, async () => {
    const free = createServer();
    await new Promise<void>((resolve) => free.listen(0, '127.0.0.1', resolve));
    const deadPort = (free.address() as { port: number }).port;
    await new Promise<void>((resolve) => free.close(() => resolve()));
    const dir = mkdtempSync(join(tmpdir(), 'courier-tokens-'));
    const file = join(dir, 'tokens');
    writeFileSync(file, `alice operator ${ALICE}\nvictor viewer ${VICTOR}\n`);
    const endpoints = [{ url: `http://127.0.0.1:${metrics.address.port}`, name: 'billing', token: 'metrics-token-1234' }, { url: `http://127.0.0.1:${deadPort}`, name: 'gone' }];
    app = await startConsole(['--tokens-file', file, '--interval', '500ms'], { CLI_TEST_PREFIX: prefix, CLI_TEST_METRICS: JSON.stringify(endpoints) });

    // Reads need a token too.
    expect((await fetch(new URL('api/stats', app.url))).status).toBe(401);
    const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
    await page.goto(app.url);
    await page.getByTestId('you').getByText('no valid token').waitFor();
    await page.getByText(/could not read the stats: a valid token is required/).waitFor({ timeout: 30_000 });
    await page.getByTestId('token').fill(VICTOR);
    await page.getByTestId('you').getByText('victor (viewer)').waitFor({ timeout: 30_000 });

    // Rates move as messages flow; the publish failures turn red once a publish fails.
    const flow = setInterval(() => void publish(5), 250);
    try {
    await page.getByTestId('chart-rates').waitFor({ timeout: 60_000 });
    const points = async () => Number((await page.getByTestId('chart-rates').locator('canvas').getAttribute('data-points')) ?? 0);
    const before = await points();
    await expect.poll(async () => Number(await page.getByTestId('rate-handled').locator('.value').textContent()), { timeout: 60_000, interval: 300 }).toBeGreaterThan(0);
    await expect.poll(points, { timeout: 60_000 }).toBeGreaterThan(before);
    expect(await page.getByTestId('rate-failures').getAttribute('class')).not.toMatch(/alert/);
    await db.transaction(async (tx) => {
      bus.outbox(tx).publish(Refused, { refused: true });
    });
    await expect.poll(async () => page.getByTestId('rate-failures').getAttribute('class'), { timeout: 60_000 }).toMatch(/alert/);
    await page.getByTestId('p99-confirm').waitFor();
    // Publish → handler: five messages whose occurredAt is 3 minutes back make a window's p99
    // minutes long (the tile reads the worst window of the last minute); the latency chart has the series.
    await db.transaction(async (tx) => {
      for (let index = 0; index < 5; index += 1) bus.outbox(tx).publish(Placed, { late: index }, { occurredAt: new Date(Date.now() - 180_000) });
    });
    await expect.poll(async () => page.getByTestId('p99-publish-handler').locator('.value').textContent(), { timeout: 60_000, interval: 300 }).toMatch(/^\d+ min$/);
    expect(await page.getByTestId('chart-latency').locator('canvas').getAttribute('data-series')).toContain('publish → handler');
    await page.screenshot({ path: join(ARTIFACTS, 'overview-rates.png'), fullPage: true });
    } finally {
      clearInterval(flow);
    }

    // Relays and consumers: the live process with its relay and consumer, the dead one in red.
    await page.goto(`${app.url}#/processes`);
    const billing = page.getByTestId('process-billing');
    await billing.getByText('alive').waitFor({ timeout: 30_000 });
    await billing.getByText('billing: connected').waitFor();
    await billing.getByText(/running; last claim/).waitFor();
    // Which lease the relay holds: its owner, and the lease of the batch it is sending (a
    // send to 'slow' waits for the test), gone once the send is answered.
    expect(await billing.getByTestId('relay-owner').textContent()).toContain('claims as billing-relay');
    await billing.getByTestId('relay-leases').getByText('holds no lease').waitFor();
    await db.transaction(async (tx) => {
      bus.outbox(tx).publish(Slow, { slow: true });
    });
    const lease = billing.getByTestId('relay-lease');
    await lease.waitFor({ timeout: 30_000 });
    expect(await lease.textContent()).toMatch(/^holds lease \d+: 1 row\(s\) for /);
    const metricsText = await runCli(['metrics', '--window', '1s'], { CLI_TEST_PREFIX: prefix, CLI_TEST_METRICS: JSON.stringify(endpoints.slice(0, 1)) });
    expect(metricsText.stdout, metricsText.stderr).toMatch(/claims as billing-relay; holds lease \d+ \(1 row, \d+ ms\)/);
    const gone = page.getByTestId('process-gone');
    await gone.getByText('NOT ANSWERING').waitFor();
    expect(await gone.getByTestId('alive').getAttribute('class')).toBe('alert');
    await gone.getByText('never').waitFor();
    await page.screenshot({ path: join(ARTIFACTS, 'processes.png'), fullPage: true });
    openSlowGate();
    await billing.getByTestId('relay-leases').getByText('holds no lease').waitFor({ timeout: 30_000 });

    // A viewer's token reads, never acts: the buttons are disabled and the server refuses it.
    const act = (token: string) =>
      fetch(new URL('api/dead/purge', app!.url), {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}`, 'x-courier-operator': 'mallory' },
        body: JSON.stringify({ refs: ['outbox:999999999'] }),
      });
    const refused = await act(VICTOR);
    expect(refused.status).toBe(403);
    expect(((await refused.json()) as { error: string }).error).toMatch(/'victor' is a viewer's/);
    const done = await act(ALICE);
    expect(done.status, await done.clone().text()).toBe(200);
    expect(await done.json()).toMatchObject({ requested: 1, alreadyChanged: 1 });
    const audit = app.stdout().trim().split('\n').map((line) => JSON.parse(line) as { operator: string; action: string; outcome: Record<string, unknown> });
    // The holder of the token, never the name the request claims.
    expect(audit.map((line) => [line.operator, line.action, 'refused' in line.outcome])).toEqual([
      ['victor', 'purge', true],
      ['alice', 'purge', false],
    ]);
    await page.close();
  });
});
