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
    const command = parseCommand(['sqlite-sql', '--orders', '200', '--metrics-port', String(port), '--timeout', '120'], {});
    if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
    const lines: string[] = [];
    const seen: Record<'orders' | 'payments', { published: number; pending: boolean; health: unknown }> = {
      orders: { published: 0, pending: false, health: undefined },
      payments: { published: 0, pending: false, health: undefined },
    };
    let running = true;
    const failures: string[] = [];
    const scrape = (async () => {
      while (running) {
        for (const [role, at] of [['orders', port], ['payments', port + 1]] as const) {
          try {
            const text = await (await fetch(`http://127.0.0.1:${at}/metrics`)).text();
            const published = sample(text, 'courier_relay_published_total');
            if (published !== undefined) seen[role].published = Math.max(seen[role].published, published);
            if (sample(text, 'courier_outbox_pending') !== undefined) seen[role].pending = true;
            seen[role].health ??= await (await fetch(`http://127.0.0.1:${at}/health`)).json();
          } catch (error) {
            // Not up yet, or restarting.
            failures.push(String(error));
          }
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    const result = await runDistributed(command.options, (line) => lines.push(line)).finally(() => {
      running = false;
    });
    await scrape;
    const output = lines.join('\n');
    expect(result.ok, output).toBe(true);
    expect(output).toMatch(new RegExp(`worker orders#1 ready \\(.*metrics http://127\\.0\\.0\\.1:${port}/metrics\\)`));
    expect(output).toMatch(new RegExp(`worker payments#1 ready \\(.*metrics http://127\\.0\\.0\\.1:${port + 1}/metrics\\)`));
    // Each relay's counter and its outbox gauge were on its own endpoint; /health carried the bus's state.
    expect(seen.orders.published, `${output}\n${failures.slice(-3).join('\n')}`).toBeGreaterThan(0);
    expect(seen.payments.published, output).toBeGreaterThan(0);
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
