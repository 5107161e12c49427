import type { FixtureContext, TransportFixture } from '@courier/conformance';
import type { Envelope, Transport } from '@courier/core';
import type { ChannelModel, ConfirmChannel } from 'amqplib';
import { fromAmqpMessage, RabbitMqTransport, type RabbitMqTransportConfig } from '../../src/index.js';
import { deleteTopology, eventually, openConnection, rabbitmqctl, TEST_TIERS_MS } from './broker.js';
import { locateInQueues } from './locate.js';

/** Options of {@link createRabbitMqFixture}. */
export interface RabbitMqFixtureOptions {
  /**
   * How `outage` makes the broker unavailable: `'network'` cuts this fixture's connections
   * and refuses new ones (safe beside other tests); `'broker'` runs `rabbitmqctl stop_app`
   * / `start_app` (restart project only: it disturbs every test on the broker).
   */
  readonly outage?: 'network' | 'broker';
  /** Overrides for every transport the fixture creates. */
  readonly config?: Partial<RabbitMqTransportConfig>;
}

/** A socket-level handle on one transport's connections, so a test can cut them like a crash would. */
interface Handle {
  readonly connections: ChannelModel[];
  killed: boolean;
}

/**
 * The RabbitMQ transport fixture for the conformance suite: every name under the prefix
 * `courier-<testId>`, connections opened through a factory so `kill` can destroy a
 * transport's socket without any AMQP close (as a crash would) and keep it from
 * reconnecting; `close` closes every transport and deletes what the test declared.
 */
export async function createRabbitMqFixture(context: FixtureContext, options: RabbitMqFixtureOptions = {}): Promise<TransportFixture> {
  const prefix = `courier-${context.testId}`;
  const handles = new Map<Transport, Handle>();
  const transports: RabbitMqTransport[] = [];
  const consumers = new Set<string>();
  const refusals: ((envelope: Envelope) => boolean)[] = [];
  const settleFaults: SettleFaults = { ack: 0, retry: 0, deadLetter: 0 };
  // Messages the suite wants refused are diverted to this queue, which holds nothing and
  // overflows with reject-publish: the broker itself nacks them.
  const refuseQueue = `${prefix}.refuse`;
  let networkDown = false;
  // Counts outages begun: a connection whose handshake spans the start of one was cut by it.
  let outagesBegun = 0;

  const create = async (): Promise<RabbitMqTransport> => {
    const handle: Handle = { connections: [], killed: false };
    const transport = new RabbitMqTransport({
      prefix,
      delayTiersMs: TEST_TIERS_MS,
      reconnect: { initialDelayMs: 50, maxDelayMs: 1_000 },
      ...options.config,
      connection: async () => {
        if (handle.killed) throw new Error('this transport was killed');
        if (networkDown) throw new Error('simulated network outage');
        const epoch = outagesBegun;
        const connection = await openConnection(`${prefix}-${transports.length}`);
        // The handshake was in flight when the transport was killed or the network was cut:
        // a real cut would have reset it. Letting it through would leave a transport
        // connected in the middle of an outage (and `outage.begin` waiting for it in vain).
        if (handle.killed || networkDown || outagesBegun !== epoch) {
          destroySocket(connection);
          throw new Error(handle.killed ? 'this transport was killed' : 'simulated network outage');
        }
        handle.connections.push(connection);
        divertRefused(connection, refuseQueue, (envelope) => refusals.some((refuse) => refuse(envelope)), settleFaults);
        return connection;
      },
    });
    // Remember every consumer so `close` can delete its queues: a provisioned one has them
    // too, and durable queues outlive the test otherwise.
    const subscribe = transport.subscribe.bind(transport);
    transport.subscribe = (endpoint, handler) => {
      consumers.add(endpoint.consumer);
      return subscribe(endpoint, handler);
    };
    const provision = transport.provision.bind(transport);
    transport.provision = (endpoint) => {
      consumers.add(endpoint.consumer);
      return provision(endpoint);
    };
    handles.set(transport, handle);
    transports.push(transport);
    return transport;
  };

  const cut = (handle: Handle): void => {
    for (const connection of handle.connections.splice(0)) destroySocket(connection);
  };

  // An outage has begun once every transport has noticed it, as it would with a real one.
  const untilDisconnected = () => eventually(() => {
    if (transports.some((t) => t.connected)) throw new Error('a transport still believes it is connected');
  });

  const declareRefuseQueue = async (): Promise<void> => {
    const connection = await openConnection(`${prefix}-refuse`);
    try {
      const channel = await connection.createChannel();
      await channel.assertQueue(refuseQueue, { durable: false, arguments: { 'x-max-length': 0, 'x-overflow': 'reject-publish' } });
    } finally {
      await connection.close();
    }
  };

  const transport = await create();
  const fixture: TransportFixture = {
    transport,
    connect: create,
    async rejectPublish(predicate) {
      await declareRefuseQueue();
      refusals.push(predicate);
    },
    async failSettles(kind, count = 1) {
      if (kind !== 'ack') await declareRefuseQueue();
      settleFaults[kind] += count;
    },
    refusable(envelope) {
      return { ...envelope, headers: { ...envelope.headers, [CLOSE_CHANNEL_HEADER]: 'yes' } };
    },
    // Plain bytes on the topic exchange, without the transport's courier-* headers or message id.
    async publishMalformed(topic) {
      const connection = await openConnection(`${prefix}-malformed`);
      try {
        const channel = await connection.createConfirmChannel();
        channel.publish(`${prefix}.topics`, topic, Buffer.from('not a courier envelope'), { persistent: true });
        await channel.waitForConfirms();
      } finally {
        await connection.close();
      }
    },
    // A header RabbitMQ adds itself when it dead-letters: a forged one would not round-trip.
    refusedByValidate: (envelope) => ({ ...envelope, headers: { ...envelope.headers, 'x-death': 'forged' } }),
    async kill(target) {
      const handle = handles.get(target);
      if (!handle) throw new Error('kill: not a transport of this fixture');
      handle.killed = true;
      cut(handle);
    },
    ...(options.outage === 'broker'
      ? {
          outage: {
            begin: async () => {
              await rabbitmqctl('stop_app');
              await untilDisconnected();
            },
            end: async () => {
              await rabbitmqctl('start_app');
              await rabbitmqctl('await_startup');
            },
          },
        }
      : {
          outage: {
            begin: async () => {
              networkDown = true;
              outagesBegun++;
              for (const handle of handles.values()) cut(handle);
              await untilDisconnected();
            },
            end: async () => {
              networkDown = false;
            },
          },
        }),
    locate: (ids) => locateInQueues(prefix, [...consumers], options.config?.delayTiersMs ?? TEST_TIERS_MS, ids),
    async close() {
      const abandoned = AbortSignal.timeout(2_000);
      await Promise.all(transports.map((t) => t.close({ signal: abandoned })));
      await deleteTopology(prefix, [...consumers], options.config?.delayTiersMs ?? TEST_TIERS_MS, [refuseQueue]);
    },
  };
  return fixture;
}

/** Destroys the TCP socket under an amqplib connection: no AMQP close, like a process dying. */
export function destroySocket(connection: ChannelModel): void {
  const inner = (connection as unknown as { connection: { stream: { destroy(error?: Error): void } } }).connection;
  // amqplib watches the socket's 'error' and 'end', not 'close': destroy with an error so
  // the client notices at once, as it would a reset connection.
  inner.stream.destroy(new Error('socket destroyed by the test (simulated crash)'));
}

/**
 * Marks a message (see `refusable`) that the confirm channel sends with a `CC` header of
 * the wrong type (a string): RabbitMQ then closes the publish channel (406
 * PRECONDITION_FAILED), the worst way a broker refuses content. It is added on the wire,
 * after the transport's own checks, because those refuse a `CC` header before sending.
 */
const CLOSE_CHANNEL_HEADER = 'conformance-close-channel';

/** Settles the fixture is to fail next, by kind (`TransportFixture.failSettles`). */
type SettleFaults = Record<'ack' | 'retry' | 'deadLetter', number>;

/** Whether one more fault of `kind` is due (and counts it off). */
function takeFault(faults: SettleFaults, kind: keyof SettleFaults): boolean {
  if (faults[kind] <= 0) return false;
  faults[kind] -= 1;
  return true;
}

/**
 * The settle fault a copy published straight to `routingKey` (the default exchange) is
 * subject to: a delay-tier queue's copy (`retry`) or the dead-letter queue's (`deadLetter`).
 */
function copyKind(exchange: string, routingKey: string): 'retry' | 'deadLetter' | undefined {
  if (exchange !== '') return undefined;
  if (/\.retry\.[^.]+$/.test(routingKey)) return 'retry';
  if (routingKey.endsWith('.dead')) return 'deadLetter';
  return undefined;
}

/**
 * Makes confirm channels of `connection` publish messages matching `refused` to
 * `refuseQueue` instead (test support for `rejectPublish`): the broker, not the client,
 * then nacks them. Messages marked with {@link CLOSE_CHANNEL_HEADER} get a string `CC`.
 * With `faults` (`failSettles`): the next delay-tier or dead-letter copies due to fail go to
 * `refuseQueue` too (the broker nacks them), and the next acks due to fail close their
 * channel (the broker takes the delivery back) and throw, as an ack on a channel that died.
 */
function divertRefused(connection: ChannelModel, refuseQueue: string, refused: (envelope: Envelope) => boolean, faults: SettleFaults): void {
  const createChannel = connection.createChannel.bind(connection);
  connection.createChannel = async (...args) => {
    const channel = await createChannel(...args);
    const ack = channel.ack.bind(channel);
    channel.ack = (message, allUpTo) => {
      if (takeFault(faults, 'ack')) {
        void channel.close().catch(() => undefined);
        throw new Error('rabbitmq fixture: the channel died under the ack (injected ack fault)');
      }
      ack(message, allUpTo);
    };
    return channel;
  };
  const createConfirmChannel = connection.createConfirmChannel.bind(connection);
  connection.createConfirmChannel = async (...args) => {
    const channel: ConfirmChannel = await createConfirmChannel(...args);
    const publish = channel.publish.bind(channel);
    channel.publish = (exchange, routingKey, content, options, callback) => {
      let divert = false;
      try {
        divert = refused(fromAmqpMessage({ content, properties: options ?? {} }));
      } catch {
        // Not an envelope (a retry or dead-letter copy is one too; anything else passes).
      }
      const kind = copyKind(exchange, routingKey);
      if (kind !== undefined && takeFault(faults, kind)) divert = true;
      if (divert) return publish('', refuseQueue, content, options, callback);
      const headers = options?.headers as Record<string, unknown> | undefined;
      const poisoned = headers?.[CLOSE_CHANNEL_HEADER] !== undefined ? { ...options, headers: { ...headers, CC: 'x' } } : options;
      return publish(exchange, routingKey, content, poisoned, callback);
    };
    return channel;
  };
}
