import { describe, expect, it } from 'vitest';
import {
  ClosedError,
  ConfigError,
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  createBus,
  defineMessage,
  type BusConfig,
  type InMemoryTransaction,
} from '@courier/core';
import { eventually, harness, spyTransport } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

function configProblems(act: () => unknown): readonly string[] {
  try {
    act();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return (error as ConfigError).problems;
  }
  return expect.unreachable('expected a ConfigError');
}

describe('bus lifecycle', () => {
  it('start({ relay: false }) runs only the consumers, start({ consumers: false }) only the relay', async () => {
    await using h = harness();
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push(message.messageId);
    });
    await h.bus.start({ relay: false });
    expect(h.bus.health()).toMatchObject({ status: 'running', relay: { running: false }, consumers: [{ consumer: 'sink', connected: true, inFlight: 0 }] });

    const relayOnly = h.another();
    relayOnly.subscribe('never-started', Placed, async () => {
      throw new Error('consumers of a relay-only bus must not run');
    });
    await relayOnly.start({ consumers: false });
    expect(relayOnly.health()).toMatchObject({ status: 'running', relay: { running: true }, consumers: [] });

    let id = '';
    await h.commit((tx) => {
      id = h.bus.outbox(tx).publish(Placed, {});
    });
    await eventually(() => expect(seen).toEqual([id]));
    // The message went through the relay-only bus's relay and the consumer-only bus's consumer.
    expect(relayOnly.health().counters).toMatchObject({ published: 1, processed: 0 });
    expect(h.bus.health().counters).toMatchObject({ published: 0, processed: 1 });
    expect(await h.connection.deadLetters.list('never-started')).toEqual([]);
  });

  it('stop is idempotent: concurrent calls share one stop, later calls resolve at once, start after stop is refused', async () => {
    await using h = harness();
    h.bus.subscribe('sink', Placed, async () => {});
    await h.bus.start();
    const first = h.bus.stop();
    const second = h.bus.stop();
    expect(second).toBe(first);
    await Promise.all([first, second]);
    expect(h.bus.health()).toMatchObject({ status: 'stopped', relay: { running: false }, consumers: [] });
    await h.bus.stop();
    await expect(h.bus.start()).rejects.toThrowError(ClosedError);
    // A bus that never started stops too.
    await h.another().stop();
  });

  it('stop is graceful: an in-flight handler finishes within timeoutMs, commits and is acknowledged', async () => {
    const transports: ReturnType<typeof spyTransport>[] = [];
    await using h = harness({ transport: (inner) => transports[transports.push(spyTransport(inner)) - 1]! });
    const effects: string[] = [];
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let started = false;
    h.bus.subscribe('sink', Placed, async (message, ctx) => {
      started = true;
      await released;
      ctx.tx.onCommit(() => effects.push(message.messageId));
    });
    await h.bus.start();
    let id = '';
    await h.commit((tx) => {
      id = h.bus.outbox(tx).publish(Placed, {});
    });
    await eventually(() => expect(started).toBe(true));
    expect(h.bus.health().consumers[0]?.inFlight).toBe(1);
    let stopped = false;
    const stopping = h.bus.stop({ timeoutMs: 5_000 }).then(() => {
      stopped = true;
    });
    await eventually(() => expect(h.bus.health().status).toBe('stopping'));
    expect(stopped).toBe(false);
    release();
    await stopping;
    expect(effects).toEqual([id]);
    expect(transports[0]!.settlements).toEqual([{ messageId: id, consumer: 'sink', how: 'ack', attempt: 1 }]);
  });

  it('stop abandons a handler that outlives timeoutMs: its signal aborts and the delivery is left unsettled', async () => {
    const transports: ReturnType<typeof spyTransport>[] = [];
    await using h = harness({ transport: (inner) => transports[transports.push(spyTransport(inner)) - 1]! });
    let signal: AbortSignal | undefined;
    const effects: string[] = [];
    h.bus.subscribe('sink', Placed, async (_message, ctx) => {
      signal = ctx.signal;
      ctx.tx.onCommit(() => effects.push('committed'));
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
      throw new Error('gave up');
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, {});
    });
    await eventually(() => expect(signal).toBeDefined());
    await h.bus.stop({ timeoutMs: 20 });
    expect(signal!.aborted).toBe(true);
    expect(effects).toEqual([]);
    expect(transports[0]!.settlements).toEqual([]);
    expect(h.bus.health().counters).toMatchObject({ processed: 0, retries: 0, deadLettered: 0 });
  });

  it('await using stops the bus', async () => {
    const db = new InMemoryDatabase();
    await using broker = new InMemoryBroker();
    const outbox = new InMemoryOutboxStore({ database: db });
    let bus;
    {
      await using scoped = createBus<InMemoryTransaction>({ outbox, inbox: new InMemoryInboxStore({ database: db }), transport: broker.connect() });
      bus = scoped;
      await scoped.start();
      expect(scoped.health().status).toBe('running');
    }
    expect(bus.health()).toMatchObject({ status: 'stopped', relay: { running: false } });
    await expect(bus.start()).rejects.toThrowError(ClosedError);
  });

  it('refuses subscribe after start, naming the consumer', async () => {
    await using h = harness();
    await h.bus.start();
    const problems = configProblems(() => h.bus.subscribe('late', Placed, async () => {}));
    expect(problems).toEqual(["subscribe 'late' before start()"]);
  });

  it('refuses an ordered subscription on a transport without orderingByKey', async () => {
    await using h = harness({ transport: (inner) => spyTransport(inner, { orderingByKey: false }) });
    const problems = configProblems(() => h.bus.subscribe('shipping', Placed, async () => {}, { ordered: true }));
    expect(problems).toEqual(["consumer 'shipping' asks for ordered delivery, but the transport does not declare 'orderingByKey'"]);
    h.bus.subscribe('shipping', Placed, async () => {});
  });

  it('refuses a second consumer group on a topic when the transport does not fan out (competing consumers would split the messages)', async () => {
    const Shipped = defineMessage('orders.OrderShipped', { version: 1, topic: 'shipments' });
    await using h = harness({ transport: (inner) => spyTransport(inner, { fanOut: false }) });
    h.bus.subscribe('billing', Placed, async () => {});
    // The same group may handle more types of the topic, and another group another topic.
    h.bus.subscribe('billing', defineMessage('orders.OrderAmended', { version: 1, topic: Placed.topic }), async () => {});
    h.bus.subscribe('shipping', Shipped, async () => {});
    const problems = configProblems(() => h.bus.subscribe('audit', Placed, async () => {}));
    expect(problems).toEqual([
      `consumer 'audit' subscribes to topic '${Placed.topic}', which consumer 'billing' already consumes, but the transport does not declare 'fanOut': consumers of one topic compete for its messages there, so each group would get only part of them`,
    ]);
    // Declared true (or absent, as on the in-memory broker): every group gets its own copy.
    await using fanning = harness({ transport: (inner) => spyTransport(inner, { fanOut: true }) });
    fanning.bus.subscribe('billing', Placed, async () => {});
    fanning.bus.subscribe('audit', Placed, async () => {});
  });

  it('lists every problem with a subscription at once', async () => {
    await using h = harness();
    h.bus.subscribe('billing', Placed, async () => {}, { ordered: true });
    const problems = configProblems(() =>
      h.bus.subscribe('billing', Placed, 'not a function' as never, { ordered: false, concurrency: 0, maxCrashes: 1.5, retry: { maxAttempts: 0 } }),
    );
    expect(problems).toEqual([
      "subscribe 'billing': handler must be a function",
      "consumer 'billing' already handles 'orders.OrderPlaced'",
      "consumer 'billing' cannot be both ordered and unordered: options apply to the whole consumer",
      "consumer 'billing': 'concurrency' must be an integer of 1 or more",
      "consumer 'billing': 'maxCrashes' must be an integer of 1 or more",
      "'billing.retry.maxAttempts' must be an integer of 1 or more",
    ]);
    expect(configProblems(() => h.bus.subscribe('bad name!', Placed, async () => {}))[0]).toContain('consumer name "bad name!" is malformed');
  });

  it('createBus lists every problem with its config', () => {
    const problems = configProblems(() =>
      createBus({
        outbox: {} as never,
        inbox: { run: 1 } as never,
        transport: null as never,
        maxPayloadBytes: -1,
        retry: { maxAttempts: 0, jitter: 2 },
        relay: { batchSize: 1.5, leaseMs: 0, pollIntervalMs: -1, poison: 'drop' as never, retry: { multiplier: 0.5 }, pause: { initialDelayMs: 0 } },
      } as BusConfig<unknown>),
    );
    expect(problems).toEqual([
      "'outbox' must be an OutboxStore",
      "'inbox' must be an InboxStore",
      "'transport' must be a Transport",
      "'maxPayloadBytes' must be a positive integer",
      "'relay.batchSize' must be an integer",
      "'relay.leaseMs' must be a positive number",
      "'relay.pollIntervalMs' must be a positive number",
      "'relay.pause.initialDelayMs' must be a positive number",
      "'relay.poison' must be 'park' or 'halt'",
      "'relay.retry.multiplier' must be 1 or more",
      "'retry.maxAttempts' must be an integer of 1 or more",
      "'retry.jitter' must be between 0 and 1",
    ]);
    expect(() => createBus(undefined as never)).toThrowError(ConfigError);
  });

  it('refuses to start consumers without an inbox store, and can start again once asked for the relay only', async () => {
    const db = new InMemoryDatabase();
    await using broker = new InMemoryBroker();
    const bus = createBus<InMemoryTransaction>({ outbox: new InMemoryOutboxStore({ database: db }), transport: broker.connect() });
    bus.subscribe('sink', Placed, async () => {});
    await expect(bus.start()).rejects.toThrowError("consumers need an 'inbox' store in createBus(...)");
    expect(bus.health().status).toBe('stopped');
    await bus.start({ consumers: false });
    expect(bus.health()).toMatchObject({ status: 'running', relay: { running: true }, consumers: [] });
    await bus.stop();
  });

  it('a start that fails (broker down, failFast) shuts down what it started and may be tried again', async () => {
    await using h = harness();
    h.bus.subscribe('a', Placed, async () => {});
    h.bus.subscribe('b', Placed, async () => {});
    h.broker.setAvailable(false);
    await expect(h.bus.start({ failFast: true })).rejects.toMatchObject({ name: 'TransportError', retriable: true });
    expect(h.bus.health()).toMatchObject({ status: 'stopped', relay: { running: false }, consumers: [] });
    h.broker.setAvailable(true);
    await h.bus.start();
    expect(h.bus.health().consumers.map((consumer) => consumer.consumer)).toEqual(['a', 'b']);
  });

  // Issue 36: the console's "Relays and consumers" shows which lease each relay holds.
  it('health().relay names the owner the relay claims under and the lease of each batch it is sending', async () => {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let sending = 0;
    await using h = harness({
      bus: { relay: { owner: 'relay-under-test' } },
      transport: (connection) => ({
        ...spyTransport(connection),
        publish: async (messages, options) => {
          sending += messages.length;
          await gate;
          return connection.publish(messages, options);
        },
      }),
    });
    await h.commit((tx) => {
      for (let index = 0; index < 3; index += 1) h.bus.outbox(tx).publish(Placed, {});
    });
    await h.bus.start({ consumers: false });
    await eventually(() => expect(sending).toBe(3));
    const { relay } = h.bus.health();
    expect(relay.owner).toBe('relay-under-test');
    expect(relay.leases).toEqual([{ token: expect.stringMatching(/^\d+$/), rows: 3, heldForMs: expect.any(Number) }]);
    expect(relay.leases[0]!.heldForMs).toBeGreaterThanOrEqual(0);
    open();
    await eventually(() => expect(h.bus.health().relay.leases).toEqual([]));
    expect(h.bus.health().counters.published).toBe(3);
  });

  it('health() reports status, relay, consumers and counters', async () => {
    await using h = harness();
    expect(h.bus.health()).toEqual({
      status: 'stopped',
      ready: false,
      relay: { running: false, ready: false, paused: false, lastError: null, sinceLastClaimMs: -1, owner: null, leases: [] },
      consumers: [],
      counters: { published: 0, publishFailures: 0, relayPauses: 0, processed: 0, retries: 0, deadLettered: 0, duplicates: 0, haltedKeys: 0, ackFailures: 0, settleFailures: 0 },
    });
    h.bus.subscribe('a', Placed, async () => {});
    h.bus.subscribe('b', Placed, async () => {});
    await h.bus.start();
    await eventually(() => expect(h.bus.health().relay.sinceLastClaimMs).toBeGreaterThanOrEqual(0));
    expect(h.bus.health()).toEqual({
      status: 'running',
      ready: true,
      relay: { running: true, ready: true, paused: false, lastError: null, sinceLastClaimMs: expect.any(Number), owner: expect.any(String), leases: [] },
      consumers: [
        { consumer: 'a', connected: true, inFlight: 0, lastError: null },
        { consumer: 'b', connected: true, inFlight: 0, lastError: null },
      ],
      counters: expect.objectContaining({ published: 0 }),
    });
  });
});
