import type { Transport } from '@courier/core';
import type { ChannelModel } from 'amqplib';
import { RabbitMqTransport, type RabbitMqTransportConfig } from '../../src/index.js';
import { deleteTopology, openConnection, rabbitmqctl, TEST_TIERS_MS } from './broker.js';

// Structural copies of @courier/conformance's fixture types until that package exports them.
interface FixtureContext {
  readonly testId: string;
}
interface TransportFixture {
  readonly transport: Transport;
  connect(): Promise<Transport>;
  kill(transport: Transport): Promise<void>;
  readonly outage?: { begin(): Promise<void>; end(): Promise<void> };
  close(): Promise<void>;
}

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
  let networkDown = false;

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
        const connection = await openConnection(`${prefix}-${transports.length}`);
        handle.connections.push(connection);
        return connection;
      },
    });
    // Remember every consumer so `close` can delete its queues.
    const subscribe = transport.subscribe.bind(transport);
    transport.subscribe = (endpoint, handler) => {
      consumers.add(endpoint.consumer);
      return subscribe(endpoint, handler);
    };
    handles.set(transport, handle);
    transports.push(transport);
    return transport;
  };

  const cut = (handle: Handle): void => {
    for (const connection of handle.connections.splice(0)) destroySocket(connection);
  };

  const transport = await create();
  const fixture: TransportFixture = {
    transport,
    connect: create,
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
              for (const handle of handles.values()) cut(handle);
            },
            end: async () => {
              networkDown = false;
            },
          },
        }),
    async close() {
      const abandoned = AbortSignal.timeout(2_000);
      await Promise.all(transports.map((t) => t.close({ signal: abandoned })));
      await deleteTopology(prefix, [...consumers], options.config?.delayTiersMs ?? TEST_TIERS_MS);
    },
  };
  return fixture;
}

/** Destroys the TCP socket under an amqplib connection: no AMQP close, like a process dying. */
export function destroySocket(connection: ChannelModel): void {
  const inner = (connection as unknown as { connection: { stream: { destroy(): void } } }).connection;
  inner.stream.destroy();
}
