import { describe, expect, it } from 'vitest';
import { createBus, defineMessage, InMemoryDatabase, InMemoryOutboxStore, InMemoryBroker, type InMemoryTransaction, type Transport } from '@courier/core';
import { eventually, harness } from './support/harness.js';
import { SendLog, slowTransport } from './support/relay-transports.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/** Pending timers of this process (the relay's must be gone once `stop` resolves). */
const timers = (): number => process.getActiveResourcesInfo().filter((resource) => resource === 'Timeout').length;

describe('relay stop', () => {
  // The broker confirms slowly and one message at a time (RabbitMQ with confirmWindow 1),
  // so every stop lands with messages sent, confirmed and not yet sent in one batch.
  // Its own waits bound each step (15 s a round, 60 s to drain); the test's bound is theirs, not
  // the default 30 s, which 20 rounds outlasted at load ~25.
  it('completes what was confirmed and releases the rest without an attempt, 20 stops in a row under a backlog', { timeout: 300_000 }, async () => {
    const log = new SendLog();
    // One attempt: a stop that counted one would dead-letter the message at once.
    const relay = { retry: { maxAttempts: 1 } };
    await using h = harness({ transport: (inner) => slowTransport(inner, log, 3), bus: { relay } });
    const seen = new Set<string>();
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.add((message.payload as { id: string }).id);
    });
    await h.bus.start({ relay: false });
    const total = 1_000;
    await h.commit((tx) => {
      for (let index = 0; index < total; index += 1) {
        h.bus.outbox(tx).publish(Placed, { id: `m-${index}` }, index % 3 === 0 ? {} : { key: `k-${index % 10}` });
      }
    });

    let inFlightAtStops = 0;
    for (let round = 0; round < 20; round += 1) {
      const worker = h.another({ relay });
      const before = log.total;
      await worker.start({ consumers: false });
      await eventually(() => expect(log.total).toBeGreaterThanOrEqual(before + 5), 15_000);
      inFlightAtStops += log.unconfirmed;
      await worker.stop({ timeoutMs: 15_000 });
      // Stop left no lease behind: confirmed rows are completed, the rest released.
      const stats = await h.outbox.stats();
      expect({ round, inFlight: stats.inFlight, dead: stats.dead, failures: h.outbox.failures.length }).toEqual({ round, inFlight: 0, dead: 0, failures: 0 });
      expect(stats.pending, 'the backlog lasts all 20 stops').toBeGreaterThan(0);
    }

    const drainer = h.another({ relay });
    await drainer.start({ consumers: false });
    await eventually(() => expect(seen.size).toBe(total), 60_000);
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 }));
    expect(h.outbox.failures, 'no attempt was counted').toEqual([]);
    expect(await h.outbox.listDead()).toEqual([]);
    // Stops landed with messages in flight; those were confirmed and completed, not sent
    // again. A copy beyond them would be a confirmed row left to its lease or re-sent.
    expect(inFlightAtStops).toBeGreaterThan(0);
    expect(log.duplicates).toBeLessThanOrEqual(inFlightAtStops);
    // The in-memory broker never loses a confirm, so here not even those may come twice.
    expect(log.duplicates).toBe(0);
  });

  it('leaves no timer behind once stop resolves', async () => {
    const db = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const transport: Transport = broker.connect();
    const bus = createBus<InMemoryTransaction>({ outbox: new InMemoryOutboxStore({ database: db }), transport });
    const before = timers();
    await bus.start({ consumers: false });
    await eventually(() => expect(bus.health().relay.sinceLastClaimMs).toBeGreaterThanOrEqual(0));
    await bus.stop({ timeoutMs: 600_000 });
    expect(timers()).toBeLessThanOrEqual(before);
    await broker.close();
  });
});
