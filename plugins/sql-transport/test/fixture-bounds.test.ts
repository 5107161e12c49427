// The fixture's connections give up on a database that accepts TCP but never answers,
// within a bound: the outage case reopens its proxies and reconnects under load, and a
// connect with no bound waits as long as the kernel keeps the socket (minutes), which is
// how a case runs into its vitest timeout instead of failing or recovering. On MikroORM 7
// the pool is pg's own, which takes `connectionTimeoutMillis` (knex's
// `acquireConnectionTimeout` means nothing to it, so the fixture's bound did not apply).
import { createServer, type Socket } from 'node:net';
import { TcpProxy } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { openOrm } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

/** A server that accepts connections and never says anything, like a wedged database. */
async function silentServer(): Promise<{ host: string; port: number }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  cleanups.push(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('silent server has no port');
  return { host: '127.0.0.1', port: address.port };
}

describe('sql transport fixture connection bounds', () => {
  // 3 s is the fixture's bound (MariaDB on MikroORM 7: mysql2's 10 s connect timeout, the
  // driver's default); 20 s leaves room for a loaded machine, far under the minutes an
  // unbounded connect waits. Measured: 3.2-3.5 s on 6, 4.2 s (PostgreSQL) and 10.2 s (MariaDB) on 7.
  it.each(['postgresql', 'mariadb'] as const)('opening a %s ORM against a database that never answers fails within a bound', async (dialect) => {
    const proxy = await TcpProxy.create(await silentServer());
    cleanups.push(() => proxy.close());
    await proxy.open();
    const started = Date.now();
    await expect(openOrm(dialect, 'outage_bounds', proxy)).rejects.toThrow(/cannot be opened|unreachable/);
    expect(Date.now() - started).toBeLessThan(20_000);
  }, 40_000);
});
