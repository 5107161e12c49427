// The shipped alert rules and Grafana dashboard (docs/alerts/) work as written: promtool
// checks the rules and runs their unit tests, and every metric the rules and the dashboard
// query exists in the /metrics of a process served by serveCourierMetrics (the consumer-side
// helper: a consumer-only process with its own relay, on the in-memory stores and broker).
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { createBus, defineMessage, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, UnrecoverableError, type InMemoryTransaction } from '@courier/core';
import { eventually, makeEnvelope } from '@courier/conformance';
import { beforeAll, describe, expect, it } from 'vitest';
import { serveCourierMetrics } from '../src/index.js';

const run = promisify(execFile);
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const ALERTS = join(ROOT, 'docs', 'alerts');

describe('alert rules and dashboard', () => {
  let promtool: string;
  beforeAll(async () => {
    // Fetched once into ~/.cache/courier/prometheus (Debian's prometheus package); fails loudly when it cannot.
    promtool = (await run('bash', [join(ROOT, 'scripts', 'promtool.sh'), 'path'], { timeout: 300_000 })).stdout.trim();
  }, 300_000);

  it('promtool check rules and promtool test rules pass', async () => {
    const checked = await run(promtool, ['check', 'rules', 'courier.rules.yml'], { cwd: ALERTS });
    expect(checked.stdout).toContain('SUCCESS: 14 rules found');
    const tested = await run(promtool, ['test', 'rules', 'courier.rules.test.yml'], { cwd: ALERTS });
    expect(tested.stdout).toContain('SUCCESS');
  });

  it('the rules never apply increase() or rate() to a gauge', () => {
    const rules = readFileSync(join(ALERTS, 'courier.rules.yml'), 'utf8');
    for (const [, metric] of rules.matchAll(/(?:increase|rate|irate)\(\s*([a-z_]+)/g)) expect(metric, `${metric} read as a counter`).toMatch(/_total$|_bucket$|_sum$|_count$/);
  });

  it('every metric the rules and the dashboard query exists in /metrics of a process served by serveCourierMetrics', { timeout: 120_000 }, async () => {
    const server = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0, serviceName: 'billing-service' });
    try {
      const db = new InMemoryDatabase();
      const outbox = new InMemoryOutboxStore({ database: db });
      const inbox = new InMemoryInboxStore({ database: db });
      const broker = new InMemoryBroker();
      const transport = broker.connect();
      const bus = createBus<InMemoryTransaction>({
        outbox,
        inbox,
        transport,
        retry: { maxAttempts: 1 },
        relay: { pollIntervalMs: 20, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1, jitter: 0 } },
      });
      const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' });
      bus.subscribe('billing', Placed, async (message) => {
        if ((message.payload as { poison?: boolean }).poison) throw new UnrecoverableError('poison');
      });
      server.watch({ bus, outbox, inbox, deadLetters: { deadLetters: transport.deadLetters!, consumers: ['billing'] } });
      broker.failPublish((envelope) => envelope.payload.includes('"unroutable"'));
      await inbox.halt('billing', 'orders', 'k', makeEnvelope({ topic: 'orders', key: 'k' }), 'HandlerError [HANDLER_FAILED]: boom');
      await bus.start();
      await db.transaction(async (tx) => {
        bus.outbox(tx).publish(Placed, { ok: true });
        bus.outbox(tx).publish(Placed, { poison: true });
        bus.outbox(tx).publish(Placed, { unroutable: true });
      });
      await eventually(() => expect(bus.health().counters).toMatchObject({ processed: 1, deadLettered: 2 }), { timeoutMs: 30_000 });
      const scraped = await (await fetch(`http://127.0.0.1:${server.address.port}/metrics`)).text();
      const health = await fetch(`http://127.0.0.1:${server.address.port}/health`);
      expect(health.status).toBe(200);
      expect(scraped).toMatch(/^target_info\{[^}]*service_name="billing-service"/m);

      const queried = new Set<string>();
      // Metric names only: label names in by (...) and selectors in {...} are left out.
      const namesIn = (expr: string) => expr.replace(/\b(?:by|without)\s*\([^)]*\)/g, '').replace(/\{[^}]*\}/g, '').matchAll(/\b(?:courier|messaging)_[a-z_]+/g);
      const rules = readFileSync(join(ALERTS, 'courier.rules.yml'), 'utf8');
      for (const [, expr] of rules.matchAll(/^\s+expr: (.+)$/gm)) for (const [name] of namesIn(expr!)) queried.add(name);
      const dashboard = JSON.parse(readFileSync(join(ALERTS, 'courier.dashboard.json'), 'utf8')) as { panels: { targets: { expr: string }[] }[] };
      for (const panel of dashboard.panels) for (const target of panel.targets) for (const [name] of namesIn(target.expr)) queried.add(name);
      expect(queried.size).toBeGreaterThan(20);
      // Exported only for an outbox that tails a PostgreSQL replication slot (@courier/pg-logical),
      // which the in-memory process here has not: cli-log-slot.test.ts finds them in /metrics.
      const logSlotOnly = new Set(['courier_outbox_log_slot_lag_bytes', 'courier_outbox_log_slot_unacknowledged_age_seconds']);
      const missing = [...queried].filter((name) => !logSlotOnly.has(name) && !new RegExp(`^${name}(\\{| )`, 'm').test(scraped));
      expect(missing, `queried but not in /metrics:\n${scraped}`).toEqual([]);
      await bus.stop();
    } finally {
      await server.close();
    }
  });
});
