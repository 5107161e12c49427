// The Redis Streams transport fixture: every client of a transport goes through a TCP proxy of
// that transport's own, so a test can cut one transport (kill) or all of this fixture's
// (outage) without touching the Redis server other tests share. Keys live under the testId,
// so cases run side by side on one server; the parent deletes them at the end.
import type { FixtureContext, TransportFixture } from '@courier/conformance';
import { TcpProxy, targetOf } from '@courier/conformance';
import type { Transport } from '@courier/core';
import { Redis } from 'ioredis';
import { RedisStreamsTransport, type RedisStreamsTransportConfig } from '../../src/index.js';
import { RespFaultProxy, RespFaults } from './resp-fault-proxy.js';

/** Address of the Redis server (scripts/services.sh exports it). */
export const redisUrl = process.env['COURIER_REDIS_URL'] ?? 'redis://127.0.0.1:6379';

/** Short claim time: redelivery after a crash is driven by XAUTOCLAIM's min-idle. */
export const CLAIM_IDLE_MS = 2_000;
/** Short ordered lease: a dead holder's group moves on after it. */
export const ORDERED_LEASE_MS = 2_000;

/** The client options the README recommends: fail commands at once while disconnected (the transport waits for readiness itself). */
export function redisClient(url: string): Redis {
  return new Redis(url, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1, connectTimeout: 2_000, retryStrategy: () => 200 });
}

/** Settings of every transport one fixture makes (tests that need other timers than the defaults). */
export type RedisStreamsFixtureSettings = Partial<Omit<RedisStreamsTransportConfig, 'connection' | 'prefix'>>;

export async function createRedisStreamsFixture({ testId }: FixtureContext, settings: RedisStreamsFixtureSettings = {}): Promise<TransportFixture> {
  const entries = new Map<Transport, { proxy: TcpProxy; faultProxy: RespFaultProxy; clients: Redis[]; killed: boolean }>();
  const faults = new RespFaults();

  const make = async (): Promise<RedisStreamsTransport> => {
    const proxy = await TcpProxy.create(targetOf(redisUrl, 6379));
    await proxy.open();
    // Client → RESP fault hop → TcpProxy → Redis: kill and outage close the TcpProxy.
    const faultProxy = await RespFaultProxy.start(proxy.port, faults);
    const entry = { proxy, faultProxy, clients: [] as Redis[], killed: false };
    const transport = new RedisStreamsTransport({
      prefix: testId,
      claimIdleMs: CLAIM_IDLE_MS,
      orderedLeaseMs: ORDERED_LEASE_MS,
      connectTimeoutMs: 3_000,
      publishTimeoutMs: 5_000,
      blockMs: 500,
      ...settings,
      connection: () => {
        if (entry.killed) throw new Error('this transport was killed');
        const url = new URL(redisUrl);
        url.hostname = '127.0.0.1';
        url.port = String(faultProxy.port);
        const client = redisClient(url.toString());
        entry.clients.push(client);
        return client;
      },
    });
    entries.set(transport, entry);
    return transport;
  };

  const transport = await make();
  return {
    transport,
    connect: () => make(),
    kill: async (target) => {
      const entry = entries.get(target);
      if (!entry) throw new Error('kill: not a transport of this fixture');
      entry.killed = true;
      // A crash: sockets cut with nothing settled and no QUIT, and no client reconnects.
      await entry.proxy.close();
      for (const client of entry.clients) client.disconnect();
      // Stops its loops; not awaited, since it waits for handlers the suite never settles.
      void target.close().catch(() => undefined);
    },
    outage: {
      begin: async () => {
        await Promise.all([...entries.values()].map((entry) => entry.proxy.close()));
      },
      end: async () => {
        await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy.open()));
      },
    },
    rejectPublish: async (predicate) => {
      faults.refuse = predicate;
    },
    // The fault hop refuses an XADD whose envelope carries this header, as Redis answers a command it refuses.
    refusable: (envelope) => ({ ...envelope, headers: { ...envelope.headers, 'x-fixture-refuse': '1' } }),
    failSettles: async (kind, count = 1) => {
      faults.fail(kind, count);
    },
    close: async () => {
      await Promise.all([...entries].filter(([, entry]) => !entry.killed).map(([t]) => t.close().catch(() => undefined)));
      await Promise.all([...entries.values()].map((entry) => Promise.all([entry.faultProxy.close(), entry.proxy.close()])));
      // Workers of the process scenarios share this testId's keys with the parent: only the parent deletes them.
      if (process.env['COURIER_CONFORMANCE_WORKER'] === undefined) await deleteKeys(`${testId}:*`);
    },
  };
}

/** Deletes every key matching `pattern` (SCAN, never KEYS: the server is shared). */
export async function deleteKeys(pattern: string): Promise<void> {
  const client = new Redis(redisUrl, { maxRetriesPerRequest: 1, connectTimeout: 2_000 });
  try {
    let cursor = '0';
    do {
      const [next, keys] = await client.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      if (keys.length > 0) await client.unlink(...keys);
    } while (cursor !== '0');
  } finally {
    client.disconnect();
  }
}
