// bus.start() during a broker or database outage: the bus begins anyway, reports the parts
// that cannot start yet as not ready (with why), and they start by themselves when their
// server returns — unless the caller asked to fail fast.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  InMemoryOutboxStore,
  StorageError,
  TransportError,
  defineMessage,
  type ClaimOptions,
  type ClaimedBatch,
  type Subscription,
  type Transport,
} from '@courier/core';
import { FAST, eventually, harness } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/**
 * Wraps `inner` so that each `subscribe` call is counted and may be held until released,
 * and the order of the first successful subscribe and the publish calls is recorded.
 */
function gatedTransport(inner: Transport) {
  const state = { calls: 0, closed: 0, hold: false, held: [] as (() => void)[], events: [] as ('subscribed' | 'publish')[] };
  const transport: Transport = {
    capabilities: inner.capabilities,
    publish: (messages, options) => {
      state.events.push('publish');
      return inner.publish(messages, options);
    },
    subscribe: async (endpoint, handler) => {
      state.calls += 1;
      if (state.hold) await new Promise<void>((resolve) => state.held.push(resolve));
      const subscription = await inner.subscribe(endpoint, handler);
      state.events.push('subscribed');
      return {
        close: async () => {
          state.closed += 1;
          await subscription.close();
        },
      } satisfies Subscription;
    },
    close: () => inner.close(),
  };
  return { transport, state };
}

/**
 * No subscribe try after this point. An absence cannot be polled for: wait several times
 * the longest backoff (40 ms) and look.
 */
async function expectNoFurtherTries(state: { readonly calls: number }): Promise<void> {
  const calls = state.calls;
  await sleep(FAST.relay.pause.maxDelayMs * 5);
  expect(state.calls, 'a subscribe try came after the bus should have stopped trying').toBe(calls);
}

describe('bus.start() during an outage', () => {
  it('broker down: start() resolves, the consumer is not ready with the reason, and it subscribes by itself when the broker returns', async () => {
    const gates: ReturnType<typeof gatedTransport>[] = [];
    await using h = harness({ transport: (inner) => gates[gates.push(gatedTransport(inner)) - 1]!.transport });
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push(message.messageId);
    });
    h.broker.setAvailable(false);
    await h.bus.start();

    expect(h.bus.health()).toMatchObject({
      status: 'degraded',
      ready: false,
      consumers: [{ consumer: 'sink', connected: false, lastError: expect.stringContaining('unavailable') }],
    });
    let id = '';
    await h.commit((tx) => {
      id = h.bus.outbox(tx).publish(Placed, {});
    });
    // The relay waits for the consumer: its queues must exist before anything is published.
    expect(h.bus.health().relay).toMatchObject({ running: false, ready: false, lastError: expect.stringContaining(`consumer 'sink' has subscribed`) });

    h.broker.setAvailable(true);
    await eventually(() => expect(seen).toEqual([id]), 10_000);
    await eventually(() =>
      expect(h.bus.health()).toMatchObject({ status: 'running', ready: true, relay: { ready: true }, consumers: [{ connected: true, lastError: null }] }),
    );
    expect(gates[0]!.state.events[0]).toBe('subscribed');
  });

  it('database down: start() resolves, the relay is not ready with the reason, and it claims by itself (and is woken again) when the database returns', async () => {
    // A poll so slow that only the store's wake-up signal can deliver promptly: the signal
    // must be set up again after the outage, not given up for polling.
    await using h = harness({ bus: { relay: { ...FAST.relay, pollIntervalMs: 120_000 } } });
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push(message.messageId);
    });
    let before = '';
    await h.commit((tx) => {
      before = h.bus.outbox(tx).publish(Placed, {});
    });
    h.db.setAvailable(false);
    await h.bus.start();

    expect(h.bus.health()).toMatchObject({
      status: 'degraded',
      ready: false,
      relay: { running: true, ready: false, paused: true, lastError: expect.stringContaining('unavailable') },
      consumers: [{ consumer: 'sink', connected: true, lastError: null }],
    });

    h.db.setAvailable(true);
    await eventually(() => expect(seen).toEqual([before]), 10_000);
    await eventually(() => expect(h.bus.health()).toMatchObject({ status: 'running', ready: true, relay: { ready: true, paused: false } }));
    // Every relay loop idle (none claimed for many times the longest pause): from here only a
    // wake-up, not a loop still backing off, can pick up the next message in time.
    await eventually(() => expect(h.bus.health().relay.sinceLastClaimMs).toBeGreaterThan(FAST.relay.pause.maxDelayMs * 8));

    let after = '';
    await h.commit((tx) => {
      after = h.bus.outbox(tx).publish(Placed, {});
    });
    await eventually(() => expect(seen).toEqual([before, after]), 10_000);
  });

  it('failFast: start() rejects on a broker or database outage, stops what started, and may be called again', async () => {
    await using h = harness();
    h.bus.subscribe('sink', Placed, async () => {});
    h.broker.setAvailable(false);
    await expect(h.bus.start({ failFast: true })).rejects.toThrowError(TransportError);
    expect(h.bus.health()).toMatchObject({ status: 'stopped', ready: false, relay: { running: false }, consumers: [] });

    h.broker.setAvailable(true);
    h.db.setAvailable(false);
    await expect(h.bus.start({ failFast: true })).rejects.toThrowError(StorageError);
    expect(h.bus.health()).toMatchObject({ status: 'stopped', relay: { running: false }, consumers: [] });

    h.db.setAvailable(true);
    await h.bus.start({ failFast: true });
    expect(h.bus.health()).toMatchObject({ status: 'running', ready: true, consumers: [{ connected: true }] });
  });

  it('non-retriable failures reject start() without failFast: a subscription the transport refuses, a claim against a missing schema', async () => {
    await using h = harness({
      transport: (inner) => ({
        ...inner,
        capabilities: inner.capabilities,
        publish: (messages, options) => inner.publish(messages, options),
        subscribe: () => Promise.reject(new ConfigError(`queues of consumer 'sink' exist with other settings`)),
        close: () => inner.close(),
      }),
    });
    h.bus.subscribe('sink', Placed, async () => {});
    await expect(h.bus.start()).rejects.toThrowError(ConfigError);
    expect(h.bus.health()).toMatchObject({ status: 'stopped', relay: { running: false }, consumers: [] });

    class SchemaMissing extends InMemoryOutboxStore {
      override claim(_options: ClaimOptions): Promise<ClaimedBatch> {
        return Promise.reject(new StorageError(`'claim' failed: the courier schema is missing`, { code: 'SCHEMA_MISSING', retriable: false }));
      }
    }
    const relayOnly = h.another({ outbox: new SchemaMissing({ database: h.db }) });
    await expect(relayOnly.start({ consumers: false })).rejects.toThrowError(/schema is missing/);
    expect(relayOnly.health()).toMatchObject({ status: 'stopped', relay: { running: false } });
  });

  it('stop() ends background retries at once and closes a subscription whose try was in flight', async () => {
    const gates: ReturnType<typeof gatedTransport>[] = [];
    await using h = harness({ transport: (inner) => gates[gates.push(gatedTransport(inner)) - 1]!.transport });
    const { state } = gates[0]!;
    h.bus.subscribe('sink', Placed, async () => {});
    h.broker.setAvailable(false);
    await h.bus.start();
    await eventually(() => expect(state.calls).toBeGreaterThanOrEqual(2)); // retrying in the background

    // The next try reaches a broker that is back, but is held in flight while the bus stops.
    state.hold = true;
    h.broker.setAvailable(true);
    await eventually(() => expect(state.held.length).toBe(1));
    const stopping = h.bus.stop({ timeoutMs: 100 });
    await stopping;
    await h.bus.stop(); // idempotent
    expect(h.bus.health()).toMatchObject({ status: 'stopped', consumers: [] });

    // The held try now succeeds: its subscription is closed rather than left consuming.
    state.held.shift()!();
    await eventually(() => expect(state.closed).toBe(1));
    await expectNoFurtherTries(state);
  });

  it('a transport closed under the bus ends the background retries: health says why, nothing asks again', async () => {
    const gates: ReturnType<typeof gatedTransport>[] = [];
    await using h = harness({ transport: (inner) => gates[gates.push(gatedTransport(inner)) - 1]!.transport });
    const { state, transport } = gates[0]!;
    h.bus.subscribe('sink', Placed, async () => {});
    h.broker.setAvailable(false);
    await h.bus.start();
    await eventually(() => expect(state.calls).toBeGreaterThanOrEqual(2));
    await transport.close();
    h.broker.setAvailable(true);
    await eventually(() => expect(h.bus.health().consumers).toMatchObject([{ connected: false, lastError: expect.stringContaining('closed') }]));
    await expectNoFurtherTries(state);
  });

  it('stop() requested while start() is still trying the broker for the first time resolves, broker still down', async () => {
    const gates: ReturnType<typeof gatedTransport>[] = [];
    await using h = harness({ transport: (inner) => gates[gates.push(gatedTransport(inner)) - 1]!.transport });
    const { state } = gates[0]!;
    h.bus.subscribe('sink', Placed, async () => {});
    h.broker.setAvailable(false);
    // The consumer's first try is in flight when stop() comes: the relay's start, deferred
    // until the consumer subscribes, is then set up after the stop was requested.
    state.hold = true;
    const starting = h.bus.start();
    await eventually(() => expect(state.held.length).toBe(1));
    const stopping = h.bus.stop({ timeoutMs: 100 });
    state.hold = false;
    state.held.shift()!(); // that try fails (the broker is down) and the consumer would retry
    await starting;
    const stopped = await Promise.race([stopping.then(() => true), sleep(3_000).then(() => false)]);
    expect(stopped, 'stop() resolved while the broker stayed down').toBe(true);
    expect(h.bus.health()).toMatchObject({ status: 'stopped', consumers: [] });
  });
});
