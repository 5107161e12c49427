import { describe, expect, it } from 'vitest';
import { ClosedError, CourierError, REASON_LIMITS, TransportError, UnrecoverableError, defineMessage, type Envelope } from '@courier/core';
import { eventually, harness } from './support/harness.js';
import { keyWatchTransport, scriptedTransport, type KeyWatch } from './support/relay-transports.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/** The per-message results a transport reports for trouble that is not the message's fault. */
const CONNECTIVITY_RESULTS: readonly (() => CourierError)[] = [
  () => new TransportError('connection lost before the confirm; it may still arrive'),
  () => new TransportError('no confirm within the publish timeout; it may still arrive', { code: 'PUBLISH_TIMEOUT' }),
  () => new ClosedError('transport'),
  // A queue full under `reject-publish` (RabbitMQ nacks): back-pressure, not poison.
  () => new TransportError('the queue is full', { code: 'PUBLISH_BACKPRESSURE' }),
];

describe('relay and per-message transport results', () => {
  // As RabbitMQ answers for a batch cut by a connection loss: the call resolves, and the
  // messages it could not get confirmed carry TRANSPORT, PUBLISH_TIMEOUT or CLOSED (and a
  // full queue's nacks PUBLISH_BACKPRESSURE).
  it('counts no attempt for connectivity results, pauses, and publishes everything once the broker is back', async () => {
    let down = true;
    let calls = 0;
    const script = (messages: readonly Envelope[]) => {
      calls += 1;
      // While down, the first message of every other call still gets through (a batch
      // cut part-way); the rest carry one of the connectivity results in turn.
      return messages.map((_, index) => (!down || (index === 0 && calls % 2 === 0) ? undefined : CONNECTIVITY_RESULTS[(calls + index) % CONNECTIVITY_RESULTS.length]!()));
    };
    // One attempt: a connectivity result counted as an attempt would dead-letter the message.
    await using h = harness({ transport: (inner) => scriptedTransport(inner, script), bus: { relay: { retry: { maxAttempts: 1 } } } });
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push((message.payload as { id: string }).id);
    });
    await h.bus.start();
    const ids = Array.from({ length: 12 }, (_, index) => `m-${index}`);
    await h.commit((tx) => {
      ids.forEach((id, index) => h.bus.outbox(tx).publish(Placed, { id }, index % 2 === 0 ? { key: `k-${index % 4}` } : {}));
    });
    await eventually(() => {
      expect(h.outbox.failures, 'no attempt was counted').toEqual([]);
      expect(calls).toBeGreaterThanOrEqual(6);
    });
    expect((await h.outbox.stats()).dead).toBe(0);
    await eventually(() => expect(h.bus.health()).toMatchObject({ status: 'degraded', relay: { paused: true } }));
    expect(h.bus.health().counters.relayPauses).toBeGreaterThanOrEqual(1);

    down = false;
    await eventually(() => expect([...seen].sort()).toEqual([...ids].sort()));
    await eventually(() => expect(h.bus.health().relay.paused).toBe(false));
    expect(h.outbox.failures, 'no attempt was counted').toEqual([]);
    expect(await h.outbox.listDead()).toEqual([]);
    expect(h.bus.health().counters).toMatchObject({ publishFailures: 0, deadLettered: 0, published: ids.length });
  });

  // A broker's or a transport's refusal text is not ours to trust: it may be huge, or hold
  // U+0000 or a lone surrogate, which PostgreSQL's text column refuses (the row's failure
  // could then never be recorded, and the row would be published again and again).
  it('bounds and cleans the error text of a refused message before the store records it', async () => {
    const hostile = `refused \u0000 ${'\ud800'}${'x'.repeat(100 * 1024)}`;
    await using h = harness({ transport: (inner) => scriptedTransport(inner, (messages) => messages.map(() => new UnrecoverableError(hostile))) });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'hostile' });
    });
    await eventually(async () => expect(await h.outbox.listDead()).toHaveLength(1));
    const recorded = h.outbox.failures.flat().map((failure) => failure.error);
    const [dead] = await h.outbox.listDead();
    for (const text of [...recorded, dead!.lastError!]) {
      expect(Buffer.byteLength(text, 'utf8')).toBeLessThanOrEqual(REASON_LIMITS.messageBytes);
      expect(text).not.toContain('\u0000');
      expect(text, 'no lone surrogate').not.toMatch(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/);
      expect(text).toContain('refused');
    }
  });

  // The in-memory broker stops a key after a refusal, which hid a relay that pipelined a
  // key to a transport without ordered pipelining; this transport measures it directly.
  it('holds at most one unconfirmed message per key on a transport without ordered pipelining', async () => {
    const watch: KeyWatch = { maxPerKey: 0, calls: 0 };
    await using h = harness({ transport: (inner) => keyWatchTransport(inner, watch, 5), bus: { relay: { batchSize: 50 } } });
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push((message.payload as { id: string }).id);
    });
    await h.bus.start();
    const ids: string[] = [];
    for (let round = 0; round < 4; round += 1) {
      await h.commit((tx) => {
        for (let index = 0; index < 40; index += 1) {
          const id = `${round}-${index}`;
          ids.push(id);
          h.bus.outbox(tx).publish(Placed, { id }, { key: `k-${index % 5}` });
        }
      });
    }
    await eventually(() => expect(seen).toHaveLength(ids.length), 30_000);
    expect(watch.calls).toBeGreaterThan(1);
    expect(watch.maxPerKey).toBe(1);
  });
});

describe('relay with completeAndClaim and a pause', () => {
  // Issue 29: with a store that completes confirmed rows with the loop's next claim, a batch
  // confirmed in part before connectivity trouble left its confirmed rows pending through
  // the whole pause — neither completed nor renewed — so another relay claimed them once
  // the lease ran out and published them again.
  it('completes the confirmed rows of a batch before pausing after a partial connectivity failure', async () => {
    const clock = { offset: 0 };
    let calls = 0;
    const script = (messages: readonly Envelope[]) => {
      calls += 1;
      // The first message of the first batch gets through; everything after it is cut by a
      // connection loss (so every relay loop that claims pauses too).
      return messages.map((_, index) => (calls === 1 && index === 0 ? undefined : new TransportError('connection lost before the confirm; it may still arrive')));
    };
    await using h = harness({
      clock,
      transport: (inner) => scriptedTransport(inner, script),
      // A pause far longer than the lease: the rows must not depend on it ending.
      bus: { relay: { leaseMs: 1_000, batchSize: 5, pause: { initialDelayMs: 60_000, maxDelayMs: 60_000 } } },
    });
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'confirmed' }, { key: 'k-1', messageId: 'confirmed' });
      h.bus.outbox(tx).publish(Placed, { id: 'cut' }, { key: 'k-2', messageId: 'cut' });
    });
    await h.bus.start({ consumers: false });
    await eventually(() => expect(h.bus.health().relay.paused).toBe(true));
    // The lease is long gone on the database clock: another relay claims what is left.
    clock.offset += 60_000;
    const stolen = await h.outbox.claim({ owner: 'other-relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(stolen.records.map((record) => record.envelope.messageId), 'a confirmed row was left to another relay to publish again').toEqual(['cut']);
    expect(h.bus.health().counters.published).toBe(1);
  });
});

describe("relay guard: a key's later message after an earlier one failed in the same batch", () => {
  // Every real pipelining transport stops a key itself after a refusal, so the relay's own
  // guard (release, never complete, what follows a failed message of its key in a batch) was
  // never exercised. This transport confirms every message it does not refuse.
  it('releases, and sends again after its predecessor, a message confirmed behind a refused one of its key', async () => {
    const offered: string[] = [];
    let calls = 0;
    const script = (messages: readonly Envelope[]) => {
      calls += 1;
      offered.push(...messages.map((message) => message.messageId));
      // The first batch: the key's head is refused (not a connectivity result), the rest confirmed.
      return messages.map((message) => (calls === 1 && message.messageId === 'k-first' ? new TransportError("broker refused 'k-first'", { code: 'PAYLOAD_TOO_LARGE', retriable: true }) : undefined));
    };
    await using h = harness({
      transport: (inner) => ({ ...scriptedTransport(inner, script), capabilities: { ...inner.capabilities, orderedPipelining: true } }),
      bus: { relay: { batchSize: 10, retry: { maxAttempts: 3, initialDelayMs: 5, maxDelayMs: 5, jitter: 0 } } },
    });
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { id: 'k-first' }, { key: 'k', messageId: 'k-first' });
      h.bus.outbox(tx).publish(Placed, { id: 'k-second' }, { key: 'k', messageId: 'k-second' });
    });
    await h.bus.start({ consumers: false });
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 }));
    expect(offered, "'k-second' was completed although 'k-first' before it failed in the same batch").toEqual(['k-first', 'k-second', 'k-first', 'k-second']);
    expect(h.outbox.failures.flat().map((failure) => failure.outcome)).toEqual(['retry']);
  });
});
