// A worker started while its broker or its database is down: bus.start() resolves, health()
// says which part is not ready and why, and the worker becomes ready by itself and moves a
// message end to end once the server is reachable. The outage is a TCP proxy of the test's
// own that refuses connections, so the shared servers stay up for everyone else.
import { createBus, defineMessage, type Bus } from '@courier/core';
import { TcpProxy, targetOf, throughProxy, uniqueId } from '@courier/conformance';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { RabbitMqTransport } from '@courier/rabbitmq';
import type { EntityManager } from '@mikro-orm/core';
import { MikroORM } from '@mikro-orm/postgresql';
import { afterEach, describe, expect, it } from 'vitest';
import { PG_URL, createPostgresFixture } from '../../plugins/mikro-orm/test/support/fixture.js';
import { BROKER_URL, TEST_TIERS_MS, deleteTopology, eventually } from '../../plugins/rabbitmq/test/support/broker.js';

const Ping = defineMessage('e2e.StartOutagePing', { version: 1 });

/** Cleanups of the running test, last first. */
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function setUp() {
  const testId = uniqueId();
  const prefix = `courier-${testId}`;
  const store = await createPostgresFixture({ testId });
  cleanups.push(() => store.close());
  cleanups.push(() => deleteTopology(prefix, ['sink']));
  const transport = (connection: string) => {
    const created = new RabbitMqTransport({ connection, prefix, delayTiersMs: TEST_TIERS_MS, reconnect: { initialDelayMs: 50, maxDelayMs: 500 } });
    cleanups.push(() => created.close());
    return created;
  };
  return { store, transport };
}

/** Registers a consumer that records what it handled, and returns the record. */
function sink(bus: Bus<EntityManager>): string[] {
  const seen: string[] = [];
  bus.subscribe('sink', Ping, async (message) => {
    seen.push(message.messageId);
  });
  return seen;
}

const fast = { retry: { initialDelayMs: 20, maxDelayMs: 200 }, relay: { pollIntervalMs: 200, pause: { initialDelayMs: 50, maxDelayMs: 500 } } };

describe('a worker started during an outage (postgresql+rabbitmq)', () => {
  it('RabbitMQ refusing connections: start() resolves, the consumer is not ready with the reason, and a message flows once the broker is reachable', async () => {
    const { store, transport } = await setUp();
    const proxy = await TcpProxy.create(targetOf(BROKER_URL, 5672));
    cleanups.push(() => proxy.close());
    const bus = createBus({ outbox: store.outbox, inbox: store.inbox, transport: transport(throughProxy(BROKER_URL, proxy)), ...fast });
    cleanups.push(() => bus.stop({ timeoutMs: 2_000 }));
    const seen = sink(bus);

    await bus.start();
    expect(bus.health()).toMatchObject({
      status: 'degraded',
      ready: false,
      consumers: [{ consumer: 'sink', connected: false, lastError: expect.stringContaining('ECONNREFUSED') }],
    });
    const id = await store.transaction(async (em) => bus.outbox(em).publish(Ping, {}));
    // The relay waits for the consumer's queues (a message published before they exist is unroutable).
    expect(bus.health().relay).toMatchObject({ running: false, ready: false, lastError: expect.stringContaining(`consumer 'sink' has subscribed`) });

    await proxy.open();
    await eventually(() => expect(seen).toEqual([id]), 30_000);
    await eventually(() => expect(bus.health()).toMatchObject({ status: 'running', ready: true, consumers: [{ connected: true, lastError: null }] }), 20_000);
  });

  it('PostgreSQL refusing connections: start() resolves, the relay is not ready with the reason, and a message flows once the database is reachable', async () => {
    const { store, transport } = await setUp();
    // Committed before the outage, through the database directly.
    const producer = createBus({ outbox: store.outbox, transport: transport(BROKER_URL) });
    const id = await store.transaction(async (em) => producer.outbox(em).publish(Ping, {}));

    const proxy = await TcpProxy.create(targetOf(PG_URL, 5432));
    cleanups.push(() => proxy.close());
    // The worker's own ORM reaches PostgreSQL only through the proxy (closed: refused).
    const orm = await MikroORM.init({ clientUrl: throughProxy(PG_URL, proxy), entities: [], discovery: { warnWhenNoEntities: false }, pool: { min: 0, max: 4 }, connect: false });
    cleanups.push(() => orm.close(true));
    const tablePrefix = store.tablePrefix;
    const outbox = new MikroOrmOutboxStore({ orm, tablePrefix });
    cleanups.push(() => outbox.close());
    const bus = createBus({ outbox, inbox: new MikroOrmInboxStore({ orm, tablePrefix }), transport: transport(BROKER_URL), ...fast });
    cleanups.push(() => bus.stop({ timeoutMs: 2_000 }));
    const seen = sink(bus);

    await bus.start();
    expect(bus.health()).toMatchObject({
      status: 'degraded',
      ready: false,
      relay: { running: true, ready: false, paused: true, lastError: expect.stringContaining('ECONNREFUSED') },
      consumers: [{ consumer: 'sink', connected: true, lastError: null }],
    });

    await proxy.open();
    await eventually(() => expect(seen).toEqual([id]), 30_000);
    await eventually(() => expect(bus.health()).toMatchObject({ status: 'running', ready: true, relay: { ready: true } }), 20_000);
  });
});
