// The console's Overview shows each configured consumer's lag at the broker, read as
// `courier stats` reads it (Transport.consumerLag; RabbitMQ: the queue's ready messages):
// the compiled `courier console` over PostgreSQL stores and RabbitMQ, in Chromium.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { eventually, makeEnvelope } from '@courier/conformance';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ARTIFACTS, launchChromium } from './support/browser.js';
import { startConsole, type RunningConsole } from './support/console.js';
import { deleteBrokerObjects, openStores, openTransport, type CliTestSetup } from './support/setup.js';

describe('courier console: consumer lag at the broker', () => {
  const prefix = `conl${randomBytes(4).toString('hex')}_`;
  const away = `${prefix}billing`;
  const never = `${prefix}never`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: `${away},${never}` };
  let stores: CliTestSetup;
  let browser: Browser;
  let app: RunningConsole | undefined;
  const cleanup: (() => Promise<void>)[] = [];

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    browser = await launchChromium();
  });
  afterAll(async () => {
    await app?.stop();
    await browser?.close();
    for (const close of cleanup.reverse()) await close();
    for (const table of ['outbox', 'inbox', 'outbox_halts', 'inbox_halts', 'inbox_parked', 'meta']) await stores?.orm.em.getConnection().execute(`DROP TABLE IF EXISTS ${prefix}${table} CASCADE`).catch(() => undefined);
    await stores?.close();
    await deleteBrokerObjects(prefix, [away, never]);
  });

  it('shows messages waiting for a consumer that is away, and "no queue" for one that never subscribed', async () => {
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const topic = `${prefix}orders`;
    const subscription = await transport.subscribe({ consumer: away, topics: [topic], ordered: false, concurrency: 1 }, async (delivery) => delivery.ack());
    await subscription.close();
    expect((await transport.publish(Array.from({ length: 4 }, () => makeEnvelope({ topic, key: null })))).every((result) => result.ok)).toBe(true);
    await eventually(async () => expect(await transport.consumerLag(away)).toBe(4), { timeoutMs: 20_000 });

    app = await startConsole(['--interval', '1s'], env);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.setDefaultTimeout(60_000);
    await page.goto(app.url);
    const waiting = (consumer: string) => page.locator(`[data-testid="consumer-row"][data-consumer="${consumer}"]`).getByTestId('waiting');
    await expect.poll(() => waiting(away).textContent(), { timeout: 60_000 }).toBe('4');
    expect(await waiting(never).textContent()).toBe('no queue');
    await page.screenshot({ path: join(ARTIFACTS, 'overview-lag.png'), fullPage: true });
    // The page read nothing away: the four still wait.
    expect(await transport.consumerLag(away)).toBe(4);
    await page.close();
  }, 180_000);
});
