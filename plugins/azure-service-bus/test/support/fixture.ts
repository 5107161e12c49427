// The Service Bus transport fixture: every transport has its own client behind a TCP proxy
// of its own, so a test can cut one client (kill) or all of this fixture's (outage)
// without touching the stand-in other tests share.
import { ServiceBusClient } from '@azure/service-bus';
import type { Envelope, Transport } from '@courier/core';
import { TcpProxy, type FixtureContext, type TransportFixture } from '@courier/conformance';
import { ServiceBusTransport, type ServiceBusTransportConfig } from '../../src/index.js';
import { REFUSED_ID_PREFIX, standIn, standInConnectionString } from './standin-server.js';

export async function createServiceBusFixture({ testId }: FixtureContext): Promise<TransportFixture> {
  const { host, port, server } = await standIn();
  const target = { host, port };
  const prefix = `${testId}.`;
  // Dead letters are per subscription: the checks (in the process that runs the stand-in)
  // read those of every topic this test created, whichever process published or subscribed.
  const topics = () => (server?.topicNames() ?? []).filter((name) => name.startsWith(prefix.toLowerCase())).map((name) => name.slice(prefix.length));
  const entries = new Map<Transport, { proxy: TcpProxy; killed: boolean }>();
  let rejecting: ((envelope: Envelope) => boolean) | undefined;
  let duplicates = 0;
  let duplicating = false;

  const make = async (extra: Partial<ServiceBusTransportConfig> = {}): Promise<ServiceBusTransport> => {
    const proxy = await TcpProxy.create(target);
    await proxy.open();
    // Short SDK retries: an outage must surface within the suite's waits, not after minutes.
    // A factory: the transport replaces its client after a lost connection.
    const client = () => new ServiceBusClient(standInConnectionString(proxy.port), { retryOptions: { maxRetries: 1, retryDelayInMs: 200, timeoutInMs: 3_000 } });
    const transport = new ServiceBusTransport({
      client,
      sessions: true,
      prefix,
      topics,
      publishTimeoutMs: 5_000,
      // Above the stand-in's 256 KiB: the broker's own limit refuses (the fixture's `refusable`).
      maxMessageBytes: 300 * 1024,
      brokerMessageId: (envelope) =>
        rejecting?.(envelope) ? `${REFUSED_ID_PREFIX}${envelope.messageId}` : duplicating ? `${envelope.messageId}#dup-${(duplicates += 1)}` : envelope.messageId,
      ...extra,
    });
    entries.set(transport, { proxy, killed: false });
    return transport;
  };

  const transport = await make();

  return {
    transport,
    connect: () => make(),
    kill: async (victim) => {
      const entry = entries.get(victim);
      if (!entry) throw new Error('kill: not a transport of this fixture');
      entry.killed = true;
      // Cut the socket as a crash would: nothing settled, nothing closed AMQP-wise.
      await entry.proxy.close();
      // The transport closes the clients it made.
      void victim.close().catch(() => undefined);
    },
    // Cuts every connection of this fixture's clients and refuses new ones until `end`.
    outage: {
      begin: async () => {
        await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy.close()));
      },
      end: async () => {
        await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy.open()));
      },
    },
    rejectPublish: async (predicate) => {
      rejecting = predicate;
    },
    // Over the entity's maximum message size (256 KiB on the stand-in, as on a Standard namespace).
    refusable: (envelope) => ({ ...envelope, payload: JSON.stringify('x'.repeat(270 * 1024)) }),
    // A second copy under another MessageId (duplicate detection is on), sent through the
    // fixture's own transport, whose link is already open: the copy follows the original closely.
    injectDuplicate: async (envelope) => {
      duplicating = true;
      const [result] = await transport.publish([envelope]).finally(() => {
        duplicating = false;
      });
      if (!result?.ok) throw new Error(`injectDuplicate failed: ${result && !result.ok ? result.error.message : 'no result'}`);
    },
    close: async () => {
      // A killed transport's close may wait on a handler the test never settles: not awaited.
      await Promise.all([...entries].filter(([, entry]) => !entry.killed).map(([t, entry]) => t.close().catch(() => undefined)));
      await Promise.all([...entries.values()].map((entry) => entry.proxy.close()));
    },
  };
}
