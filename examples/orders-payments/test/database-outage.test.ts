// The distributed example through a PostgreSQL outage: the run (runner and both worker
// processes) reaches the shared server through a proxy of its own, which the test closes for
// a few seconds — the server itself never stops, so nothing else sharing it notices. The
// workers must ride it out as the README says a worker does (start while the database is
// down, producers wait for it), so the run still reconciles with no worker exiting on its own.
import { setTimeout as sleep } from 'node:timers/promises';
import { TcpProxy, targetOf, throughProxy } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { runDistributed } from '../src/distributed-run.js';
import { parseCommand, type ExampleOptions } from '../src/options.js';

const ORDERS = 40;
const OUTAGE_MS = 6_000;
const pgUrl = process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test';

function optionsThrough(proxy: TcpProxy, extra: readonly string[]): ExampleOptions {
  const command = parseCommand(['postgres-rabbitmq', ...extra, '--orders', String(ORDERS), '--timeout', '150'], { ...process.env, COURIER_PG_URL: throughProxy(pgUrl, proxy) });
  if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
  return command.options;
}

const proxies: TcpProxy[] = [];
afterEach(async () => {
  for (const proxy of proxies.splice(0)) await proxy.close();
});

/**
 * Runs the example with the proxy closed for OUTAGE_MS from the first output line that
 * `begins` matches; returns the run's result and its output.
 */
async function runWithOutage(begins: RegExp, extra: readonly string[]): Promise<{ ok: boolean; output: string; outageAt: number | undefined }> {
  const proxy = await TcpProxy.create(targetOf(pgUrl, 5432));
  proxies.push(proxy);
  await proxy.open();
  const lines: string[] = [];
  let outage: Promise<void> | undefined;
  let outageAt: number | undefined;
  const write = (line: string): void => {
    lines.push(line);
    if (outage === undefined && begins.test(line)) {
      outageAt = lines.length;
      lines.push(`(test: PostgreSQL unreachable for ${OUTAGE_MS / 1000} s from here)`);
      outage = (async () => {
        await proxy.close();
        await sleep(OUTAGE_MS);
        await proxy.open();
        lines.push('(test: PostgreSQL reachable again)');
      })();
    }
  };
  const result = await runDistributed(optionsThrough(proxy, extra), write);
  await outage;
  return { ok: result.ok, output: lines.join('\n'), outageAt };
}

// Both data layers: MikroORM (opened with `connect: false`) and Prisma (its adapter's pool
// connects on first use), each service's producer retrying what a retry can cure.
describe.each([
  { layer: 'MikroORM', extra: [] },
  { layer: 'Prisma', extra: ['--data-layer', 'prisma'] },
])('the postgres-rabbitmq setup on $layer through a PostgreSQL outage', ({ extra }) => {
  it('workers started while the database is unreachable come up, wait for it, and the run reconciles', async () => {
    // The first progress line is printed right after both workers were forked: they open
    // their database clients and start their buses during the outage.
    const { ok, output, outageAt } = await runWithOutage(/orders 0\/\d+ committed/, extra);
    expect(outageAt, output).toBeDefined();
    expect(output).not.toContain('exited on its own');
    expect(ok, output).toBe(true);
    expect(output).toContain('RECONCILED');
  }, 180_000);

  it('the orders worker keeps placing orders across the outage, and the run reconciles', async () => {
    // From the moment the orders worker is ready, it places orders: the outage cuts its
    // transactions and its read of what is placed already.
    const { ok, output, outageAt } = await runWithOutage(/worker orders#1 ready/, extra);
    expect(outageAt, output).toBeDefined();
    expect(output).not.toContain('exited on its own');
    expect(ok, output).toBe(true);
    expect(output).toContain('RECONCILED');
  }, 180_000);
});
