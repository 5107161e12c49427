// The reader behind `courier metrics` and the console's charts and process list, against
// a real serveCourierMetrics endpoint (an in-memory bus relaying and handling): exact
// counts between two reads, a latency quantile, a token-guarded endpoint, a dead one, and
// the command itself through the compiled binary. About 3 s.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { createBus, defineMessage, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, UnrecoverableError, type InMemoryTransaction } from '@courier/core';
import { eventually } from '@courier/conformance';
import { describe, expect, it } from 'vitest';
import { parsePrometheusText, ratesBetween, readMetrics, serveCourierMetrics } from '../src/index.js';
import { firingOf } from '../src/metrics-command.js';
import { endpointOf, quantile, type EndpointRead, type MetricsRates } from '../src/metrics-read.js';
import { runCli } from './support/run-cli.js';

/** A port nothing listens on: bound, then released. */
async function deadPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('metrics reader', () => {
  it('parses labels with escapes, +Inf, and names a line that is not a sample', () => {
    const samples = parsePrometheusText('# HELP x y\nx_bucket{a="q\\"uo,te",le="+Inf"} 3\nx_count 3 1700000000000\n');
    expect(samples).toEqual([
      { name: 'x_bucket', labels: { a: 'q"uo,te', le: '+Inf' }, value: 3 },
      { name: 'x_count', labels: {}, value: 3 },
    ]);
    expect(() => parsePrometheusText('ok 1\nthis is not a sample\n')).toThrow(/line 2 .*not a Prometheus sample/);
    expect(() => parsePrometheusText('x{a=b} 1')).toThrow(/line 1 .*malformed labels/);
  });

  it('quantile interpolates inside the bucket as histogram_quantile does', () => {
    expect(quantile(0.5, new Map([[1, 50], [2, 100], [Infinity, 100]]))).toBe(1);
    expect(quantile(0.75, new Map([[1, 50], [2, 100], [Infinity, 100]]))).toBe(1.5);
    expect(quantile(0.99, new Map([[1, 10], [Infinity, 20]]))).toBe(1);
    expect(quantile(0.99, new Map([[1, 0], [Infinity, 0]]))).toBeNull();
  });

  it('names the config entry that is not an endpoint; takes a /metrics URL as its base', () => {
    expect(endpointOf('http://relay:9464/metrics', 0)).toEqual({ url: 'http://relay:9464/', name: 'relay:9464', token: undefined });
    expect(endpointOf({ url: 'https://x.example/courier/health', name: 'x', token: 't' }, 1)).toEqual({ url: 'https://x.example/courier/', name: 'x', token: 't' });
    expect(() => endpointOf('relay:9464', 2)).toThrow(/metrics\[2\]': 'relay:9464' is not http\(s\)/);
    expect(() => endpointOf('not a url', 3)).toThrow(/metrics\[3\]': 'not a url' is not a URL/);
    expect(() => endpointOf({} as never, 4)).toThrow(/metrics\[4\]' must be a URL string or \{ url, name\?, token\? \}/);
  });

  it('decides the alerts of docs/operations.md the endpoints can: latency over 5 s, paused, failing, dead-lettering', () => {
    const quiet: MetricsRates = { from: 0, to: 1000, publishedPerSecond: 1, publishFailuresPerSecond: 0, processedPerSecond: 1, deadLettered: 0, commitToConfirmP99: 5, handlerP99: null, deliveryToAckP99: null, occurredToHandlerP99: null };
    const read = (relayPaused: number | null): EndpointRead => ({ name: 'r', url: 'http://r/', at: 0, up: true, error: null, health: null, totals: { published: 0, publishFailures: 0, processed: 0, deadLettered: 0, relayPaused, commitToConfirm: new Map(), handler: new Map(), deliveryToAck: new Map(), occurredToHandler: new Map() } });
    expect(firingOf([read(0)], quiet)).toEqual([]);
    expect(firingOf([read(1)], { ...quiet, commitToConfirmP99: 5.01, publishFailuresPerSecond: 0.1, deadLettered: 2 })).toEqual(['CourierPublishLatency', 'CourierRelayPaused', 'CourierPublishFailing', 'CourierDeadLettering']);
  });

  it('reads rates, latencies and health from a real endpoint; a token is sent; a dead endpoint is reported, not thrown; courier metrics prints them', { timeout: 60_000 }, async () => {
    const token = `t-${randomBytes(6).toString('hex')}`;
    const server = await serveCourierMetrics({ port: 0, metricsMaxAgeMs: 0, token, serviceName: 'console-metrics-test' });
    const db = new InMemoryDatabase();
    const outbox = new InMemoryOutboxStore({ database: db });
    const inbox = new InMemoryInboxStore({ database: db });
    const broker = new InMemoryBroker();
    const transport = broker.connect();
    const bus = createBus<InMemoryTransaction>({ outbox, inbox, transport, retry: { maxAttempts: 1 }, relay: { pollIntervalMs: 20 } });
    const Placed = defineMessage('orders.Placed', { version: 1, topic: 'orders' });
    bus.subscribe('billing', Placed, async (message) => {
      if ((message.payload as { poison?: boolean }).poison) throw new UnrecoverableError('poison');
    });
    server.watch({ bus, outbox, inbox });
    const url = `http://127.0.0.1:${server.address.port}`;
    const dead = `http://127.0.0.1:${await deadPort()}/metrics`;
    try {
      await bus.start();
      const endpoints = [{ url, name: 'billing', token }, dead];
      const before = await readMetrics(endpoints);
      expect(before[0]).toMatchObject({ name: 'billing', up: true, error: null, health: { ready: true } });
      expect(before[1]).toMatchObject({ up: false, health: null, name: `127.0.0.1:${new URL(dead).port}` });
      expect(before[1]!.error).toMatch(/\/metrics: fetch failed/);

      await db.transaction(async (tx) => {
        // One whose fact (occurredAt) is 30 s older than its publish: the publish → handler p99 shows it.
        for (let index = 0; index < 5; index += 1) bus.outbox(tx).publish(Placed, { index }, index === 0 ? { occurredAt: new Date(Date.now() - 30_000) } : {});
        bus.outbox(tx).publish(Placed, { poison: true });
      });
      await eventually(() => expect(bus.health().counters).toMatchObject({ processed: 5, deadLettered: 1 }), { timeoutMs: 30_000 });
      const after = await readMetrics(endpoints);
      const rates = ratesBetween(before, after);
      const seconds = (rates.to - rates.from) / 1000;
      // Exact counts between the two reads: six published, five handled, one dead-lettered.
      expect(Math.round(rates.publishedPerSecond * seconds)).toBe(6);
      expect(Math.round(rates.processedPerSecond * seconds)).toBe(5);
      expect(rates.deadLettered).toBe(1);
      expect(rates.commitToConfirmP99).toBeGreaterThan(0);
      expect(rates.handlerP99).toBeGreaterThan(0);
      // Six first starts, one just over 30 s after its occurredAt: the p99 lies in the 30–60 s bucket (interpolated as histogram_quantile does).
      expect(rates.occurredToHandlerP99).toBeGreaterThan(30);
      expect(rates.occurredToHandlerP99).toBeLessThanOrEqual(60);
      expect(after[0]!.health?.consumers).toEqual([expect.objectContaining({ consumer: 'billing', connected: true })]);

      // Without its token the endpoint answers 401, and the reader says what to do.
      const refused = await readMetrics([url]);
      expect(refused[0]).toMatchObject({ up: false });
      expect(refused[0]!.error).toMatch(/HTTP 401 \(give the endpoint its token in the config\)/);

      const cli = await runCli(['metrics', '--window', '200ms', '--json'], { CLI_TEST_METRICS: JSON.stringify(endpoints) });
      expect(cli.code, cli.stderr).toBe(1);
      const report = JSON.parse(cli.stdout) as { endpoints: { name: string; up: boolean }[]; firing: string[] };
      expect(report.endpoints.map((one) => [one.name, one.up])).toEqual([['billing', true], [`127.0.0.1:${new URL(dead).port}`, false]]);
      const human = await runCli(['metrics', '--window', '100ms'], { CLI_TEST_METRICS: JSON.stringify([{ url, name: 'billing', token }]) });
      expect(human.code, human.stderr).toBe(0);
      expect(human.stdout).toMatch(/^billing\s+up\s+running\s+running, last claim/m);
      expect(human.stdout).toMatch(/p99: commit → confirm \S+, publish → handler \S+, handler/);
      // A config entry that is not an endpoint: explained (its index, what is wrong), not an unexpected error.
      const badEntry = await runCli(['metrics'], { CLI_TEST_METRICS: JSON.stringify(['relay:9464']) });
      expect(badEntry.code).toBe(2);
      expect(badEntry.stderr).toMatch(/metrics\[0\]': 'relay:9464' is not http\(s\)/);
      expect(badEntry.stderr).not.toMatch(/unexpected error/);
      const none = await runCli(['metrics'], {});
      expect(none.code).toBe(2);
      expect(none.stderr).toMatch(/names no 'metrics' endpoints/);
    } finally {
      await bus.stop();
      await server.close();
    }
  });
});
