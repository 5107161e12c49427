import { describe, expect, it, vi } from 'vitest';
import { ConfigError, createBus, defineMessage, InMemoryBroker, InMemoryDatabase, InMemoryOutboxStore, type Transport } from '@courier/core';
import { eventually, harness, withoutRenew } from './support/harness.js';
import { SendLog, slowTransport } from './support/relay-transports.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/** A bus config over an in-memory store (without `renew` unless `renews`) and a transport declaring `publishTimeoutMs`. */
function configWith(publishTimeoutMs: number, leaseMs?: number, renews = false) {
  const broker = new InMemoryBroker();
  const inner = broker.connect();
  const transport: Transport = { ...inner, publish: inner.publish.bind(inner), subscribe: inner.subscribe.bind(inner), close: inner.close.bind(inner), capabilities: { ...inner.capabilities, publishTimeoutMs } };
  return {
    outbox: renews ? new InMemoryOutboxStore({ database: new InMemoryDatabase() }) : withoutRenew(new InMemoryOutboxStore({ database: new InMemoryDatabase() })),
    transport,
    ...(leaseMs === undefined ? {} : { relay: { leaseMs } }),
  };
}

describe('relay lease and the transport publish timeout', () => {
  it('refuses a lease shorter than twice the publish timeout the transport declares', () => {
    let error: unknown;
    try {
      createBus(configWith(20_000));
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      "'relay.leaseMs' (30000 ms) must be at least twice the transport's publish timeout (20000 ms), or a late confirm is re-claimed and sent again: raise 'relay.leaseMs', lower the transport's publish timeout, or use a store that renews leases",
    ]);
    expect(() => createBus(configWith(20_000, 40_000))).not.toThrow();
    // The default lease (30 s) fits what RabbitMQ declares by default (10 s plus a quarter).
    expect(() => createBus(configWith(12_500))).not.toThrow();
  });

  it('accepts a lease shorter than the publish timeout when the store renews leases', () => {
    // The relay renews the lease while it waits for the answer, so the lease need not cover it.
    expect(() => createBus(configWith(12_500, undefined, true))).not.toThrow();
    expect(() => createBus(configWith(20_000, 1_000, true))).not.toThrow();
  });

  // A batch whose confirms together take longer than the lease: without a sending
  // deadline, another loop re-claims its tail when the lease expires and sends it again.
  it('sends nothing so late in a lease that an answer could outlive it', async () => {
    const log = new SendLog();
    const leaseMs = 2_000;
    await using h = harness({
      // The sending deadline is what keeps a store without renewals safe.
      renew: false,
      transport: (inner) => slowTransport(inner, log, 100, { publishTimeoutMs: 1_000 }),
      bus: { relay: { leaseMs, batchSize: 30, retry: { maxAttempts: 1 } } },
    });
    const seen = new Set<string>();
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.add((message.payload as { id: string }).id);
    });
    await h.bus.start();
    await h.commit((tx) => {
      for (let index = 0; index < 30; index += 1) h.bus.outbox(tx).publish(Placed, { id: `m-${index}` });
    });
    await eventually(() => expect(seen.size).toBe(30), 30_000);
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, dead: 0 }), 10_000);
    expect(log.duplicates).toBe(0);
    expect(h.outbox.failures, 'a message left unsent counts no attempt').toEqual([]);
  });

  // Node 20 keeps an entry per AbortSignal.any() call in each input signal's dependants for as
  // long as that input lives (v20.20.2: a million calls on one signal, a million entries after
  // full GCs). The relay's stop signal lives as long as the relay, and a store that renews
  // gives every batch a heartbeat: combining the two with AbortSignal.any grew the stop signal
  // by one entry per batch — millions a day at low rates, where a batch is one message.
  it('keeps nothing per batch on its long-lived stop signal (no AbortSignal.any of it)', async () => {
    const spy = vi.spyOn(AbortSignal, 'any');
    try {
      // The harness's store renews leases, so every batch runs with a heartbeat.
      await using h = harness({ bus: { relay: { batchSize: 1 } } });
      const seen: string[] = [];
      h.bus.subscribe('sink', Placed, async (message) => {
        seen.push(message.messageId);
      });
      await h.bus.start();
      for (let index = 0; index < 30; index += 1) {
        await h.commit((tx) => {
          h.bus.outbox(tx).publish(Placed, { index });
        });
      }
      await eventually(() => expect(seen).toHaveLength(30), 15_000);
      expect(h.outbox.calls.completeAndClaim + h.outbox.calls.complete, 'one-message batches').toBeGreaterThanOrEqual(30);
      expect(spy.mock.calls.length, 'AbortSignal.any calls during 30 one-message batches').toBe(0);
    } finally {
      spy.mockRestore();
    }
  });
});
