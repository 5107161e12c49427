// --metrics-port: each worker process serves Prometheus /metrics and /health through
// serveCourierMetrics (@courier/cli), orders on the port, payments on the next. The sqlite-sql
// setup (no server needed) is run in this process while both endpoints are scraped.
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { runDistributed } from '../src/distributed-run.js';
import { parseCommand, UsageError } from '../src/options.js';

/** A port whose next one is free too (both bound, then released). */
async function freePortPair(): Promise<number> {
  for (let attempt = 0; attempt < 20; attempt += 1) {
    const first = createServer();
    await new Promise<void>((resolve) => first.listen(0, '127.0.0.1', resolve));
    const port = (first.address() as { port: number }).port;
    const second = createServer();
    const ok = port < 65_535 && (await new Promise<boolean>((resolve) => second.once('error', () => resolve(false)).listen(port + 1, '127.0.0.1', () => resolve(true))));
    await new Promise<void>((resolve) => first.close(() => resolve()));
    if (ok) await new Promise<void>((resolve) => second.close(() => resolve()));
    if (ok) return port;
  }
  throw new Error('no free pair of ports');
}

const sample = (text: string, name: string): number | undefined => {
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${name}{`) || candidate.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
};

describe('--metrics-port', () => {
  it('sqlite-sql: both workers serve /metrics and /health while the run goes, and the run still reconciles', async () => {
    const port = await freePortPair();
    // 600 orders: long enough that each relay publishes across several of the workers' 1-second
    // metrics snapshots even on a quiet machine (200 orders once drained in under two seconds).
    const command = parseCommand(['sqlite-sql', '--orders', '600', '--metrics-port', String(port), '--timeout', '120'], {});
    if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
    const lines: string[] = [];
    const seen: Record<'orders' | 'payments', { published: number; pending: boolean; health: unknown; log: string[] }> = {
      orders: { published: 0, pending: false, health: undefined, log: [] },
      payments: { published: 0, pending: false, health: undefined, log: [] },
    };
    let running = true;
    // One scraper per endpoint, each request bounded: a slow or refused scrape of one worker
    // never delays the other's (a shared sequential loop once saw payments' counter only as 0
    // through a whole 18-second CI run).
    const scrape = async (role: 'orders' | 'payments', at: number) => {
      const record = seen[role];
      while (running) {
        try {
          const response = await fetch(`http://127.0.0.1:${at}/metrics`, { signal: AbortSignal.timeout(5_000) });
          const text = await response.text();
          const published = sample(text, 'courier_relay_published_total');
          record.log.push(`${response.status} published=${published}`);
          if (published !== undefined) record.published = Math.max(record.published, published);
          if (sample(text, 'courier_outbox_pending') !== undefined) record.pending = true;
          record.health ??= await (await fetch(`http://127.0.0.1:${at}/health`, { signal: AbortSignal.timeout(5_000) })).json();
        } catch (error) {
          // Not up yet, or stopped.
          record.log.push(String(error));
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    const scrapers = Promise.all([scrape('orders', port), scrape('payments', port + 1)]);
    const result = await runDistributed(command.options, (line) => lines.push(line)).finally(() => {
      running = false;
    });
    await scrapers;
    const output = lines.join('\n');
    const scrapes = (role: 'orders' | 'payments') => `${output}\n${role}'s scrapes, last 10: ${seen[role].log.slice(-10).join(' | ')}`;
    expect(result.ok, output).toBe(true);
    expect(output).toMatch(new RegExp(`worker orders#1 ready \\(.*metrics http://127\\.0\\.0\\.1:${port}/metrics\\)`));
    expect(output).toMatch(new RegExp(`worker payments#1 ready \\(.*metrics http://127\\.0\\.0\\.1:${port + 1}/metrics\\)`));
    // Each relay's counter and its outbox gauge were on its own endpoint; /health carried the bus's state.
    expect(seen.orders.published, scrapes('orders')).toBeGreaterThan(0);
    expect(seen.payments.published, scrapes('payments')).toBeGreaterThan(0);
    expect([seen.orders.pending, seen.payments.pending]).toEqual([true, true]);
    expect(seen.orders.health).toMatchObject({ relay: { running: true }, consumers: [{ consumer: expect.any(String) }] });
  }, 150_000);

  it('is refused where no worker process runs, and outside 0-65534, naming what is wrong', () => {
    expect(() => parseCommand(['in-memory', '--metrics-port', '9464'], {})).toThrow(UsageError);
    expect(() => parseCommand(['in-memory', '--metrics-port', '9464'], {})).toThrow(/--metrics-port needs a setup with worker processes .*the in-memory setup runs in one process/);
    expect(() => parseCommand(['sqlite-sql', '--metrics-port', '65535'], {})).toThrow(/--metrics-port must be a port from 0 to 65534 .*got '65535'/);
    expect(parseCommand(['sqlite-sql', '--metrics-port', '0'], {})).toMatchObject({ options: { metricsPort: 0 } });
    expect(parseCommand(['sqlite-sql'], {})).toMatchObject({ options: { metricsPort: undefined } });
  });
});
