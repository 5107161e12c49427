// Load control (issue 39): per-consumer message TTL, max length and overflow, declared on
// the consumer's queue, on the real broker.
import {
  ConfigError,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  createBus,
  defineMessage,
  PRIORITY_HEADER,
  type Envelope,
  type InMemoryTransaction,
} from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport, type RabbitMqTransportConfig } from '../src/index.js';
import { BROKER_URL, deleteTopology, eventually, openConnection, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope } from './support/envelopes.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const ENDPOINT = { consumer: 'c', topics: ['jobs'], ordered: false } as const;

/** A transport under `prefix` (fresh by default), closed after the test; the topology is deleted once per prefix. */
function transportFor(config: Partial<RabbitMqTransportConfig> = {}, prefix = `courier-${testId()}`) {
  const transport = new RabbitMqTransport({ connection: BROKER_URL, prefix, delayTiersMs: TEST_TIERS_MS, ...config });
  cleanups.push(() => transport.close());
  return { prefix, transport };
}

/**
 * Publishes `messages` one call at a time (each waits for the confirm of the one before)
 * and returns each result's code, `ok` for a confirmed one.
 */
async function publishOneByOne(transport: RabbitMqTransport, messages: readonly Envelope[]): Promise<string[]> {
  const codes: string[] = [];
  for (const message of messages) {
    const [result] = await transport.publish([message]);
    codes.push(result!.ok ? 'ok' : result!.error.code);
  }
  return codes;
}

/**
 * Checks that `codes` are confirms, then back-pressure only, with `limit` confirms or one
 * more: a quorum queue refuses publishes once it holds *more* than its limit, so the message
 * that crosses it is still taken (measured on RabbitMQ 3.10: limit 1 → 2 taken, 2 → 3, 5 → 6).
 */
function expectFilledAt(codes: readonly string[], limit: number): void {
  const accepted = codes.filter((code) => code === 'ok').length;
  expect(accepted).toBeGreaterThanOrEqual(limit);
  expect(accepted).toBeLessThanOrEqual(limit + 1);
  expect(codes).toEqual([...Array<string>(accepted).fill('ok'), ...Array<string>(codes.length - accepted).fill('PUBLISH_BACKPRESSURE')]);
}

function removeTopologyAfter(prefix: string): void {
  cleanups.unshift(() => deleteTopology(prefix, ['c']));
}

/** What `act` threw (sync or async), failing the test when it did not throw. */
async function thrown(act: () => unknown): Promise<unknown> {
  try {
    await act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

describe('RabbitMqTransport queueLimits: configuration', () => {
  it('refuses bad limits with a ConfigError naming every option at fault', async () => {
    const error = await thrown(
      () =>
        new RabbitMqTransport({
          connection: BROKER_URL,
          queueLimits: {
            a: { messageTtlMs: 0, maxLength: 1.5, maxLengthBytes: -1, maxPriority: 10 },
            b: { maxLength: 10, overflow: 'reject-publish-dlx' as 'drop-head', maxLenght: 3 } as never,
            c: { overflow: 'drop-head' },
            'bad name!': {},
          },
        }),
    );
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      `'queueLimits.a.messageTtlMs' must be an integer from 1 to 4294967295, got 0`,
      `'queueLimits.a.maxLength' must be an integer from 1 to ${Number.MAX_SAFE_INTEGER}, got 1.5`,
      `'queueLimits.a.maxLengthBytes' must be an integer from 1 to ${Number.MAX_SAFE_INTEGER}, got -1`,
      `'queueLimits.a.maxPriority' must be an integer from 1 to 9, got 10`,
      `'queueLimits.b.maxLenght' is not an option (known: messageTtlMs, maxLength, maxLengthBytes, overflow, maxPriority)`,
      `'queueLimits.b.overflow' must be 'reject-publish' or 'drop-head', got "reject-publish-dlx"`,
      `'queueLimits.c.overflow' needs 'maxLength' or 'maxLengthBytes': without a length the queue is never full`,
      `'queueLimits' key 'bad name!' is not a consumer name ([A-Za-z0-9._-])`,
    ]);
  });
});

describe('RabbitMqTransport queueLimits on the broker', () => {
  it('reject-publish (default): a full queue nacks, the publish fails as PUBLISH_BACKPRESSURE, nothing is dead-lettered', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxLength: 2 } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const codes = await publishOneByOne(transport, Array.from({ length: 6 }, () => envelope('jobs')));
    expectFilledAt(codes, 2);
    const accepted = codes.filter((code) => code === 'ok').length;
    expect(transport.stats()).toMatchObject({ nacked: 6 - accepted, confirmed: accepted });
    // Pipelined messages overshoot further (they were on their way when the queue crossed its limit) but are nacked once it knows.
    const batch = await transport.publish(Array.from({ length: 3 }, () => envelope('jobs')));
    expect(batch.map((r) => (r.ok ? 'ok' : [r.error.code, r.error.retriable]))).toEqual(Array(3).fill(['PUBLISH_BACKPRESSURE', true]));
    expect(await transport.deadLetters.list('c')).toEqual([]);
  });

  it('messageTtlMs: a message that waited too long is dead-lettered with reason expired, visible in deadLetters.list', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { messageTtlMs: 300 } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const sent = [envelope('jobs', { key: 'k' }), envelope('jobs')];
    expect((await transport.publish(sent)).every((r) => r.ok)).toBe(true);
    const letters = await eventually(async () => {
      const found = await transport.deadLetters.list('c');
      expect(found).toHaveLength(2);
      return found;
    });
    // deadLetters.list orders by dead-letter time, ties by id: both may expire in one instant.
    const byId = (a: { messageId: string }, b: { messageId: string }) => a.messageId.localeCompare(b.messageId);
    expect(letters.map((letter) => letter.envelope).sort(byId)).toEqual([...sent].sort(byId));
    for (const letter of letters) {
      expect(letter.reason).toEqual({ code: 'BROKER_EXPIRED', message: 'dead-lettered by RabbitMQ (expired)' });
      expect(letter.deadAt.getTime()).toBeGreaterThan(Date.now() - 60_000);
    }
  });

  it('drop-head: new messages are taken and the oldest are dead-lettered with reason maxlen', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxLength: 2, overflow: 'drop-head' } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const sent = Array.from({ length: 5 }, () => envelope('jobs'));
    for (const message of sent) expect((await transport.publish([message]))[0]!.ok).toBe(true);
    const letters = await eventually(async () => {
      const found = await transport.deadLetters.list('c');
      expect(found).toHaveLength(3);
      return found;
    });
    // The three oldest, in whatever order list() breaks ties of one dead-letter instant (by id).
    expect(letters.map((letter) => letter.envelope.messageId).sort()).toEqual(sent.slice(0, 3).map((e) => e.messageId).sort());
    expect(letters.map((letter) => letter.reason.code)).toEqual(['BROKER_MAXLEN', 'BROKER_MAXLEN', 'BROKER_MAXLEN']);
    const received: string[] = [];
    await transport.subscribe({ ...ENDPOINT, concurrency: 1 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    await eventually(() => expect(received).toEqual(sent.slice(3).map((e) => e.messageId)));
  });

  // x-first-death-reason keeps the first death for ever: a message that went through a
  // delay tier (which dead-letters it back, reason expired) and was then dropped by
  // max-length was listed as BROKER_EXPIRED. The latest death (x-death[0]) is the reason.
  it('a message dropped by max-length after a retry is listed with reason maxlen, not the retry tier expiring', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxLength: 1, overflow: 'drop-head' } } });
    removeTopologyAfter(prefix);
    const first = envelope('jobs');
    let retried = false;
    const subscription = await transport.subscribe({ ...ENDPOINT, concurrency: 1 }, async (delivery) => {
      await delivery.retry(0, { code: 'AGAIN', message: 'later' });
      retried = true;
    });
    expect((await transport.publish([first]))[0]!.ok).toBe(true);
    await eventually(() => expect(retried).toBe(true));
    await subscription.close();
    // Back from the 200 ms tier (x-death: expired), it waits in the queue; the next message pushes it out.
    const connection = await openConnection(`${prefix}-check`);
    cleanups.push(() => connection.close());
    const channel = await connection.createChannel();
    await eventually(async () => expect((await channel.checkQueue(transport.names('c').queue)).messageCount).toBe(1));
    expect((await transport.publish([envelope('jobs')]))[0]!.ok).toBe(true);
    const [letter] = await eventually(async () => {
      const found = await transport.deadLetters.list('c');
      expect(found).toHaveLength(1);
      return found;
    });
    expect(letter!.envelope.messageId).toBe(first.messageId);
    expect(letter!.reason).toEqual({ code: 'BROKER_MAXLEN', message: 'dead-lettered by RabbitMQ (maxlen)' });
  });

  it('maxLengthBytes counts message bodies', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxLengthBytes: 250 } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const body = JSON.stringify('x'.repeat(98)); // 100 bytes
    // 250 bytes hold two bodies of 100; the third crosses the limit and is still taken (see expectFilledAt).
    expectFilledAt(await publishOneByOne(transport, Array.from({ length: 5 }, () => envelope('jobs', { payload: body }))), 2);
  });

  it('a changed limit on an existing queue: provision and subscribe fail with a ConfigError naming the queue, the argument and the ways out', async () => {
    const { prefix, transport: before } = transportFor();
    removeTopologyAfter(prefix);
    await before.provision(ENDPOINT);
    const { transport: after } = transportFor({ queueLimits: { c: { maxLength: 10 } } }, prefix);
    const queue = after.names('c').queue;
    for (const attempt of [() => after.provision(ENDPOINT), () => after.subscribe({ ...ENDPOINT, concurrency: 1 }, async () => undefined)]) {
      const error = await thrown(attempt);
      expect(error).toBeInstanceOf(ConfigError);
      const text = (error as ConfigError).message;
      expect(text).toContain(`queue '${queue}' of consumer 'c' exists with another 'x-max-length' than 'queueLimits.c' declares`);
      expect(text).toContain('rabbitmqctl set_policy');
      expect(text).toContain(`rabbitmqctl delete_queue ${queue}`);
    }
    // The other way round (limits first, then none) is refused too, and the transport stays usable.
    const { transport: without } = transportFor({ queueLimits: { c: { maxLength: 10, overflow: 'drop-head' } } }, prefix);
    const error = await thrown(() => without.provision(ENDPOINT));
    expect((error as ConfigError).message).toMatch(/exists with another 'x-(overflow|dead-letter-strategy|max-length)'/);
    expect((await before.publish([envelope('jobs')]))[0]!.ok).toBe(true);
  });

  it('accepts the largest TTL it validates (2^32 - 1 ms)', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { messageTtlMs: 2 ** 32 - 1, maxLength: 2 ** 40 } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    expect((await transport.publish([envelope('jobs')]))[0]!.ok).toBe(true);
  });
});

describe('the relay under a full queue', () => {
  const Job = defineMessage('jobs.Queued', { version: 1, topic: 'jobs' });

  it('loses nothing and dead-letters nothing: fill the queue, then drain it, everything arrives once', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxLength: 3 } } });
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const db = new InMemoryDatabase();
    const outbox = new InMemoryOutboxStore({ database: db });
    // One attempt: a full queue counted as an attempt would make a dead outbox row at once.
    const bus = createBus<InMemoryTransaction>({
      outbox,
      inbox: new InMemoryInboxStore({ database: db }),
      transport,
      relay: { pollIntervalMs: 20, batchSize: 5, retry: { maxAttempts: 1 }, pause: { initialDelayMs: 50, maxDelayMs: 200 } },
    });
    cleanups.push(() => bus.stop({ timeoutMs: 2_000 }));
    await bus.start({ relay: true, consumers: false });
    const ids = Array.from({ length: 20 }, (_, index) => `job-${index}`);
    await db.transaction(async (tx) => {
      for (const [index, id] of ids.entries()) bus.outbox(tx).publish(Job, { id }, { messageId: id, key: `k-${index % 4}` });
    });
    // The queue fills; the rest is nacked again and again, and stays in the outbox.
    await eventually(() => expect(transport.stats().nacked).toBeGreaterThanOrEqual(10), 20_000);
    // The limit is 3; a quorum queue takes what was in flight when it crossed it (one batch at most).
    const taken = transport.stats().confirmed;
    expect(taken).toBeGreaterThanOrEqual(3);
    expect(taken).toBeLessThanOrEqual(3 + 5);
    expect(bus.health().counters.relayPauses).toBeGreaterThanOrEqual(1);
    expect(await outbox.stats()).toMatchObject({ dead: 0, pending: 20 - taken });

    // Drain through a consumer in another transport (another process, say): it declares the same limits.
    const { transport: reader } = transportFor({ queueLimits: { c: { maxLength: 3 } } }, prefix);
    const received: string[] = [];
    await reader.subscribe({ ...ENDPOINT, concurrency: 2 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    await eventually(() => expect([...received].sort()).toEqual([...ids].sort()), 30_000);
    await eventually(async () => expect(await outbox.stats()).toMatchObject({ pending: 0, dead: 0 }));
    expect(received).toHaveLength(ids.length); // each once
    expect(await outbox.listDead()).toEqual([]);
    expect(await transport.deadLetters.list('c')).toEqual([]);
    expect(bus.health().counters).toMatchObject({ publishFailures: 0 });
  });
});

describe('priorities (queueLimits.maxPriority: a classic priority queue)', () => {
  const prioritized = (priority: number | null): Envelope => envelope('jobs', priority === null ? {} : { headers: { [PRIORITY_HEADER]: String(priority) } });

  it('under a backlog serves the high band first, and the low band still moves', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxPriority: 9 } }, prefetch: () => 1 });
    removeTopologyAfter(prefix);
    expect(transport.capabilities.priorities).toBe(true);
    await transport.provision(ENDPOINT);
    // Low first, then high: a FIFO queue would deliver the low band first.
    const low = Array.from({ length: 15 }, (_, index) => prioritized(index % 3 === 0 ? null : 1));
    const high = Array.from({ length: 10 }, () => prioritized(9));
    expect((await transport.publish([...low, ...high])).every((r) => r.ok)).toBe(true);
    const received: Envelope[] = [];
    await transport.subscribe({ ...ENDPOINT, concurrency: 1 }, async (delivery) => {
      received.push(delivery.envelope);
      await delivery.ack();
    });
    await eventually(() => expect(received).toHaveLength(low.length + high.length));
    expect(received.slice(0, high.length).map((e) => e.messageId)).toEqual(high.map((e) => e.messageId));
    // Within a band, publish order; the envelope keeps its priority (none stays none).
    expect(received.slice(high.length).map((e) => e.messageId)).toEqual([...low.filter((e) => e.headers[PRIORITY_HEADER] === '1'), ...low.filter((e) => e.headers[PRIORITY_HEADER] === undefined)].map((e) => e.messageId));
    expect(received).toEqual(expect.arrayContaining([...low, ...high]));
  });

  it('a retried message keeps its priority', async () => {
    const { prefix, transport } = transportFor({ queueLimits: { c: { maxPriority: 5 } } });
    removeTopologyAfter(prefix);
    const sent = prioritized(5);
    const attempts: { attempt: number; priority: unknown }[] = [];
    await transport.subscribe({ ...ENDPOINT, concurrency: 1 }, async (delivery) => {
      attempts.push({ attempt: delivery.attempt, priority: delivery.envelope.headers[PRIORITY_HEADER] });
      if (delivery.attempt === 1) await delivery.retry(0, { code: 'AGAIN', message: 'once more' });
      else await delivery.ack();
    });
    expect((await transport.publish([sent]))[0]!.ok).toBe(true);
    await eventually(() => expect(attempts).toEqual([{ attempt: 1, priority: '5' }, { attempt: 2, priority: '5' }]));
  });

  it('refuses priorities for an ordered consumer: they would reorder its keys', async () => {
    const { transport } = transportFor({ queueLimits: { c: { maxPriority: 3 } } });
    for (const attempt of [() => transport.provision({ ...ENDPOINT, ordered: true }), () => transport.subscribe({ ...ENDPOINT, ordered: true, concurrency: 1 }, async () => undefined)]) {
      const error = await thrown(attempt);
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems).toEqual([`consumer 'c' is ordered, and 'queueLimits.c.maxPriority' would reorder its keys: use one or the other`]);
    }
  });

  it('turning priorities on for an existing quorum queue is a ConfigError naming the argument', async () => {
    const { prefix, transport: before } = transportFor();
    removeTopologyAfter(prefix);
    await before.provision(ENDPOINT);
    const { transport: after } = transportFor({ queueLimits: { c: { maxPriority: 3 } } }, prefix);
    const error = await thrown(() => after.provision(ENDPOINT));
    expect(error).toBeInstanceOf(ConfigError);
    const text = (error as ConfigError).message;
    // RabbitMQ names the first argument that differs (on 3.10.8: x-dead-letter-strategy, which a classic queue does not take).
    expect(text).toMatch(/exists with another 'x-(queue-type|max-priority|overflow|dead-letter-strategy)'/);
    expect(text).toContain('maxPriority');
    expect(text).not.toContain('set_policy');
  });
});

describe('priorities end to end: definition → outbox → relay → priority queue → handler', () => {
  const Routine = defineMessage('jobs.Routine', { version: 1, topic: 'jobs' });
  const Urgent = defineMessage('jobs.Urgent', { version: 1, topic: 'jobs', priority: 8 });

  it('a backlog relayed from the outbox is handled urgent first', async () => {
    const limits = { queueLimits: { c: { maxPriority: 9 } } };
    const { prefix, transport } = transportFor(limits);
    removeTopologyAfter(prefix);
    await transport.provision(ENDPOINT);
    const db = new InMemoryDatabase();
    const producer = createBus<InMemoryTransaction>({
      outbox: new InMemoryOutboxStore({ database: db }),
      inbox: new InMemoryInboxStore({ database: db }),
      transport,
      relay: { pollIntervalMs: 20 },
    });
    cleanups.push(() => producer.stop({ timeoutMs: 2_000 }));
    await producer.start({ relay: true, consumers: false });
    await db.transaction(async (tx) => {
      for (let index = 0; index < 8; index += 1) producer.outbox(tx).publish(Routine, { index }, { messageId: `routine-${index}` });
      for (let index = 0; index < 4; index += 1) producer.outbox(tx).publish(Urgent, { index }, { messageId: `urgent-${index}` });
      producer.outbox(tx).publish(Urgent, { index: 4 }, { messageId: 'demoted', priority: 0 });
    });
    await eventually(() => expect(transport.stats().confirmed).toBe(13));

    const { transport: reader } = transportFor({ ...limits, prefetch: () => 1 }, prefix);
    const consumerDb = new InMemoryDatabase();
    const consumer = createBus<InMemoryTransaction>({
      outbox: new InMemoryOutboxStore({ database: consumerDb }),
      inbox: new InMemoryInboxStore({ database: consumerDb }),
      transport: reader,
    });
    cleanups.push(() => consumer.stop({ timeoutMs: 2_000 }));
    const handled: { id: string; headers: Readonly<Record<string, string>> }[] = [];
    for (const definition of [Routine, Urgent]) {
      consumer.subscribe('c', definition, async (message) => {
        handled.push({ id: message.messageId, headers: message.headers });
      }, { concurrency: 1 });
    }
    await consumer.start({ relay: false, consumers: true });
    await eventually(() => expect(handled).toHaveLength(13), 20_000);
    expect(handled.slice(0, 4).map((h) => h.id)).toEqual(['urgent-0', 'urgent-1', 'urgent-2', 'urgent-3']);
    expect(handled.slice(4).map((h) => h.id).sort()).toEqual(['demoted', ...Array.from({ length: 8 }, (_, index) => `routine-${index}`)].sort());
    expect(handled.every((h) => Object.keys(h.headers).length === 0)).toBe(true);
  });
});
