// The JetStream transport fixture: every connection goes through a TCP proxy of its own, so
// a test can cut one client (kill) or all of this fixture's clients (outage) without
// touching the shared NATS server, and through a hop that can make chosen settles fail at
// the server (failSettles, see settle-fault-proxy.ts).
import { CourierError, type Envelope, type Transport } from '@courier/core';
import type { FixtureContext, TransportFixture } from '@courier/conformance';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { NatsJetStreamTransport } from '../../src/index.js';
import { TcpProxy, targetOf } from '@courier/conformance';
import { SettleFaultProxy, SettleFaults } from './settle-fault-proxy.js';

/** Address of the NATS server with JetStream (scripts/services.sh exports it). */
export const natsUrl = process.env['COURIER_NATS_URL'] ?? 'nats://127.0.0.1:4222';

/** Short ack wait: redelivery after a crash is AckWait-driven. */
export const ACK_WAIT_MS = 2_000;

/** Transport settings every connection of one fixture shares (tests that need other timers than the defaults). */
export type JetStreamFixtureSettings = Partial<Pick<ConstructorParameters<typeof NatsJetStreamTransport>[0], 'orderedLeaseMs'>>;

/** The transport's declared `maxMessageBytes` (512 KiB): the kit publishes a payload of exactly that and expects it taken. */
const MAX_MESSAGE_BYTES = 512 * 1024;
/**
 * The test stream's `max_msg_size` (payload and headers): a payload of `maxMessageBytes` with
 * ordinary headers fits; `refusable` adds 16 KB of user headers to such a payload, which the
 * transport's own checks pass (within `max_payload` and the 64 KiB header bound) and the
 * server refuses for its size.
 */
const STREAM_MAX_MSG_BYTES = MAX_MESSAGE_BYTES + 8 * 1024;

export async function createJetStreamFixture({ testId }: FixtureContext, settings: JetStreamFixtureSettings = {}): Promise<TransportFixture> {
  const proxies = new Map<Transport, { proxy: TcpProxy; faultProxy: SettleFaultProxy; connections: NatsConnection[]; killed: boolean }>();
  const faults = new SettleFaults(testId);
  let down = false;
  let rejecting: ((envelope: Envelope) => boolean) | undefined;
  let duplicates = 0;

  const make = async (extra: Partial<ConstructorParameters<typeof NatsJetStreamTransport>[0]> = {}): Promise<NatsJetStreamTransport> => {
    const proxy = await TcpProxy.create(targetOf(natsUrl, 4222));
    await proxy.open();
    // Client → settle-fault hop → TcpProxy → server: kill and outage close the TcpProxy.
    const faultProxy = await SettleFaultProxy.start(proxy.port, faults);
    const entry = { proxy, faultProxy, connections: [] as NatsConnection[], killed: false };
    const servers = new URL(natsUrl);
    servers.hostname = '127.0.0.1';
    servers.port = String(faultProxy.port);
    const transport = new NatsJetStreamTransport({
      prefix: testId,
      ackWaitMs: ACK_WAIT_MS,
      connectTimeoutMs: 3_000,
      publishTimeoutMs: 5_000,
      connection: async () => {
        if (entry.killed) throw new Error('this connection was killed');
        const nc = await connect({ servers: servers.toString(), maxReconnectAttempts: -1, reconnectTimeWait: 200, timeout: 2_000 });
        entry.connections.push(nc);
        return nc;
      },
      // The broker itself refuses these: JetStream checks Nats-Expected-Stream against the stream's name.
      publishHeaders: (envelope) => (rejecting?.(envelope) ? { 'Nats-Expected-Stream': `${testId}_NOT_THIS_STREAM` } : undefined),
      // A message over the stream's max_msg_size is refused by the server for its content.
      stream: { max_msg_size: STREAM_MAX_MSG_BYTES },
      ...settings,
      ...extra,
    });
    proxies.set(transport, entry);
    return transport;
  };

  const transport = await make();
  if (transport.capabilities.maxMessageBytes !== MAX_MESSAGE_BYTES) throw new Error(`the fixture's stream limit assumes maxMessageBytes ${MAX_MESSAGE_BYTES}, the transport declares ${transport.capabilities.maxMessageBytes}`);
  const duplicator = await make({ publishHeaders: (envelope) => ({ 'Nats-Msg-Id': `${envelope.messageId}#dup-${(duplicates += 1)}` }) });

  return {
    transport,
    connect: () => make(),
    kill: async (target) => {
      const entry = proxies.get(target);
      if (!entry) throw new Error('kill: not a transport of this fixture');
      entry.killed = true;
      // Cut the socket as a crash would (nothing settled, no drain), then stop its reconnecting.
      await entry.proxy.close();
      for (const nc of entry.connections) void nc.close().catch(() => undefined);
      void target.close().catch(() => undefined);
    },
    outage: {
      begin: async () => {
        down = true;
        await Promise.all([...proxies.values()].map((entry) => entry.proxy.close()));
      },
      end: async () => {
        down = false;
        await Promise.all([...proxies.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy.open()));
      },
    },
    rejectPublish: async (predicate) => {
      rejecting = predicate;
    },
    failSettles: async (kind, count = 1) => {
      faults.fail(kind, count);
    },
    refusable: (envelope) => ({
      ...envelope,
      payload: JSON.stringify('x'.repeat(MAX_MESSAGE_BYTES - 2)),
      headers: { ...envelope.headers, ...Object.fromEntries(Array.from({ length: 4 }, (_, index) => [`refusable-${index}`, 'x'.repeat(4_000)])) },
    }),
    // Plain bytes on the topic's subject, without the Courier-Envelope header, on a client of its own.
    publishMalformed: async (topic) => {
      const nc = await connect({ servers: natsUrl, timeout: 2_000 });
      try {
        await jetstream(nc).publish(`${testId}.t.${topic}`, new TextEncoder().encode('not a courier envelope'));
      } finally {
        await nc.close();
      }
    },
    // An empty subject token: no NATS subject can hold it.
    refusedByValidate: (envelope) => ({ ...envelope, topic: `${envelope.topic}..refused` }),
    injectDuplicate: async (envelope) => {
      // The duplicator connects at its first publish; on a loaded machine that can outlast the
      // 3 s connect timeout, which rejects retriably: try again, within a bound.
      const until = Date.now() + 30_000;
      let published: Awaited<ReturnType<Transport['publish']>> | undefined;
      while (published === undefined) {
        published = await duplicator.publish([envelope]).catch((error: unknown) => {
          if (!(error instanceof CourierError && error.retriable) || Date.now() > until) throw error;
          return undefined;
        });
      }
      const [result] = published;
      if (!result?.ok) throw new Error(`injectDuplicate failed: ${result && !result.ok ? result.error.message : 'no result'}`);
    },
    close: async () => {
      void down;
      // A killed transport's close may wait forever on a handler the test never settles: it is not awaited.
      await Promise.all([...proxies].filter(([, entry]) => !entry.killed).map(([t]) => t.close().catch(() => undefined)));
      await Promise.all([...proxies.values()].map((entry) => Promise.all([entry.faultProxy.close(), entry.proxy.close()])));
      // Workers of the process scenarios share this testId's streams with the parent: only the parent deletes them.
      if (process.env['COURIER_CONFORMANCE_WORKER'] === undefined) {
        const nc = await connect({ servers: natsUrl, timeout: 2_000 }).catch(() => undefined);
        if (nc) {
          const jsm = await jetstreamManager(nc);
          for (const suffix of ['MSG', 'DLQ', 'LEASE']) await jsm.streams.delete(`${testId}_${suffix}`).catch(() => false);
          await nc.close();
        }
      }
    },
  };
}
