// The HTTP side of `courier relay --port` (issue 29): scrapes share one collection (the
// outbox stats() and the inbox halt listing behind it), a collection answers scrapes for a
// short age, and a bearer token, when set, is required before anything is read.
import type { Server } from 'node:http';
import { eventually } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { serveRelayHttp } from '../src/relay-http.js';

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) await new Promise<void>((resolve) => server.close(() => resolve()));
});

/** A collection that counts its runs and finishes only when released. */
function slowCollect(): { collect: () => Promise<string>; runs: () => number; release: () => void } {
  let runs = 0;
  let releases: (() => void)[] = [];
  return {
    collect: async () => {
      runs += 1;
      await new Promise<void>((resolve) => releases.push(resolve));
      return `courier_outbox_pending ${runs}\n`;
    },
    runs: () => runs,
    release: () => {
      for (const release of releases.splice(0)) release();
      releases = [];
    },
  };
}

async function serve(options: Partial<Parameters<typeof serveRelayHttp>[0]> & Pick<Parameters<typeof serveRelayHttp>[0], 'collect'>) {
  const served = await serveRelayHttp({ port: 0, host: '127.0.0.1', health: () => ({ ready: true }), ...options });
  servers.push(served.server);
  return `http://127.0.0.1:${served.address.port}`;
}

describe('courier relay http', () => {
  it('concurrent scrapes share one collection, reused while younger than the max age', async () => {
    const slow = slowCollect();
    const base = await serve({ collect: slow.collect, metricsMaxAgeMs: 60_000 });
    const scrapes = Array.from({ length: 10 }, () => fetch(`${base}/metrics`).then(async (response) => [response.status, await response.text()] as const));
    await eventually(() => expect(slow.runs()).toBe(1));
    slow.release();
    const answers = await Promise.all(scrapes);
    expect(answers).toEqual(Array.from({ length: 10 }, () => [200, 'courier_outbox_pending 1\n']));
    // Within the age: answered from the snapshot, nothing read.
    const again = await fetch(`${base}/metrics`);
    expect(await again.text()).toBe('courier_outbox_pending 1\n');
    expect(slow.runs()).toBe(1);
  });

  it('collects again once the snapshot is older than the max age; a failed collection is not kept', async () => {
    let runs = 0;
    let fail = true;
    const base = await serve({
      metricsMaxAgeMs: 0,
      collect: async () => {
        runs += 1;
        if (fail) throw new Error('database away');
        return `run ${runs}\n`;
      },
    });
    const failed = await fetch(`${base}/metrics`);
    expect(failed.status).toBe(500);
    expect(await failed.text()).toContain('database away');
    fail = false;
    expect(await (await fetch(`${base}/metrics`)).text()).toBe('run 2\n');
    expect(await (await fetch(`${base}/metrics`)).text()).toBe('run 3\n');
  });

  it('with a token, answers 401 to a request without it (nothing collected) and serves one with it', async () => {
    let runs = 0;
    const base = await serve({ token: 's3cret', collect: async () => `run ${(runs += 1)}\n` });
    for (const headers of [{} as Record<string, string>, { authorization: 'Bearer wrong' }, { authorization: 's3cret' }, { authorization: 'Bearer s3cret2' }]) {
      for (const path of ['/metrics', '/health', '/nothing']) {
        const response = await fetch(`${base}${path}`, { headers });
        expect(response.status, `${path} with ${JSON.stringify(headers)}`).toBe(401);
        expect(response.headers.get('www-authenticate')).toMatch(/^Bearer/);
      }
    }
    expect(runs).toBe(0);
    const authorised = { authorization: 'Bearer s3cret' };
    expect(await (await fetch(`${base}/metrics`, { headers: authorised })).text()).toBe('run 1\n');
    expect((await fetch(`${base}/health`, { headers: authorised })).status).toBe(200);
  });
});
