import { describe, expect, it } from 'vitest';
import { defineMessage, type Envelope, type Transport } from '@courier/core';
import { eventually, harness, spyTransport } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/**
 * The poison-head policies are about one unconfirmed message per key: with ordered
 * pipelining, the broker already holds a key's later messages when its head is refused
 * (see the report on pipelining and per-message rejections).
 */
const headOnly = (inner: Transport) => spyTransport(inner, { orderedPipelining: false });

/** Subscribes a consumer that records the orderId of every message it handles, in order. */
function collect(h: ReturnType<typeof harness>, consumer = 'sink'): string[] {
  const seen: string[] = [];
  h.bus.subscribe(consumer, Placed, async (message) => {
    seen.push((message.payload as { id: string }).id);
  });
  return seen;
}

describe('relay', () => {
  it('completes each confirmed batch with its next claim (one store call, one commit), and everything is published', async () => {
    await using h = harness({ bus: { relay: { batchSize: 10 } } });
    const seen = collect(h);
    await h.bus.start();
    const ids = Array.from({ length: 60 }, (_, index) => `m${index}`);
    await h.commit((tx) => {
      // Six keys, ten messages each: a key's next row waits for its head's completion.
      for (const [index, id] of ids.entries()) h.bus.outbox(tx).publish(Placed, { id }, { key: `k${index % 6}` });
    });
    await eventually(() => expect([...seen].sort()).toEqual([...ids].sort()));
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0 }));
    for (let key = 0; key < 6; key += 1) {
      const mine = ids.filter((_, index) => index % 6 === key);
      expect(seen.filter((id) => mine.includes(id))).toEqual(mine);
    }
    expect(h.bus.health().counters.published).toBe(60);
    expect(h.outbox.calls.complete).toBe(0);
    expect(h.outbox.calls.completeAndClaim).toBeGreaterThanOrEqual(6);
  });

  it('takes the same combined path with a fault hook: complete-before-commit fires inside completeAndClaim, and a throw there commits neither half', async () => {
    const points: string[] = [];
    let thrown = false;
    await using h = harness({
      bus: {
        relay: { batchSize: 10 },
        faults: (point) => {
          points.push(point);
          if (point === 'complete-before-commit' && !thrown) {
            thrown = true;
            throw new Error('injected before the combined commit');
          }
        },
      },
    });
    const seen = collect(h);
    await h.bus.start();
    const ids = Array.from({ length: 40 }, (_, index) => `m${index}`);
    await h.commit((tx) => {
      for (const [index, id] of ids.entries()) h.bus.outbox(tx).publish(Placed, { id }, { key: `k${index % 4}` });
    });
    await eventually(() => expect([...new Set(seen)].sort()).toEqual([...ids].sort()));
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0 }));
    // Every message arrived, in key order, though the first combined commit was refused.
    for (let key = 0; key < 4; key += 1) {
      const mine = ids.filter((_, index) => index % 4 === key);
      expect([...new Set(seen.filter((id) => mine.includes(id)))]).toEqual(mine);
    }
    expect(thrown).toBe(true);
    expect(h.outbox.calls.complete).toBe(0);
    expect(h.outbox.calls.completeAndClaim).toBeGreaterThanOrEqual(4);
    expect(points.filter((point) => point === 'complete-before-commit').length).toBeGreaterThanOrEqual(h.outbox.calls.completeAndClaim - 1);
  });

  it('publishes committed messages only; a rolled-back unit of work publishes nothing', async () => {
    await using h = harness();
    const seen = collect(h);
    await h.bus.start();
    await expect(
      h.commit((tx) => {
        h.bus.outbox(tx).publish(Placed, { id: 'rolled-back' });
        throw new Error('business rule failed');
      }),
    ).rejects.toThrowError('business rule failed');
    const tx = h.db.begin();
    h.bus.outbox(tx).publish(Placed, { id: 'also-rolled-back' });
    await tx.rollback();
    await h.commit((tx2) => {
      h.bus.outbox(tx2).publish(Placed, { id: 'committed' });
    });
    await eventually(() => expect(seen).toEqual(['committed']));
    expect(await h.outbox.stats()).toMatchObject({ pending: 0, dead: 0 });
    expect(h.bus.health().counters.published).toBe(1);
  });

  it('retries a message the broker rejects with capped exponential backoff, recording attempts and the last error', async () => {
    await using h = harness({
      bus: { relay: { retry: { maxAttempts: 4, initialDelayMs: 2, multiplier: 3, maxDelayMs: 10, jitter: 0 } } },
    });
    const seen = collect(h);
    h.broker.failPublish((envelope) => envelope.payload.includes('"poison"'));
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'poison' });
      h.bus.outbox(tx).publish(Placed, { id: 'neighbour' });
    });
    const [dead] = await eventually(async () => {
      const rows = await h.outbox.listDead();
      expect(rows).toHaveLength(1);
      return rows;
    });
    expect(dead).toMatchObject({ state: 'dead', attempts: 4, lastError: expect.stringContaining('PUBLISH_REJECTED') });
    expect(dead!.envelope.payload).toBe('{"id":"poison"}');
    expect(dead!.failedAt).toBeInstanceOf(Date);
    // Backoff 2, 6, then capped at 10; the fourth failure is the last.
    expect(h.outbox.failures.flat().map((failure) => (failure.outcome === 'retry' ? failure.delayMs : failure.outcome))).toEqual([2, 6, 10, 'dead']);
    await eventually(() => expect(seen).toEqual(['neighbour']));
    expect(h.bus.health().counters).toMatchObject({ publishFailures: 4, deadLettered: 1, published: 1, relayPauses: 0 });
    expect(h.bus.health().relay.paused).toBe(false);
  });

  it('publishes a message that is rejected twice, then accepted, once', async () => {
    await using h = harness();
    const seen = collect(h);
    let rejections = 0;
    h.broker.failPublish(() => {
      rejections += 1;
      return rejections <= 2;
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'flaky' });
    });
    await eventually(() => expect(seen).toEqual(['flaky']));
    expect(h.bus.health().counters).toMatchObject({ publishFailures: 2, published: 1, deadLettered: 0 });
    expect(await h.outbox.listDead()).toEqual([]);
  });

  it("poison 'park': the head is dead-lettered and the next message of its key is published", async () => {
    await using h = harness({ bus: { relay: { poison: 'park', retry: { maxAttempts: 1 } } }, transport: headOnly });
    const seen = collect(h);
    h.broker.failPublish((envelope) => envelope.payload.includes('"k-1"'));
    await h.bus.start();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      outbox.publish(Placed, { id: 'k-1' }, { key: 'k' });
      outbox.publish(Placed, { id: 'k-2' }, { key: 'k' });
      outbox.publish(Placed, { id: 'j-1' }, { key: 'j' });
    });
    await eventually(() => expect([...seen].sort()).toEqual(['j-1', 'k-2']));
    const dead = await h.outbox.listDead();
    expect(dead.map((row) => [row.envelope.payload, row.attempts])).toEqual([['{"id":"k-1"}', 1]]);
    expect(await h.outbox.listHalted()).toEqual([]);
    expect(h.bus.health().counters.haltedKeys).toBe(0);
  });

  it("poison 'halt': the key stops and is held, other keys flow, onKeyHalted fires, and resume lets it continue", async () => {
    const halted: [string, string, string][] = [];
    await using h = harness({
      bus: { relay: { poison: 'halt', retry: { maxAttempts: 1 } }, onKeyHalted: (topic, key, error) => halted.push([topic, key, error]) },
      transport: headOnly,
    });
    const seen = collect(h);
    const stopRejecting = h.broker.failPublish((envelope) => envelope.payload.includes('"k-1"') || envelope.payload.includes('"m-1"'));
    await h.bus.start();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      outbox.publish(Placed, { id: 'k-1' }, { key: 'k' });
      outbox.publish(Placed, { id: 'k-2' }, { key: 'k' });
      outbox.publish(Placed, { id: 'm-1' }, { key: 'm' });
      outbox.publish(Placed, { id: 'm-2' }, { key: 'm' });
      outbox.publish(Placed, { id: 'j-1' }, { key: 'j' });
    });
    await eventually(async () => expect((await h.outbox.listHalted()).map((key) => [key.key, key.held])).toEqual([['k', 1], ['m', 1]]));
    await eventually(() => expect(seen).toEqual(['j-1']));
    expect(halted.map(([topic, key]) => [topic, key])).toEqual([['orders', 'k'], ['orders', 'm']]);
    expect(halted[0]![2]).toContain('PUBLISH_REJECTED');
    expect(h.bus.health().counters).toMatchObject({ haltedKeys: 2, deadLettered: 2 });
    expect(await h.outbox.stats()).toMatchObject({ haltedKeys: 2, pending: 2, dead: 0 });

    // Held durably: a later commit on a halted key waits behind its head.
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'k-3' }, { key: 'k' });
    });
    await eventually(async () => expect((await h.outbox.listHalted()).find((key) => key.key === 'k')?.held).toBe(2));

    stopRejecting();
    expect(await h.outbox.resume('orders', 'k', 'retry')).toBe(1);
    await eventually(() => expect(seen).toEqual(['j-1', 'k-1', 'k-2', 'k-3']));
    expect(await h.outbox.resume('orders', 'm', 'park')).toBe(1);
    await eventually(() => expect(seen).toEqual(['j-1', 'k-1', 'k-2', 'k-3', 'm-2']));
    expect((await h.outbox.listDead()).map((row) => row.envelope.payload)).toEqual(['{"id":"m-1"}']);
    expect(await h.outbox.listHalted()).toEqual([]);
  });

  // Ordered pipelining sends a key's later messages in the same publish call as its head;
  // the capability promises that a refused head stops them, so they cannot overtake it.
  it("with ordered pipelining, a refused head's later messages never reach consumers first", async () => {
    await using h = harness({ bus: { relay: { poison: 'halt', retry: { maxAttempts: 1 } } } });
    expect(h.connection.capabilities.orderedPipelining).toBe(true);
    const seen = collect(h);
    h.broker.failPublish((envelope) => envelope.payload.includes('"k-1"'));
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'k-1' }, { key: 'k' });
      h.bus.outbox(tx).publish(Placed, { id: 'k-2' }, { key: 'k' });
      h.bus.outbox(tx).publish(Placed, { id: 'j-1' }, { key: 'j' });
    });
    await eventually(async () => expect((await h.outbox.listHalted()).map((key) => [key.key, key.held])).toEqual([['k', 1]]));
    // k-2 was published before j-1 in one call, so once j-1 is handled and nothing is in
    // flight, k-2 has been handled too if it reached the broker.
    await eventually(() => expect({ j: seen.includes('j-1'), inFlight: h.bus.health().consumers[0]?.inFlight }).toEqual({ j: true, inFlight: 0 }));
    expect(seen).not.toContain('k-2');
  });

  it('pauses without burning attempts while the broker is down, and resumes by itself', async () => {
    await using h = harness({ bus: { relay: { retry: { maxAttempts: 1 } } } });
    const seen = collect(h);
    await h.bus.start();
    h.broker.setAvailable(false);
    await h.commit((tx) => {
      for (let index = 0; index < 5; index += 1) h.bus.outbox(tx).publish(Placed, { id: `o-${index}` }, { key: `k-${index % 2}` });
    });
    await eventually(() => expect(h.bus.health()).toMatchObject({ status: 'degraded', relay: { paused: true, running: true } }));
    await eventually(() => expect(h.bus.health().counters.relayPauses).toBeGreaterThanOrEqual(2));
    expect(h.bus.health().relay.lastError).toContain('unavailable');
    expect(await h.outbox.stats()).toMatchObject({ pending: 5, dead: 0 });

    h.broker.setAvailable(true);
    await eventually(() => expect([...seen].sort()).toEqual(['o-0', 'o-1', 'o-2', 'o-3', 'o-4']));
    await eventually(() => expect(h.bus.health()).toMatchObject({ status: 'running', relay: { paused: false } }));
    expect(await h.outbox.listDead()).toEqual([]);
    expect(h.outbox.failures).toEqual([]);
    expect(h.bus.health().counters).toMatchObject({ publishFailures: 0, deadLettered: 0, published: 5 });
  });

  it('pauses while the outbox database is down and resumes by itself', async () => {
    await using h = harness();
    const seen = collect(h);
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'before' });
    });
    await eventually(() => expect(seen).toEqual(['before']));
    h.db.setAvailable(false);
    await eventually(() => expect(h.bus.health().relay).toMatchObject({ paused: true, lastError: expect.stringContaining('unavailable') }));
    h.db.setAvailable(true);
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'after' });
    });
    await eventually(() => expect(seen).toEqual(['before', 'after']));
    await eventually(() => expect(h.bus.health().relay.paused).toBe(false));
  });

  it("wakes on the store's watch signal: with a huge poll interval a commit is still published promptly", async () => {
    await using h = harness({ bus: { relay: { pollIntervalMs: 600_000 } } });
    const seen = collect(h);
    await h.bus.start();
    // The relay has claimed once and now waits for a signal (or ten minutes).
    await eventually(() => expect(h.bus.health().relay.sinceLastClaimMs).toBeGreaterThanOrEqual(0));
    for (const id of ['first', 'second']) {
      await h.commit((tx) => {
        h.bus.outbox(tx).publish(Placed, { id });
      });
      // Far under the ten-minute poll, far over what a loaded machine takes (2 s was not).
      await eventually(() => expect(seen).toContain(id), 15_000);
    }
  });

  it('does not publish delayed messages (delay, notBefore) before their time on the database clock', async () => {
    const clock = { offset: 0 };
    await using h = harness({ clock });
    const seen = collect(h);
    await h.bus.start();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      outbox.publish(Placed, { id: 'delayed' }, { delay: 60_000 });
      outbox.publish(Placed, { id: 'not-before' }, { notBefore: new Date(h.db.now() + 120_000) });
      outbox.publish(Placed, { id: 'now' });
    });
    // The claim that took 'now' saw the other two and left them: same commit, not due.
    await eventually(() => expect(seen).toEqual(['now']));
    expect(await h.outbox.stats()).toMatchObject({ pending: 2, inFlight: 0 });
    expect(h.bus.health().counters.published).toBe(1);

    clock.offset = 60_001;
    h.bus.wake();
    await eventually(() => expect(seen).toEqual(['now', 'delayed']));
    expect(await h.outbox.stats()).toMatchObject({ pending: 1 });

    clock.offset = 120_001;
    h.bus.wake();
    await eventually(() => expect(seen).toEqual(['now', 'delayed', 'not-before']));
  });

  it('keeps per-key order across many keys and batches', async () => {
    await using h = harness({ bus: { relay: { batchSize: 7 } } });
    const received: Envelope[] = [];
    h.bus.subscribe('sink', Placed, async (_message, ctx) => {
      received.push(ctx.envelope);
    }, { ordered: true, concurrency: 4 });
    await h.bus.start();
    for (let round = 0; round < 5; round += 1) {
      await h.commit((tx) => {
        for (let key = 0; key < 6; key += 1) h.bus.outbox(tx).publish(Placed, { id: `${key}:${round}` }, { key: `key-${key}` });
      });
    }
    await eventually(() => expect(received).toHaveLength(30));
    for (let key = 0; key < 6; key += 1) {
      const rounds = received.filter((envelope) => envelope.key === `key-${key}`).map((envelope) => JSON.parse(envelope.payload).id);
      expect(rounds).toEqual([0, 1, 2, 3, 4].map((round) => `${key}:${round}`));
    }
  });
});
