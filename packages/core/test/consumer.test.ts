import { describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import {
  InMemoryDatabase,
  InMemoryInboxStore,
  StorageError,
  TransportError,
  UnrecoverableError,
  defineMessage,
  type Delivery,
  type Envelope,
  type InboxResult,
  type InMemoryTransaction,
  type Logger,
  type ReceivedMessage,
  type SubscribeOptions,
  type Transport,
} from '@courier/core';
import { eventually, harness, spyTransport, type Settlement } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1, schema: z.object({ orderId: z.string() }) });
const Cancelled = defineMessage('orders.OrderCancelled', { version: 1 });

/** Records an effect in the handler's unit of work: it exists only if that unit of work commits. */
function recordEffect(effects: string[], tx: InMemoryTransaction, effect: string): void {
  tx.onCommit(() => effects.push(effect));
}

/** A deferred the handler can wait on, with a bounded wait so a broken test fails instead of hanging. */
function latch() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => {
    open = resolve;
  });
  return {
    open,
    wait: () => Promise.race([opened, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('latch not opened in time')), 5_000).unref())]),
  };
}

describe('consumer: decode, upcast, validate', () => {
  it('upcasts a v1 message through 1→2→3 and validates it before the v3 handler sees it', async () => {
    await using h = harness();
    const V1 = defineMessage('people.Registered', { version: 1 });
    const V3 = defineMessage('people.Registered', {
      version: 3,
      schema: z.object({ first: z.string(), last: z.string(), email: z.string() }),
      upcasters: {
        1: (p) => {
          const [first, last] = (p as { name: string }).name.split(' ');
          return { first, last };
        },
        2: (p) => ({ ...(p as object), email: 'none' }),
      },
    });
    const seen: ReceivedMessage<unknown>[] = [];
    h.bus.subscribe('crm', V3, async (message) => {
      seen.push(message);
    });
    await h.bus.start();
    let id = '';
    await h.commit((tx) => {
      id = h.bus.outbox(tx).publish(V1, { name: 'Ada Lovelace' });
    });
    await eventually(() => expect(seen).toHaveLength(1));
    expect(seen[0]).toMatchObject({ messageId: id, type: 'people.Registered', version: 1, payload: { first: 'Ada', last: 'Lovelace', email: 'none' } });
    expect(Object.isFrozen(seen[0])).toBe(true);
  });

  it('dead-letters an unknown type (UNKNOWN_MESSAGE_TYPE) and a newer version (UNSUPPORTED_VERSION) at once, without running a handler', async () => {
    await using h = harness();
    const Newer = defineMessage('orders.OrderPlaced', { version: 2, upcasters: { 1: (p) => p } });
    let calls = 0;
    h.bus.subscribe('billing', Placed, async () => {
      calls += 1;
    });
    await h.bus.start();
    let unknown = '';
    let newer = '';
    let fine = '';
    await h.commit((tx) => {
      unknown = h.bus.outbox(tx).publish(Cancelled, { orderId: 'o-1' });
      newer = h.bus.outbox(tx).publish(Newer, { orderId: 'o-2' });
      fine = h.bus.outbox(tx).publish(Placed, { orderId: 'o-3' });
    });
    const dead = await eventually(async () => {
      const letters = await h.connection.deadLetters.list('billing');
      expect(letters).toHaveLength(2);
      return letters;
    });
    const byId = new Map(dead.map((letter) => [letter.envelope.messageId, letter]));
    expect(byId.get(unknown)).toMatchObject({ attempt: 1, reason: { code: 'UNKNOWN_MESSAGE_TYPE', message: expect.stringContaining("'orders.OrderCancelled'") } });
    expect(byId.get(newer)).toMatchObject({ attempt: 1, reason: { code: 'UNSUPPORTED_VERSION', message: expect.stringContaining('version 2 is newer') } });
    await eventually(() => expect(h.bus.health().counters.processed).toBe(1));
    expect(calls).toBe(1);
    expect(byId.has(fine)).toBe(false);
    expect(h.bus.health().counters).toMatchObject({ deadLettered: 2, retries: 0 });
  });

  it('dead-letters a payload its schema rejects as PAYLOAD_INVALID naming the field', async () => {
    await using h = harness();
    const Loose = defineMessage('orders.OrderPlaced', { version: 1 });
    let calls = 0;
    h.bus.subscribe('billing', Placed, async () => {
      calls += 1;
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Loose, { orderId: 42 });
    });
    const [letter] = await eventually(async () => {
      const letters = await h.connection.deadLetters.list('billing');
      expect(letters).toHaveLength(1);
      return letters;
    });
    expect(letter).toMatchObject({ attempt: 1, reason: { code: 'PAYLOAD_INVALID', message: expect.stringContaining("'payload.orderId'") } });
    expect(calls).toBe(0);
  });
});

describe('consumer: retries and dead letters', () => {
  it('dead-letters an UnrecoverableError at once, on attempt 1, with nothing of the handler committed', async () => {
    await using h = harness();
    const effects: string[] = [];
    let calls = 0;
    h.bus.subscribe('billing', Placed, async (message, ctx) => {
      calls += 1;
      recordEffect(effects, ctx.tx, message.messageId);
      throw new UnrecoverableError('card permanently declined');
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    const [letter] = await eventually(async () => {
      const letters = await h.connection.deadLetters.list('billing');
      expect(letters).toHaveLength(1);
      return letters;
    });
    expect(letter).toMatchObject({ attempt: 1, reason: { code: 'UNRECOVERABLE', message: expect.stringContaining('card permanently declined') } });
    expect(calls).toBe(1);
    expect(effects).toEqual([]);
    expect(h.bus.health().counters).toMatchObject({ retries: 0, deadLettered: 1, processed: 0 });
  });

  it('unordered: a handler failing twice is redelivered with attempt + 1 and applied once', async () => {
    const transports: ReturnType<typeof spyTransport>[] = [];
    await using h = harness({ transport: (inner) => transports[transports.push(spyTransport(inner)) - 1]! });
    const effects: string[] = [];
    const attempts: number[] = [];
    h.bus.subscribe('billing', Placed, async (message, ctx) => {
      attempts.push(ctx.attempt);
      recordEffect(effects, ctx.tx, message.payload.orderId);
      if (ctx.attempt < 3) throw new Error(`flaky ${ctx.attempt}`);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(h.bus.health().counters.processed).toBe(1));
    expect(attempts).toEqual([1, 2, 3]);
    expect(effects).toEqual(['o-1']);
    expect(transports[0]!.settlements.map((s: Settlement) => `${s.how}@${s.attempt}`)).toEqual(['retry@1', 'retry@2', 'ack@3']);
    expect(h.bus.health().counters).toMatchObject({ retries: 2, deadLettered: 0, duplicates: 0 });
  });

  it('ordered: retries keep the key in order; a later message of the key waits while another key flows', async () => {
    const transports: ReturnType<typeof spyTransport>[] = [];
    await using h = harness({ transport: (inner) => transports[transports.push(spyTransport(inner)) - 1]! });
    const events: string[] = [];
    const effects: string[] = [];
    const otherKeyDone = latch();
    h.bus.subscribe(
      'shipping',
      Placed,
      async (message, ctx) => {
        const { orderId } = message.payload;
        events.push(`start ${orderId}@${ctx.attempt}`);
        recordEffect(effects, ctx.tx, orderId);
        if (orderId === 'a-1' && ctx.attempt === 1) throw new Error('first try fails');
        if (orderId === 'a-1' && ctx.attempt === 2) {
          // The other key must get through while this key is stuck retrying.
          await otherKeyDone.wait();
          throw new Error('second try fails');
        }
        if (orderId === 'b-1') ctx.tx.afterCommit(() => otherKeyDone.open());
      },
      { ordered: true, concurrency: 4 },
    );
    await h.bus.start();
    const ids: Record<string, string> = {};
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      ids['a-1'] = outbox.publish(Placed, { orderId: 'a-1' }, { key: 'A' });
      outbox.publish(Placed, { orderId: 'a-2' }, { key: 'A' });
      outbox.publish(Placed, { orderId: 'b-1' }, { key: 'B' });
    });
    await eventually(() => expect(effects).toHaveLength(3));
    const keyA = events.filter((event) => event.includes('a-'));
    expect(keyA).toEqual(['start a-1@1', 'start a-1@2', 'start a-1@3', 'start a-2@1']);
    expect(events.indexOf('start b-1@1')).toBeLessThan(events.indexOf('start a-1@3'));
    expect(effects.indexOf('a-1')).toBeLessThan(effects.indexOf('a-2'));
    // Through the transport, which keeps a-1's place on the ordered endpoint: a retry settle per failure.
    await eventually(() => expect(transports[0]!.settlements).toHaveLength(5));
    const settledA1 = transports[0]!.settlements.filter((s) => s.messageId === ids['a-1']).map((s) => `${s.how}@${s.attempt}`);
    expect(settledA1).toEqual(['retry@1', 'retry@2', 'ack@3']);
    expect(h.bus.health().counters).toMatchObject({ retries: 2, processed: 3 });
  });

  it('dead-letters with ATTEMPTS_EXHAUSTED after maxAttempts, with the last error', async () => {
    await using h = harness({ bus: { retry: { maxAttempts: 3, initialDelayMs: 1, maxDelayMs: 5, jitter: 0 } } });
    const attempts: number[] = [];
    h.bus.subscribe('billing', Placed, async (_message, ctx) => {
      attempts.push(ctx.attempt);
      throw new Error(`boom ${ctx.attempt}`);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    const [letter] = await eventually(async () => {
      const letters = await h.connection.deadLetters.list('billing');
      expect(letters).toHaveLength(1);
      return letters;
    });
    expect(attempts).toEqual([1, 2, 3]);
    expect(letter).toMatchObject({ attempt: 3, reason: { code: 'ATTEMPTS_EXHAUSTED', message: expect.stringMatching(/3 attempts; last: .*boom 3/) } });
    expect(h.bus.health().counters).toMatchObject({ retries: 2, deadLettered: 1 });
  });

  it('ordered subscriptions dead-letter with ATTEMPTS_EXHAUSTED too, and the key moves on', async () => {
    await using h = harness();
    const handled: string[] = [];
    h.bus.subscribe(
      'shipping',
      Placed,
      async (message, ctx) => {
        if (message.payload.orderId === 'bad') throw new Error(`boom ${ctx.attempt}`);
        handled.push(message.payload.orderId);
      },
      { ordered: true, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1 } },
    );
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'bad' }, { key: 'k' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'next' }, { key: 'k' });
    });
    await eventually(() => expect(handled).toEqual(['next']));
    const [letter] = await h.connection.deadLetters.list('shipping');
    expect(letter?.reason).toMatchObject({ code: 'ATTEMPTS_EXHAUSTED', message: expect.stringMatching(/^2 attempts; last: .*boom 2/) });
  });
});

describe('consumer: the handler unit of work', () => {
  it('ctx.publish writes in the handler transaction, rolled back when it throws, with correlation and causation set', async () => {
    await using h = harness();
    const Captured = defineMessage('payments.PaymentCaptured', { version: 1 });
    const received: Envelope[] = [];
    h.bus.subscribe('billing', Placed, async (message, ctx) => {
      ctx.publish(Captured, { orderId: message.payload.orderId, attempt: ctx.attempt });
      if (ctx.attempt === 1) throw new Error('fails after publishing');
    });
    h.bus.subscribe('audit', Captured, async (_message, ctx) => {
      received.push(ctx.envelope);
    });
    await h.bus.start();
    let placedId = '';
    await h.commit((tx) => {
      placedId = h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' }, { correlationId: 'conversation-7' });
    });
    await eventually(() => expect(received).toHaveLength(1));
    expect(received[0]).toMatchObject({ correlationId: 'conversation-7', causationId: placedId, payload: '{"orderId":"o-1","attempt":2}' });
    await eventually(async () => expect(await h.outbox.stats()).toMatchObject({ pending: 0, dead: 0 }));
    // The placed message and one captured message: the first attempt's publish was rolled back.
    expect(h.bus.health().counters.published).toBe(2);
  });

  it('options given to ctx.publish override the inherited correlation and causation', async () => {
    await using h = harness();
    const Captured = defineMessage('payments.PaymentCaptured', { version: 1 });
    const received: Envelope[] = [];
    h.bus.subscribe('billing', Placed, async (_message, ctx) => {
      ctx.publish(Captured, {}, { correlationId: 'mine', causationId: 'cause' });
    });
    h.bus.subscribe('audit', Captured, async (_message, ctx) => {
      received.push(ctx.envelope);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    await eventually(() => expect(received).toHaveLength(1));
    expect(received[0]).toMatchObject({ correlationId: 'mine', causationId: 'cause' });
  });

  it('counts a second delivery of the same message as a duplicate and does not run the handler again', async () => {
    await using h = harness();
    const effects: string[] = [];
    h.bus.subscribe('billing', Placed, async (message, ctx) => {
      recordEffect(effects, ctx.tx, message.messageId);
    });
    await h.bus.start();
    const envelope: Envelope = {
      messageId: 'twice',
      type: Placed.type,
      version: 1,
      topic: Placed.topic,
      occurredAt: new Date().toISOString(),
      key: null,
      correlationId: 'twice',
      causationId: null,
      traceparent: null,
      tracestate: null,
      headers: {},
      payload: '{"orderId":"o-1"}',
    };
    // At-least-once delivery: the broker may hand over the same message twice.
    const results = await h.connection.publish([envelope, envelope]);
    expect(results.every((result) => result.ok)).toBe(true);
    await eventually(() => expect(h.bus.health().counters).toMatchObject({ processed: 1, duplicates: 1 }));
    expect(effects).toEqual(['twice']);
  });

  it('honours per-subscription concurrency', async () => {
    await using h = harness();
    let active = 0;
    let max = 0;
    let started = 0;
    const total = 12;
    h.bus.subscribe(
      'billing',
      Placed,
      async () => {
        active += 1;
        started += 1;
        max = Math.max(max, active);
        // Hold until the limit is reached (or every message has started), so the measure is meaningful.
        await eventually(() => expect(active >= 3 || started === total).toBe(true), 2_000).catch(() => undefined);
        active -= 1;
      },
      { concurrency: 3 },
    );
    await h.bus.start();
    await h.commit((tx) => {
      for (let index = 0; index < total; index += 1) h.bus.outbox(tx).publish(Placed, { orderId: `o-${index}` });
    });
    await eventually(() => expect(h.bus.health().counters.processed).toBe(total));
    expect(max).toBe(3);
  });
});

describe('consumer: stop', () => {
  it('leaves no timer running once stop() resolves, so the process can exit at once', async () => {
    await using h = harness();
    h.bus.subscribe('billing', Placed, async () => undefined);
    // The relay has its own stop; only the consumer is under test here.
    await h.bus.start({ relay: false, consumers: true });
    const timeoutMs = 600_000;
    const setTimer = globalThis.setTimeout;
    const clearTimer = globalThis.clearTimeout;
    const long = new Set<unknown>();
    const cleared = new Set<unknown>();
    const setSpy = vi.spyOn(globalThis, 'setTimeout').mockImplementation(((callback: () => void, ms?: number) => {
      const timer = setTimer(callback, ms);
      // Timers as long as the stop deadline are the ones that would hold the process.
      if ((ms ?? 0) >= timeoutMs / 2) long.add(timer);
      return timer;
    }) as typeof setTimeout);
    const clearSpy = vi.spyOn(globalThis, 'clearTimeout').mockImplementation((timer) => {
      cleared.add(timer);
      clearTimer(timer);
    });
    try {
      await h.bus.stop({ timeoutMs });
    } finally {
      setSpy.mockRestore();
      clearSpy.mockRestore();
    }
    const pending = [...long].filter((timer) => !cleared.has(timer));
    for (const timer of pending) clearTimer(timer as NodeJS.Timeout);
    expect(pending).toHaveLength(0);
  });
});

/** A copy of `envelope` as the broker would hand it over a second time (same messageId). */
function rawEnvelope(messageId: string, type: string, topic: string, payload: string): Envelope {
  return {
    messageId,
    type,
    version: 1,
    topic,
    occurredAt: new Date().toISOString(),
    key: null,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload,
  };
}

/** An inbox whose first `failures` runs fail with a retriable StorageError before the handler runs, as an unreachable database would. */
class UnreachableFirstInbox extends InMemoryInboxStore {
  failures: number;
  constructor(failures: number) {
    super({ database: new InMemoryDatabase() });
    this.failures = failures;
  }

  override async run<T>(messageId: string, consumer: string, work: (tx: InMemoryTransaction) => Promise<T>, options?: { signal?: AbortSignal }): Promise<InboxResult<T>> {
    if (!consumer.includes('~') && this.failures > 0) {
      this.failures -= 1;
      throw new StorageError("'run' failed, a retry may succeed: connection refused", { retriable: true });
    }
    return super.run(messageId, consumer, work, options);
  }
}

describe('consumer: a failing commit of the handler unit of work', () => {
  it('counts an attempt when the handler ran and its commit failed (retriable), and dead-letters after maxAttempts', async () => {
    await using h = harness({ bus: { retry: { maxAttempts: 3, initialDelayMs: 1, maxDelayMs: 5, jitter: 0 } } });
    const attempts: number[] = [];
    const effects: string[] = [];
    h.bus.subscribe('billing', Placed, async (message, ctx) => {
      attempts.push(ctx.attempt);
      recordEffect(effects, ctx.tx, message.messageId);
      // Fails at commit, after the handler returned: a deferred trigger, or a statement
      // timeout on COMMIT. The store reports it as retriable, like an outage.
      ctx.tx.onPrepare(() => {
        throw new StorageError("'run' failed, a retry may succeed: canceling statement due to statement timeout", { retriable: true });
      });
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'o-1' });
    });
    const [letter] = await eventually(async () => {
      const letters = await h.connection.deadLetters.list('billing');
      expect(letters).toHaveLength(1);
      return letters;
    }, 10_000);
    expect(letter).toMatchObject({ attempt: 3, reason: { code: 'ATTEMPTS_EXHAUSTED', message: expect.stringMatching(/^3 attempts; last: .*statement timeout/) } });
    expect(attempts).toEqual([1, 2, 3]);
    expect(effects).toEqual([]);
    expect(h.bus.health().counters).toMatchObject({ retries: 2, deadLettered: 1, processed: 0 });
  });

  it('ordered: a commit that keeps failing dead-letters the head after maxAttempts and the key moves on', async () => {
    await using h = harness();
    const handled: string[] = [];
    h.bus.subscribe(
      'shipping',
      Placed,
      async (message, ctx) => {
        if (message.payload.orderId === 'bad') {
          ctx.tx.onPrepare(() => {
            throw new StorageError("'run' failed, a retry may succeed: idle-in-transaction timeout", { retriable: true });
          });
          return;
        }
        ctx.tx.onCommit(() => handled.push(message.payload.orderId));
      },
      { ordered: true, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1 } },
    );
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'bad' }, { key: 'k' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'next' }, { key: 'k' });
    });
    await eventually(() => expect(handled).toEqual(['next']), 10_000);
    const [letter] = await h.connection.deadLetters.list('shipping');
    expect(letter).toMatchObject({ attempt: 2, reason: { code: 'ATTEMPTS_EXHAUSTED', message: expect.stringContaining('idle-in-transaction') } });
  });

  it('an inbox store failing before the handler runs pauses the delivery without counting an attempt', async () => {
    const inbox = new UnreachableFirstInbox(3);
    await using h = harness({ bus: { inbox, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 5, jitter: 0 } } });
    const attempts: number[] = [];
    h.bus.subscribe('billing', Placed, async (_message, ctx) => {
      attempts.push(ctx.attempt);
    });
    await h.bus.start();
    await h.connection.publish([rawEnvelope('unreachable-first', Placed.type, Placed.topic, '{"orderId":"o-1"}')]);
    await eventually(() => expect(h.bus.health().counters.processed).toBe(1), 10_000);
    expect(inbox.failures).toBe(0);
    expect(attempts).toEqual([1]);
    expect(h.bus.health().counters).toMatchObject({ retries: 0, deadLettered: 0 });
  });
});

describe('consumer: an ordered retry does not stall the bus', () => {
  it('other consumers keep flowing, a suspect delivery included, while an ordered message backs off; its key keeps order', async () => {
    const transports: ReturnType<typeof spyTransport>[] = [];
    // The transport reports the suspect as a redelivery: a process died with it in hand.
    const redelivered = (delivery: Delivery) => delivery.redelivered || delivery.envelope.messageId === 'noted-suspect';
    await using h = harness({ transport: (inner) => transports[transports.push(spyTransport(inner, {}, redelivered)) - 1]! });
    const Noted = defineMessage('audit.Noted', { version: 1 });
    const events: string[] = [];
    const backoffMs = 4_000;
    h.bus.subscribe(
      'shipping',
      Placed,
      async (message, ctx) => {
        events.push(`${message.payload.orderId}@${ctx.attempt}`);
        ctx.tx.onCommit(() => events.push(`applied ${message.payload.orderId}`));
        if (message.payload.orderId === 'a-1' && ctx.attempt < 3) throw new Error(`fails ${ctx.attempt}`);
      },
      { ordered: true, concurrency: 4, retry: { maxAttempts: 5, initialDelayMs: backoffMs, maxDelayMs: backoffMs, jitter: 0 } },
    );
    h.bus.subscribe('audit', Noted, async (message) => {
      events.push(`noted ${message.messageId}`);
    });
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Placed, { orderId: 'a-1' }, { key: 'A' });
      h.bus.outbox(tx).publish(Placed, { orderId: 'a-2' }, { key: 'A' });
    });
    // a-1 failed once and is backing off.
    await eventually(() => expect(h.bus.health().counters.retries).toBe(1));
    // A message of another consumer redelivered after its process died: a suspect, which
    // waits to run alone.
    const suspect = rawEnvelope('noted-suspect', Noted.type, Noted.topic, '{}');
    await h.connection.publish([suspect]);
    await eventually(() => expect(events).toContain('noted noted-suspect'), backoffMs * 3);
    const later = [rawEnvelope('noted-later-1', Noted.type, Noted.topic, '{}'), rawEnvelope('noted-later-2', Noted.type, Noted.topic, '{}')];
    await h.connection.publish(later);
    await eventually(() => expect(events).toEqual(expect.arrayContaining(['noted noted-later-1', 'noted noted-later-2'])), backoffMs * 3);
    // They flowed during a-1's first backoff, not after its retries.
    expect(events.indexOf('noted noted-later-2')).toBeLessThan(events.indexOf('a-1@2') < 0 ? Number.POSITIVE_INFINITY : events.indexOf('a-1@2'));
    // The ordered key kept its order: a-2 only after a-1 finally succeeded.
    await eventually(() => expect(events).toContain('applied a-2'), backoffMs * 4);
    expect(events.filter((event) => event.includes('a-'))).toEqual(['a-1@1', 'a-1@2', 'a-1@3', 'applied a-1', 'a-2@1', 'applied a-2']);
  }, 60_000);
});

describe('consumer: crash-loop accounting', () => {
  const flagged = (ids: readonly string[]) => (delivery: Delivery) => delivery.redelivered || ids.includes(delivery.envelope.messageId);

  it('a first delivery writes nothing before its handler transaction; a redelivery counts one run alone, dropped once it finished', async () => {
    await using h = harness({ transport: (inner) => spyTransport(inner, {}, flagged(['redelivered-1'])) });
    const recordStart = vi.spyOn(h.inbox, 'recordStart');
    const forget = vi.spyOn(h.inbox, 'forget');
    const handled: string[] = [];
    h.bus.subscribe('billing', Placed, async (message) => {
      handled.push(message.messageId);
    });
    await h.bus.start();
    await h.connection.publish(['first-1', 'first-2', 'first-3'].map((id) => rawEnvelope(id, Placed.type, Placed.topic, JSON.stringify({ orderId: id }))));
    await eventually(() => expect(h.bus.health().counters.processed).toBe(3));
    expect(recordStart).not.toHaveBeenCalled();

    await h.connection.publish([rawEnvelope('redelivered-1', Placed.type, Placed.topic, JSON.stringify({ orderId: 'r' }))]);
    await eventually(() => expect(h.bus.health().counters.processed).toBe(4));
    expect(recordStart.mock.calls).toEqual([['redelivered-1', 'billing~alone']]);
    await eventually(() => expect(forget).toHaveBeenCalledWith('redelivered-1', 'billing~alone'));
    // The count restarted: the next unfinished run alone would be the first.
    expect(await h.inbox.recordStart('redelivered-1', 'billing~alone')).toBe(1);
  });

  it('a suspect whose run alone committed and died before its ack is acknowledged as a duplicate, not parked as a crash loop', async () => {
    // maxCrashes 2: the run that made it a suspect, plus one run alone that died young.
    let spy: ReturnType<typeof spyTransport> | undefined;
    await using h = harness({ transport: (inner) => (spy = spyTransport(inner, {}, flagged(['applied-1']))) });
    const handled: string[] = [];
    h.bus.subscribe(
      'billing',
      Placed,
      async (message) => {
        handled.push(message.messageId);
      },
      { maxCrashes: 2 },
    );
    // What such a death leaves: the run's count alone (recorded before it ran, never
    // dropped) and its committed inbox record.
    expect(await h.inbox.recordStart('applied-1', 'billing~alone')).toBe(1);
    await h.inbox.run('applied-1', 'billing', async () => undefined);
    await h.bus.start();
    await h.connection.publish([rawEnvelope('applied-1', Placed.type, Placed.topic, JSON.stringify({ orderId: 'a' }))]);
    await eventually(() => expect(h.bus.health().counters.duplicates).toBe(1));
    expect(h.bus.health().counters.deadLettered).toBe(0);
    expect(handled).toEqual([]);
    expect(spy!.settlements.map((s: Settlement) => `${s.messageId} ${s.how}`)).toEqual(['applied-1 ack']);
    expect(await h.connection.deadLetters.list('billing')).toEqual([]);
    // The count was dropped: a later redelivery starts from one again.
    expect(await h.inbox.recordStart('applied-1', 'billing~alone')).toBe(1);
  });

  for (const how of ['outlives crashWindowMs', 'is stopped by bus.stop()'] as const) {
    it(`a run alone that ${how} no longer counts`, async () => {
      await using h = harness({ transport: (inner) => spyTransport(inner, {}, flagged(['slow-1'])) });
      let started = false;
      h.bus.subscribe(
        'billing',
        Placed,
        async (_message, ctx) => {
          started = true;
          // Runs until the bus stops it: its delivery stays unsettled.
          await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
          throw new Error('stopped');
        },
        { crashWindowMs: how === 'outlives crashWindowMs' ? 200 : 60_000 },
      );
      await h.bus.start();
      const forget = vi.spyOn(h.inbox, 'forget');
      await h.connection.publish([rawEnvelope('slow-1', Placed.type, Placed.topic, JSON.stringify({ orderId: 's' }))]);
      await eventually(() => expect(started).toBe(true));
      if (how === 'outlives crashWindowMs') {
        // Still running, but past its window: a death now would not be its fault.
        await eventually(() => expect(forget).toHaveBeenCalledWith('slow-1', 'billing~alone'));
      } else {
        expect(forget).not.toHaveBeenCalled();
        await h.bus.stop({ timeoutMs: 100 });
        expect(forget).toHaveBeenCalledWith('slow-1', 'billing~alone');
      }
      // The run's count is gone: the next unfinished run alone would be the first.
      expect(await h.inbox.recordStart('slow-1', 'billing~alone')).toBe(1);
    });
  }

  it('refuses a crashWindowMs that is not a positive integer', async () => {
    await using h = harness();
    expect(() => h.bus.subscribe('billing', Placed, async () => {}, { crashWindowMs: 0 })).toThrow("consumer 'billing': 'crashWindowMs' must be an integer of 1 or more (milliseconds)");
  });
});

/**
 * Wraps `inner` so that the first ack of order `lapsing` is refused, as Service Bus refuses
 * the complete of a delivery whose lock lapsed (MessageLockLost): that ack rejects with a
 * TransportError, later settles of the same delivery are ignored (the Delivery contract),
 * and the delivery is left unsettled, so the broker hands the message out again. `asked`
 * records what the consumer asked of each delivery, by order id.
 */
function refusingFirstAck(inner: Transport, lapsing: string, asked: string[]): Transport {
  let refused = false;
  return {
    capabilities: inner.capabilities,
    ...(inner.deadLetters ? { deadLetters: inner.deadLetters } : {}),
    publish: (messages, options) => inner.publish(messages, options),
    subscribe: (endpoint, handler) =>
      inner.subscribe(endpoint, (delivery) => {
        const { messageId } = delivery.envelope;
        const order = String((JSON.parse(delivery.envelope.payload) as { orderId?: unknown }).orderId);
        let lapsed = false;
        const ignoredOr = (settle: () => Promise<void>) => (lapsed ? Promise.resolve() : settle());
        return handler({
          envelope: delivery.envelope,
          attempt: delivery.attempt,
          redelivered: delivery.redelivered,
          ...(delivery.replayed !== undefined ? { replayed: delivery.replayed } : {}),
          ack: async () => {
            if (order === lapsing && !refused) {
              refused = true;
              lapsed = true;
              asked.push(`${order}: ack refused`);
              throw new TransportError(`complete of ${messageId} failed: [MessageLockLost] the lock lapsed before the complete`);
            }
            asked.push(`${order}: ack`);
            await ignoredOr(() => delivery.ack());
          },
          retry: async (delayMs, reason) => {
            asked.push(`${order}: retry ${reason.code}`);
            await ignoredOr(() => delivery.retry(delayMs, reason));
          },
          deadLetter: async (reason) => {
            asked.push(`${order}: deadLetter ${reason.code}`);
            await ignoredOr(() => delivery.deadLetter(reason));
          },
        });
      }),
    close: () => inner.close(),
  };
}

describe('consumer: an ack refused after the unit of work committed', () => {
  // The refusal on the first of several attempts, on the last one, and on the last one of
  // an ordered subscription that halts keys: the effects are committed each time, so none
  // of them may end in a retry, a dead letter or a halted key.
  const cases: { readonly name: string; readonly options: SubscribeOptions }[] = [
    { name: 'with attempts left', options: {} },
    { name: 'on its last attempt', options: { retry: { maxAttempts: 1 } } },
    { name: "on its last attempt, ordered with poison 'halt'", options: { ordered: true, poison: 'halt', retry: { maxAttempts: 1 } } },
  ];
  for (const { name, options } of cases) {
    it(`${name}: is logged as a warning naming the error, nothing is retried, dead-lettered or halted, and the redelivered copy is acked as a duplicate`, async () => {
      const asked: string[] = [];
      const logs: { level: string; message: string; error: string }[] = [];
      const log = (level: string) => (message: string, fields?: Readonly<Record<string, unknown>>) => void logs.push({ level, message, error: String(fields?.['error'] ?? '') });
      const logger: Logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') };
      await using h = harness({ transport: (transport) => refusingFirstAck(transport, 'first', asked), bus: { logger } });
      const effects: string[] = [];
      h.bus.subscribe('billing', Placed, async (message, ctx) => recordEffect(effects, ctx.tx, message.payload.orderId), options);
      await h.bus.start();
      await h.commit((tx) => void h.bus.outbox(tx).publish(Placed, { orderId: 'first' }, { key: 'k' }));
      await eventually(() => expect(asked).toContain('first: ack'));
      // The next message of the same key flows: its key was not halted.
      await h.commit((tx) => void h.bus.outbox(tx).publish(Placed, { orderId: 'second' }, { key: 'k' }));
      await eventually(() => expect(asked).toContain('second: ack'));
      const { processed, duplicates, retries, deadLettered, haltedKeys, ackFailures } = h.bus.health().counters;
      // One comparison, so a failure shows the whole outcome at once.
      expect({ asked, effects, counters: { processed, duplicates, retries, deadLettered, haltedKeys, ackFailures } }).toEqual({
        asked: ['first: ack refused', 'first: ack', 'second: ack'],
        effects: ['first', 'second'],
        counters: { processed: 2, duplicates: 1, retries: 0, deadLettered: 0, haltedKeys: 0, ackFailures: 1 },
      });
      expect(logs.filter((entry) => entry.error.includes('MessageLockLost')).map((entry) => entry.level), JSON.stringify(logs)).toEqual(['warn']);
      expect(logs.filter((entry) => entry.level === 'error'), 'errors logged').toEqual([]);
    });
  }

  // The other two acks that follow the store's part: a suspect found already applied, and a
  // head given up on whose key was halted. A refused ack there was taken for a failure outside
  // the handler: the delivery was asked to retry as well (a second settle of a delivery the
  // broker may have taken) and the refusal logged as the delivery's failure.
  const logging = () => {
    const logs: { level: string; message: string; error: string }[] = [];
    const log = (level: string) => (message: string, fields?: Readonly<Record<string, unknown>>) => void logs.push({ level, message, error: String(fields?.['error'] ?? '') });
    const logger: Logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') };
    return { logs, logger };
  };

  it('of a suspect found already applied: a warning, no retry, and the copy brought back is acked as a duplicate', async () => {
    const asked: string[] = [];
    const { logs, logger } = logging();
    const flagged = (delivery: Delivery) => delivery.redelivered || delivery.envelope.messageId === 'applied-1';
    // maxCrashes 2: its count alone (one, left by a run that died after its commit) plus this
    // delivery's reaches it, so the inbox is read and the message found applied.
    await using h = harness({ transport: (inner) => refusingFirstAck(spyTransport(inner, {}, flagged), 'a', asked), bus: { logger } });
    const handled: string[] = [];
    h.bus.subscribe(
      'billing',
      Placed,
      async (message) => {
        handled.push(message.messageId);
      },
      { maxCrashes: 2 },
    );
    expect(await h.inbox.recordStart('applied-1', 'billing~alone')).toBe(1);
    await h.inbox.run('applied-1', 'billing', async () => undefined);
    await h.bus.start();
    await h.connection.publish([rawEnvelope('applied-1', Placed.type, Placed.topic, JSON.stringify({ orderId: 'a' }))]);
    await eventually(() => expect(asked).toContain('a: ack'));
    const { duplicates, retries, deadLettered, haltedKeys, ackFailures } = h.bus.health().counters;
    expect({ asked, handled, counters: { duplicates, retries, deadLettered, haltedKeys, ackFailures } }).toEqual({
      asked: ['a: ack refused', 'a: ack'],
      handled: [],
      counters: { duplicates: 2, retries: 0, deadLettered: 0, haltedKeys: 0, ackFailures: 1 },
    });
    expect(logs.filter((entry) => entry.error.includes('MessageLockLost')).map((entry) => entry.level), JSON.stringify(logs)).toEqual(['warn']);
    expect(logs.filter((entry) => entry.level === 'error'), 'errors logged').toEqual([]);
  });

  it("of a head whose key was halted (poison 'halt'): a warning, no retry, the halt stays, and the copy brought back is held behind it", async () => {
    const asked: string[] = [];
    const { logs, logger } = logging();
    await using h = harness({ transport: (transport) => refusingFirstAck(transport, 'first', asked), bus: { logger } });
    h.bus.subscribe(
      'billing',
      Placed,
      async (message) => {
        throw new UnrecoverableError(`${message.payload.orderId} fails for good`);
      },
      { ordered: true, poison: 'halt' },
    );
    await h.bus.start();
    await h.commit((tx) => void h.bus.outbox(tx).publish(Placed, { orderId: 'first' }, { key: 'k' }));
    await eventually(() => expect(asked).toContain('first: ack'));
    const { retries, deadLettered, haltedKeys, ackFailures } = h.bus.health().counters;
    const halts = (await h.inbox.listHalted({ consumer: 'billing' })).map((halt) => ({ key: halt.key, head: halt.head?.envelope.messageId === undefined ? 'none' : String((JSON.parse(halt.head.envelope.payload) as { orderId: string }).orderId) }));
    expect({ asked, halts, counters: { retries, deadLettered, haltedKeys, ackFailures } }).toEqual({
      asked: ['first: ack refused', 'first: ack'],
      halts: [{ key: 'k', head: 'first' }],
      counters: { retries: 0, deadLettered: 0, haltedKeys: 1, ackFailures: 1 },
    });
    expect(logs.filter((entry) => entry.error.includes('MessageLockLost')).map((entry) => entry.level), JSON.stringify(logs)).toEqual(['warn']);
    // The halt itself is an error for an operator; the refused ack is not.
    expect(logs.filter((entry) => entry.level === 'error').map((entry) => entry.message)).toEqual(['key halted: its head was given up on; the key waits for an operator (courier halted resume)']);
  });
});
