import { TransportError, type Delivery, type Envelope } from '@courier/core';
import type { ChannelModel, GetMessage } from 'amqplib';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { COURIER_HEADERS, RabbitMqTransport, type RabbitMqTransportConfig } from '../src/index.js';
import { closeConnectionsNamed, deleteTopology, eventually, existingQueues, openConnection, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope } from './support/envelopes.js';
import { destroySocket } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function setup(config: Partial<RabbitMqTransportConfig> = {}) {
  const prefix = `courier-${testId()}`;
  const connections: ChannelModel[] = [];
  // Calls of the connection factory, counted as they are made (not when the connection
  // opens, which a loaded machine can take seconds to do), and those not answered yet.
  const factory = { calls: 0, unanswered: 0 };
  const transport = new RabbitMqTransport({
    prefix,
    delayTiersMs: TEST_TIERS_MS,
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
    ...config,
    connection: async () => {
      factory.calls += 1;
      factory.unanswered += 1;
      try {
        const connection = await openConnection(prefix);
        connections.push(connection);
        return connection;
      } finally {
        factory.unanswered -= 1;
      }
    },
  });
  cleanups.push(async () => {
    await transport.close({ signal: AbortSignal.timeout(2_000) });
    await deleteTopology(prefix, ['c']);
  });
  return { prefix, transport, connections, factory, names: transport.names('c') };
}

/** Takes every message in `queue` without removing it (the channel closes, which requeues them). */
async function peek(queue: string): Promise<GetMessage[]> {
  const connection = await openConnection('peek');
  const channel = await connection.createChannel();
  const found: GetMessage[] = [];
  for (let m = await channel.get(queue); m; m = await channel.get(queue)) found.push(m);
  await connection.close();
  return found;
}

describe('RabbitMqTransport consuming', () => {
  it('retries through the delay-tier queue with the attempt in courier-attempt', async () => {
    // random 0 always takes the upper neighbour: 500 ms lies between the 200 and 600 ms tiers.
    const { transport } = setup({ random: () => 0 });
    const seen: { attempt: number; at: number }[] = [];
    let retriedAt = 0;
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 2 }, async (d) => {
      seen.push({ attempt: d.attempt, at: Date.now() });
      if (d.attempt < 3) {
        retriedAt = Date.now();
        await d.retry(500, { code: 'AGAIN', message: 'not yet' });
      } else await d.ack();
    });
    await transport.publish([envelope('t')]);
    await eventually(() => expect(seen.map((s) => s.attempt)).toEqual([1, 2, 3]), 10_000);
    // The 600 ms tier's queue TTL, not the requested 500 ms, decides when it comes back.
    expect(seen[2]!.at - retriedAt).toBeGreaterThanOrEqual(550);
    expect(transport.stats().retried).toBe(2);
  });

  it('dead-letters with the reason cut to fit a frame, the attempt and the original routing', async () => {
    const { prefix, transport, names } = setup({ maxErrorBytes: 1_000 });
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async (d) => {
      if (d.attempt === 1) await d.retry(0, { code: 'AGAIN', message: 'once more' });
      else await d.deadLetter({ code: 'BROKEN', message: `ü${'x'.repeat(50_000)}` });
    });
    const sent = envelope('t', { key: 'k' });
    await transport.publish([sent]);
    const [dead] = await eventually(async () => {
      const list = await peek(names.deadLetterQueue);
      expect(list).toHaveLength(1);
      return list;
    });
    const headers = dead!.properties.headers!;
    expect(headers[COURIER_HEADERS.deadCode]).toBe('BROKEN');
    expect(Buffer.byteLength(String(headers[COURIER_HEADERS.deadReason]))).toBeLessThanOrEqual(1_000);
    // Cut by the core's boundText, which says how much it cut.
    expect(String(headers[COURIER_HEADERS.deadReason])).toMatch(/^üx+ … \[cut: \d+ bytes\]$/);
    expect(headers[COURIER_HEADERS.attempt]).toBe(2);
    // The copy went through a tier queue, yet records where it was first published.
    expect(headers[COURIER_HEADERS.originalExchange]).toBe(`${prefix}.topics`);
    expect(headers[COURIER_HEADERS.originalRoutingKey]).toBe('t');
    expect(headers['x-death']).toBeUndefined();
    const [letter] = await transport.deadLetters.list('c');
    expect(letter).toMatchObject({ id: sent.messageId, consumer: 'c', attempt: 2, reason: { code: 'BROKEN' } });
    expect(letter!.envelope).toEqual(sent);
  });

  it('parks an undecodable message in the dead-letter queue without calling the handler', async () => {
    const { prefix, transport, names } = setup();
    let handled = 0;
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async (d) => {
      handled++;
      await d.ack();
    });
    const connection = await openConnection('raw');
    const channel = await connection.createConfirmChannel();
    channel.publish(`${prefix}.topics`, 't', Buffer.from('not an envelope'), { messageId: 'raw-1' });
    await channel.waitForConfirms();
    await connection.close();
    const [dead] = await eventually(async () => {
      const list = await peek(names.deadLetterQueue);
      expect(list).toHaveLength(1);
      return list;
    });
    expect(dead!.properties.headers![COURIER_HEADERS.deadCode]).toBe('ENVELOPE_INVALID');
    expect(handled).toBe(0);
    expect(await transport.deadLetters.list('c')).toEqual([]);
    expect(await transport.deadLetters.purge('c', ['raw-1'])).toBe(1);
  });

  it('retries in place on an ordered endpoint: the key waits, other keys flow', async () => {
    const { transport } = setup();
    const order: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: true, concurrency: 2 }, async (d) => {
      // Long enough that key b's two messages, already queued, are surely handled while a1
      // waits, also on a loaded machine (300 ms was not: b handled 400 ms late came after it).
      if (d.envelope.payload === '"a1"' && d.attempt === 1) return d.retry(2_000, { code: 'AGAIN', message: 'wait' });
      order.push(`${d.envelope.payload}@${d.attempt}`);
      await d.ack();
    });
    await transport.publish([
      envelope('t', { key: 'a', payload: '"a1"' }),
      envelope('t', { key: 'a', payload: '"a2"' }),
      envelope('t', { key: 'b', payload: '"b1"' }),
      envelope('t', { key: 'b', payload: '"b2"' }),
    ]);
    await eventually(() => expect(order).toHaveLength(4));
    expect(order.filter((o) => o.startsWith('"a'))).toEqual(['"a1"@2', '"a2"@1']);
    // Key b did not wait for key a's retry.
    expect(order.indexOf('"b2"@1')).toBeLessThan(order.indexOf('"a1"@2'));
  });

  it('dead-letters a message once on an ordered endpoint when the queue holds two copies of it', async () => {
    // A relay killed between the broker's confirm and marking its rows published sends the
    // batch again, so the queue holds two copies of one message. The worker that takes
    // them dies holding both; the standby gets both together and dead-letters the first.
    const { prefix, transport: survivor, names } = setup();
    const dyingConnections: ChannelModel[] = [];
    let killed = false;
    const dying = new RabbitMqTransport({
      prefix,
      delayTiersMs: TEST_TIERS_MS,
      reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
      connection: async () => {
        if (killed) throw new Error('this process was killed');
        const connection = await openConnection(`${prefix}-dying`);
        dyingConnections.push(connection);
        return connection;
      },
    });
    let release!: () => void;
    const frozen = new Promise<void>((resolve) => {
      release = resolve;
    });
    cleanups.push(async () => {
      release();
      await dying.close({ signal: AbortSignal.timeout(2_000) });
    });
    const endpoint = { consumer: 'c', topics: ['t'], ordered: true, concurrency: 2 };
    await dying.subscribe(endpoint, () => frozen);
    const handled: string[] = [];
    await survivor.subscribe(endpoint, async (d) => {
      handled.push(d.envelope.messageId);
      // Both copies are held by this process before the first is settled.
      await eventually(() => expect(survivor.stats().deliveries).toBe(2));
      await d.deadLetter({ code: 'CRASH_LOOP', message: 'killed every worker that started it' });
    });
    const sent = envelope('t', { key: 'k' });
    await dying.publish([sent]);
    await dying.publish([sent]);
    await eventually(() => expect(dying.stats().deliveries).toBe(2));
    killed = true;
    for (const connection of dyingConnections) destroySocket(connection);
    await eventually(() => expect(survivor.stats().deadLettered).toBeGreaterThanOrEqual(1));
    // Closing hands back whatever is still unacknowledged, so the queue shows it.
    await survivor.close();
    expect(handled).toEqual([sent.messageId]);
    expect((await peek(names.deadLetterQueue)).map((m) => m.properties.messageId)).toEqual([sent.messageId]);
    // With no consumer left every message in the queue is ready (basic.get is refused on a
    // single-active-consumer queue, so count instead of peeking).
    const connection = await openConnection('count');
    const { messageCount } = await (await connection.createChannel()).checkQueue(names.queue);
    await connection.close();
    expect(messageCount).toBe(0);
  });

  it('acknowledges a later copy of a message it dead-lettered, and hands over a replay of it', async () => {
    const { transport } = setup();
    const handled: string[] = [];
    let replaying = false;
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: true, concurrency: 2 }, async (d) => {
      handled.push(d.envelope.messageId);
      if (d.envelope.payload === '"poison"' && !replaying) await d.deadLetter({ code: 'CRASH_LOOP', message: 'poison' });
      else await d.ack();
    });
    const sent = envelope('t', { key: 'k', payload: '"poison"' });
    await transport.publish([sent]);
    await eventually(() => expect(transport.stats().deadLettered).toBe(1));
    // The relay sends it again (it died before marking it published); the next message of
    // its key shows when the copy has been dealt with.
    const next = envelope('t', { key: 'k' });
    await transport.publish([sent]);
    await transport.publish([next]);
    await eventually(() => expect(handled).toContain(next.messageId));
    expect(handled).toEqual([sent.messageId, next.messageId]);
    expect((await transport.deadLetters.list('c')).map((letter) => letter.id)).toEqual([sent.messageId]);

    replaying = true;
    expect(await transport.deadLetters.replay('c', [sent.messageId])).toBe(1);
    await eventually(() => expect(handled).toEqual([sent.messageId, next.messageId, sent.messageId]));
    await eventually(async () => expect(await transport.deadLetters.list('c')).toEqual([]));
  });

  it('gives a dead letter whose messageId has spaces and a newline an id an operator can copy, and replays and purges by it', async () => {
    const { transport } = setup();
    const handled: string[] = [];
    let accepting = false;
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 2 }, async (d) => {
      if (accepting) {
        handled.push(d.envelope.messageId);
        await d.ack();
      } else await d.deadLetter({ code: 'POISON', message: 'poison' });
    });
    const odd = envelope('t', { messageId: `order 42\nline two ${testId()}` });
    const other = envelope('t', { messageId: `order: 43 ${testId()}` });
    await transport.publish([odd, other]);
    const letters = await eventually(async () => {
      const list = await transport.deadLetters.list('c');
      expect(list).toHaveLength(2);
      return list;
    });
    // `courier dead show|replay|purge dlq:<consumer>:<id>` takes it as one token.
    for (const letter of letters) expect(letter.id).toMatch(/^[^\s\p{C}]+$/u);
    const idOf = (messageId: string) => letters.find((letter) => letter.envelope.messageId === messageId)!.id;
    accepting = true;
    expect(await transport.deadLetters.replay('c', [idOf(odd.messageId)])).toBe(1);
    await eventually(() => expect(handled).toEqual([odd.messageId]));
    expect(await transport.deadLetters.purge('c', [idOf(other.messageId)])).toBe(1);
    await eventually(async () => expect(await transport.deadLetters.list('c')).toEqual([]));
  });

  it('throws a retriable TransportError when a delivery is settled after its connection died, and the broker redelivers', async () => {
    const { transport, connections } = setup();
    const deliveries: Delivery[] = [];
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    cleanups.push(async () => release());
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 4 }, async (d) => {
      deliveries.push(d);
      // The first handler stays busy (a frozen worker); the redelivery is acknowledged.
      if (deliveries.length === 1) await held;
      else await d.ack();
    });
    const sent = envelope('t');
    await transport.publish([sent]);
    await eventually(() => expect(deliveries).toHaveLength(1));
    destroySocket(connections[0]!);
    await eventually(() => expect(transport.connected).toBe(false));
    const error = await deliveries[0]!.ack().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransportError);
    expect((error as TransportError).retriable).toBe(true);
    await eventually(() => expect(deliveries.map((d) => d.envelope.messageId)).toEqual([sent.messageId, sent.messageId]));
  });
});

describe('RabbitMqTransport surviving the broker', () => {
  it('reconnects after its socket dies, re-declares, and resumes consuming', async () => {
    const { transport, connections } = setup();
    const got: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async (d) => {
      got.push(d.envelope.messageId);
      await d.ack();
    });
    destroySocket(connections[0]!);
    await eventually(() => expect(transport.stats().reconnects).toBe(1));
    const after = envelope('t');
    await eventually(async () => expect(await transport.publish([after])).toMatchObject([{ ok: true }]));
    await eventually(() => expect(got).toContain(after.messageId));
    expect(transport.stats().disconnects).toBe(1);
  });

  it('reconnects after the broker closes the connection (rabbitmqctl close_connection)', async () => {
    const { prefix, transport } = setup();
    const got: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async (d) => {
      got.push(d.envelope.messageId);
      await d.ack();
    });
    expect(await closeConnectionsNamed(prefix)).toBe(1);
    await eventually(() => expect(transport.stats().reconnects).toBe(1), 15_000);
    const after = envelope('t');
    await eventually(async () => expect(await transport.publish([after])).toMatchObject([{ ok: true }]));
    await eventually(() => expect(got).toContain(after.messageId));
  });

  /** Subscribes consumer 'c' to 't' with one slot, publishes one message and resolves once its handler runs and holds (released at clean-up). */
  const holdOneHandler = async (transport: ReturnType<typeof setup>['transport']): Promise<void> => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    cleanups.push(async () => release());
    const started: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async (d) => {
      started.push(d.envelope.messageId);
      await held;
    });
    await transport.publish([envelope('t')]);
    await eventually(() => expect(started).toHaveLength(1));
  };

  it('stops waiting for a handler in flight when close() gets a signal that has already aborted', async () => {
    const { transport } = setup();
    await holdOneHandler(transport);
    const closed = await Promise.race([transport.close({ signal: AbortSignal.abort() }).then(() => true), sleep(5_000).then(() => false)]);
    expect(closed, 'close() waited for the handler although its signal had aborted').toBe(true);
    expect(transport.connected).toBe(false);
  });

  it('declares nothing after close() resolved, though close cut a handler short while a reconnect and a consumer restart were pending', async () => {
    // A user who deletes the topology after closing must not get queues back from timers
    // or a reconnect the close left behind. random 0: reconnect after 25 ms, restart after 100 ms.
    const { prefix, transport, connections, factory, names } = setup({ random: () => 0 });
    await holdOneHandler(transport);
    // The channel closing schedules the consumer's restart; the connection closing, the reconnect.
    destroySocket(connections[0]!);
    await eventually(() => expect(transport.connected).toBe(false));
    await transport.close({ signal: AbortSignal.abort() });
    const called = factory.calls;
    const opened = connections.length;
    await deleteTopology(prefix, ['c']);
    // An absence cannot be polled for, but what would cause it can be waited for. The
    // reconnect and the restart close() must cancel are timers of this process, set before
    // close() resolved and due within 500 ms (reconnect.maxDelayMs; the restart comes after
    // 100 ms), and a reconnect calls the factory from its timer before anything else. Node
    // runs timers in the order they fall due, however late a loaded machine runs them, so
    // when a timer set now for 1 s fires, every one of those has fired before it.
    await sleep(1_000);
    expect(factory.calls, 'the transport asked for a connection after close() resolved').toBe(called);
    // A connection asked for before close() resolved must not open after it either: once every
    // ask is answered, none may have brought one.
    await eventually(() => expect(factory.unanswered, 'connection asks still unanswered').toBe(0), 30_000);
    expect(connections.length, 'a connection was opened after close() resolved').toBe(opened);
    const queues = [names.queue, names.deadLetterQueue, ...names.retryQueues.map((tier) => tier.name)];
    expect(await existingQueues(queues), 'queues declared again after close() resolved').toEqual([]);
  });

  it('fails only the unconfirmed messages of a batch cut by a connection loss, as retriable connectivity failures', async () => {
    const { transport, connections } = setup({ confirmWindow: 64 });
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    // The publish channel opens at the first publish (connecting declares nothing): open it
    // first, so the cut falls inside the batch's confirms, not inside the channel's opening
    // (which fails the whole call, as an unreachable broker does).
    expect((await transport.publish([envelope('t')]))[0]?.ok).toBe(true);
    const batch: Envelope[] = Array.from({ length: 5_000 }, () => envelope('t'));
    const publishing = transport.publish(batch);
    await sleep(5);
    destroySocket(connections[0]!);
    const results = await publishing;
    expect(results.map((r) => r.messageId)).toEqual(batch.map((e) => e.messageId));
    const failed = results.filter((r) => !r.ok);
    expect(failed.length).toBeGreaterThan(0);
    for (const result of failed) expect(!result.ok && [result.error.code, result.error.retriable]).toEqual(['TRANSPORT', true]);
  });
});
