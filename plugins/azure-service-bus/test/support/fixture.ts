// The Service Bus transport fixture: every transport has its own client behind a TCP proxy
// of its own, so a test can cut one client (kill) or all of this fixture's (outage)
// without touching the stand-in other tests share.
import { ServiceBusAdministrationClient, ServiceBusClient, type ServiceBusReceiver, type ServiceBusSessionReceiver } from '@azure/service-bus';
import type { Envelope, Transport } from '@courier/core';
import { TcpProxy, type FixtureContext, type TransportFixture } from '@courier/conformance';
import type { DeliveryHandler, Endpoint, PublishResult, Subscription } from '@courier/core';
import { ServiceBusTransport, type ServiceBusTransportConfig } from '../../src/index.js';
import { REAL_CONNECTION_STRING, realProvisioner } from './namespace.js';
import type { Provisioner } from './provisioning.js';
import { QUEUE_MARK, REFUSED_ID_PREFIX, SESSION_QUEUE_MARK, standIn, standInAdministration, standInConnectionString } from './standin-server.js';

/**
 * On a real namespace, entities must exist before a message is sent or received: the
 * topic before a publish, the subscription (session-enabled for ordered consumers) before
 * a subscribe; in queue mode the queue (session-enabled when the transport uses sessions)
 * before either. The stand-in creates them on first use, so it needs none of this.
 */
class ProvisionedServiceBusTransport extends ServiceBusTransport {
  readonly #provisioner: Provisioner;
  readonly #sessions: boolean;

  constructor(config: ServiceBusTransportConfig, provisioner: Provisioner) {
    super(config);
    this.#provisioner = provisioner;
    this.#sessions = config.sessions ?? false;
  }

  override async publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]> {
    await Promise.all(
      [...new Set(messages.map((message) => message.topic))].map((topic) =>
        this.queueMode ? this.#provisioner.ensureQueue(this.entityOf(topic), this.#sessions, true) : this.#provisioner.ensureTopic(this.entityOf(topic)),
      ),
    );
    return super.publish(messages, options);
  }

  override async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    await Promise.all(
      endpoint.topics.map((topic) =>
        this.queueMode
          ? this.#provisioner.ensureQueue(this.entityOf(topic), this.#sessions, true)
          : this.#provisioner.ensureSubscription(this.entityOf(topic), endpoint.consumer, endpoint.ordered),
      ),
    );
    return super.subscribe(endpoint, handler);
  }
}

/** How a fixture maps Courier topics: topics and subscriptions (default), or queues, session-enabled or not. */
export interface ServiceBusFixtureMode {
  readonly entities?: 'topics' | 'queues';
  /** Default true. In queue mode: whether the queues are session-enabled. */
  readonly sessions?: boolean;
}

/** The transport fixture in topic mode with sessions (what most tests use). */
export function createServiceBusFixture(context: FixtureContext): Promise<TransportFixture> {
  return createServiceBusFixtureIn({}, context);
}

/** A header that makes the stand-in refuse the message (the fixture's `refusable`). */
const REFUSED_HEADER = 'conformance-refused';

/** Settles the fixture is to fail next, by kind (`TransportFixture.failSettles`). */
type SettleFaults = Record<'ack' | 'retry' | 'deadLetter', number>;

/** `target` with `overrides` in place of some of its members; every other member bound to it. */
function overriding<T extends object>(target: T, overrides: Partial<T>): T {
  return new Proxy(target, {
    get(object, name, receiver) {
      if (Object.prototype.hasOwnProperty.call(overrides, name)) return overrides[name as keyof T];
      const value: unknown = Reflect.get(object, name, receiver);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(object) : value;
    },
  });
}

/** `receiver` whose settle calls fail while `faults` has one of their kind due: complete (`ack`), abandon (`retry`), dead-letter. */
function faultyReceiver<R extends ServiceBusReceiver>(receiver: R, faults: SettleFaults): R {
  const failing = <A extends unknown[]>(kind: keyof SettleFaults, settle: (...args: A) => Promise<void>) => async (...args: A): Promise<void> => {
    if (faults[kind] > 0) {
      faults[kind] -= 1;
      throw new Error(`service bus fixture: the service failed the ${kind} settle (injected fault)`);
    }
    await settle(...args);
  };
  return overriding(receiver, {
    completeMessage: failing('ack', receiver.completeMessage.bind(receiver)),
    abandonMessage: failing('retry', receiver.abandonMessage.bind(receiver)),
    deadLetterMessage: failing('deadLetter', receiver.deadLetterMessage.bind(receiver)),
  } as Partial<R>);
}

/** `client` whose receivers (plain and session) fail settles as `faults` says. */
function faultyClient(client: ServiceBusClient, faults: SettleFaults): ServiceBusClient {
  return overriding(client, {
    createReceiver: ((...args: Parameters<ServiceBusClient['createReceiver']>) => faultyReceiver((client.createReceiver as (...rest: unknown[]) => ServiceBusReceiver)(...args), faults)) as ServiceBusClient['createReceiver'],
    acceptNextSession: (async (...args: unknown[]) => faultyReceiver(await (client.acceptNextSession as (...rest: unknown[]) => Promise<ServiceBusSessionReceiver>)(...args), faults)) as ServiceBusClient['acceptNextSession'],
    acceptSession: (async (...args: unknown[]) => faultyReceiver(await (client.acceptSession as (...rest: unknown[]) => Promise<ServiceBusSessionReceiver>)(...args), faults)) as ServiceBusClient['acceptSession'],
  });
}

/**
 * The transport fixture in the given mode. On the stand-in, queue mode marks its names
 * ({@link QUEUE_MARK}, {@link SESSION_QUEUE_MARK}) so the stand-in makes queues of them,
 * session-enabled or not, where it would otherwise take a sent-to path for a topic.
 */
export async function createServiceBusFixtureIn(mode: ServiceBusFixtureMode, { testId }: FixtureContext): Promise<TransportFixture> {
  const queues = mode.entities === 'queues';
  const sessions = mode.sessions ?? true;
  const provisioner = realProvisioner();
  const { host, port, managementPort, server } = provisioner ? { host: '', port: 0, managementPort: 0, server: undefined } : await standIn();
  // Reads only (deadLetters.exists): the real namespace's own, or the stand-in's management endpoint.
  const administration = provisioner ? new ServiceBusAdministrationClient(REAL_CONNECTION_STRING!) : managementPort > 0 ? standInAdministration(managementPort) : undefined;
  const target = { host, port };
  const prefix = queues ? `${testId}${sessions ? SESSION_QUEUE_MARK : QUEUE_MARK}` : `${testId}.`;
  // Dead letters are per subscription (per queue): the checks (in the process that runs the
  // stand-in) read those of every topic this test created, whichever process published or
  // subscribed. On a real namespace: the topics this process's transports used.
  const used = new Set<string>();
  const topics = () =>
    server ? (queues ? server.queueNames() : server.topicNames()).filter((name) => name.startsWith(prefix.toLowerCase())).map((name) => name.slice(prefix.length)) : [...used];
  const entries = new Map<Transport, { proxy: TcpProxy | undefined; killed: boolean }>();
  let rejecting: ((envelope: Envelope) => boolean) | undefined;
  const settleFaults: SettleFaults = { ack: 0, retry: 0, deadLetter: 0 };
  let duplicates = 0;
  let duplicating = false;

  const make = async (extra: Partial<ServiceBusTransportConfig> = {}): Promise<ServiceBusTransport> => {
    // A real namespace speaks TLS to its own host name: no proxy in between (so no outage).
    const proxy = provisioner ? undefined : await TcpProxy.create(target);
    await proxy?.open();
    // Short SDK retries: an outage must surface within the suite's waits, not after minutes.
    // A factory: the transport replaces its client after a lost connection.
    const connectionString = proxy ? standInConnectionString(proxy.port) : REAL_CONNECTION_STRING!;
    const client = () => faultyClient(new ServiceBusClient(connectionString, { retryOptions: { maxRetries: 1, retryDelayInMs: 200, timeoutInMs: proxy ? 3_000 : 10_000 } }), settleFaults);
    const config: ServiceBusTransportConfig = {
      client,
      entities: queues ? 'queues' : 'topics',
      sessions,
      prefix,
      topics,
      administration,
      publishTimeoutMs: 5_000,
      // The transport's default maxMessageBytes (240 KiB under the stand-in's 256 KiB): the
      // kit's oversized dead-letter case publishes a payload of exactly what is declared.
      brokerMessageId: (envelope) =>
        rejecting?.(envelope) || envelope.headers[REFUSED_HEADER] !== undefined
          ? `${REFUSED_ID_PREFIX}${envelope.messageId}`
          : duplicating
            ? `${envelope.messageId}#dup-${(duplicates += 1)}`
            : envelope.messageId,
      ...extra,
    };
    const transport = provisioner ? new ProvisionedServiceBusTransport(config, provisioner) : new ServiceBusTransport(config);
    if (provisioner) {
      const publish = transport.publish.bind(transport);
      transport.publish = (messages, options) => {
        for (const message of messages) used.add(message.topic);
        return publish(messages, options);
      };
    }
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
      // Cut the socket as a crash would: nothing settled, nothing closed AMQP-wise. On a real
      // namespace (no proxy) the nearest thing: its clients close at once, unsettled.
      if (entry.proxy) await entry.proxy.close();
      else await (victim as ServiceBusTransport).source.close();
      // The transport closes the clients it made.
      void victim.close().catch(() => undefined);
    },
    // Cuts every connection of this fixture's clients and refuses new ones until `end`.
    // (Not on a real namespace: there is no proxy to cut; the outage cases skip, saying so.)
    ...(provisioner
      ? {}
      : {
          outage: {
            begin: async () => {
              await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy?.close() ?? Promise.resolve()));
            },
            end: async () => {
              await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy?.open() ?? Promise.resolve()));
            },
          },
        }),
    // The stand-in refuses the ids it is told to; a real namespace has no such switch (the case skips, saying so).
    ...(provisioner
      ? {}
      : {
          rejectPublish: async (predicate: (envelope: Envelope) => boolean) => {
            rejecting = predicate;
          },
        }),
    // The receiver's settle call (complete, abandon, dead-letter) fails as the service's answer would.
    failSettles: async (kind, count = 1) => {
      settleFaults[kind] += count;
    },
    // Marked so that the stand-in refuses it (its broker id says so); nothing validate() could
    // foresee. On a real namespace: over the entity's maximum message size (256 KiB on a Standard
    // namespace; a Premium namespace takes more: run the real-namespace tests on Standard), which
    // the transport's own size check refuses first.
    refusable: (envelope) =>
      provisioner ? { ...envelope, payload: JSON.stringify('x'.repeat(270 * 1024)) } : { ...envelope, headers: { ...envelope.headers, [REFUSED_HEADER]: 'yes' } },
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
      await Promise.all([...entries].filter(([, entry]) => !entry.killed).map(([t]) => t.close().catch(() => undefined)));
      await Promise.all([...entries.values()].map((entry) => entry.proxy?.close() ?? Promise.resolve()));
    },
  };
}
