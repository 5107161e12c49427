import { ClosedError, SerializationError, TransportError, type Delivery, type Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport, type RabbitMqTransportConfig } from '../src/index.js';
import { BROKER_URL, deleteTopology, eventually, openConnection, rabbitmqctl, TEST_TIERS_MS, testId } from './support/broker.js';
import { envelope } from './support/envelopes.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A transport under a fresh prefix, closed and torn down after the test. */
function setup(config: Partial<RabbitMqTransportConfig> = {}, consumers: string[] = ['c']) {
  const id = testId();
  const prefix = `courier-${id}`;
  const transport = new RabbitMqTransport({ connection: BROKER_URL, prefix, delayTiersMs: TEST_TIERS_MS, ...config });
  cleanups.push(async () => {
    await transport.close();
    await deleteTopology(prefix, consumers);
  });
  return { id, prefix, transport };
}

describe('RabbitMqTransport publishing', () => {
  it('round-trips every envelope field through the broker', async () => {
    const { transport } = setup();
    const received: Envelope[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['orders'], ordered: false, concurrency: 1 }, async (delivery) => {
      received.push(delivery.envelope);
      await delivery.ack();
    });
    const headers: Record<string, string> = { tenant: 'acme', 'x-ü': 'värde ✓' };
    Object.defineProperty(headers, '__proto__', { value: 'data', enumerable: true, writable: true, configurable: true });
    const sent = [
      envelope('orders', {
        version: 7,
        key: 'k-1',
        causationId: 'cause',
        traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
        tracestate: 'a=b',
        headers,
        occurredAt: '2024-02-29T23:59:59.999Z',
        payload: '{"a":[1,2.5,"日本",null,true],"b":{}}',
      }),
      envelope('orders', { key: '' }),
    ];
    const results = await transport.publish(sent);
    expect(results).toEqual(sent.map((e) => ({ messageId: e.messageId, ok: true })));
    await eventually(() => expect(received).toHaveLength(2));
    expect(received[0]).toEqual(sent[0]);
    expect(Object.entries(received[0]!.headers)).toHaveLength(3);
    expect(received[1]).toEqual(sent[1]);
  });

  it('fails exactly the unroutable messages (mandatory + basic.return) and counts them', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['bound'], ordered: false });
    const batch = [envelope('bound'), envelope('nobody-listens'), envelope('bound')];
    const results = await transport.publish(batch);
    expect(results.map((r) => r.ok)).toEqual([true, false, true]);
    const failed = results[1]!;
    expect(!failed.ok && failed.error).toBeInstanceOf(TransportError);
    expect(!failed.ok && failed.error.code).toBe('PUBLISH_UNROUTABLE');
    expect(!failed.ok && failed.error.retriable).toBe(true);
    expect(transport.stats().unroutable).toBe(1);
  });

  it('fails exactly the messages the broker nacks, as back-pressure', async () => {
    const { prefix, transport } = setup();
    // A queue that holds one message and nacks the rest (reject-publish overflow).
    const connection = await openConnection(`${prefix}-setup`);
    const channel = await connection.createChannel();
    await channel.assertExchange(`${prefix}.topics`, 'direct', { durable: true });
    await channel.assertQueue(`${prefix}.full`, { durable: true, arguments: { 'x-max-length': 1, 'x-overflow': 'reject-publish' } });
    await channel.bindQueue(`${prefix}.full`, `${prefix}.topics`, 'full');
    cleanups.push(async () => {
      await channel.deleteQueue(`${prefix}.full`);
      await connection.close();
    });
    const results = await transport.publish([envelope('full'), envelope('full'), envelope('full')]);
    expect(results.map((r) => r.ok)).toEqual([true, false, false]);
    // A full queue is not the message's fault: a connectivity-like code, so the relay counts no attempt.
    expect(results.map((r) => (r.ok ? null : r.error.code))).toEqual([null, 'PUBLISH_BACKPRESSURE', 'PUBLISH_BACKPRESSURE']);
    expect(results.every((r) => r.ok || r.error.retriable)).toBe(true);
    expect(transport.stats()).toMatchObject({ nacked: 2, publishFailures: 2 });
  });

  it('refuses a payload over maxMessageBytes without failing its neighbours', async () => {
    const { transport } = setup({ maxMessageBytes: 1_000 });
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    const results = await transport.publish([envelope('t'), envelope('t', { payload: JSON.stringify('x'.repeat(2_000)) }), envelope('t')]);
    expect(results.map((r) => r.ok)).toEqual([true, false, true]);
    const big = results[1]!;
    expect(!big.ok && big.error).toBeInstanceOf(SerializationError);
    expect(!big.ok && big.error.code).toBe('PAYLOAD_TOO_LARGE');
  });

  it('refuses a message whose headers cannot be encoded, alone', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    const huge: Record<string, string> = {};
    for (let i = 0; i < 20; i++) huge[`h${i}`] = 'x'.repeat(4_000);
    const results = await transport.publish([envelope('t', { headers: huge }), envelope('t')]);
    expect(results.map((r) => r.ok)).toEqual([false, true]);
    expect(!results[0]!.ok && results[0]!.error.retriable).toBe(false);
  });

  it('keeps a small confirm window full and answers every message of a large batch in order', async () => {
    const { transport } = setup({ confirmWindow: 8 });
    await transport.provision({ consumer: 'c', topics: ['bulk'], ordered: false });
    const batch = Array.from({ length: 2_000 }, (_, i) => envelope('bulk', { key: `k${i % 10}` }));
    const results = await transport.publish(batch);
    expect(results.map((r) => r.messageId)).toEqual(batch.map((e) => e.messageId));
    expect(results.every((r) => r.ok)).toBe(true);
  });

  it('keeps publish order for one key across unconfirmed messages (ordered pipelining)', async () => {
    const { transport } = setup({ confirmWindow: 64 });
    const seen: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['seq'], ordered: true, concurrency: 4 }, async (d) => {
      seen.push(d.envelope.payload);
      await d.ack();
    });
    const batch = Array.from({ length: 300 }, (_, i) => envelope('seq', { key: 'one', payload: String(i) }));
    await Promise.all([transport.publish(batch.slice(0, 150)), transport.publish(batch.slice(150))]);
    await eventually(() => expect(seen).toHaveLength(300));
    expect(seen).toEqual(batch.map((e) => e.payload));
  });

  it('rejects a call whose signal is already aborted with a retriable ABORTED, sending nothing', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    const controller = new AbortController();
    controller.abort();
    await expect(transport.publish([envelope('t'), envelope('t')], { signal: controller.signal })).rejects.toMatchObject({ code: 'ABORTED', retriable: true });
  });

  it('keeps messages published after provision() for a consumer that starts later', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['early'], ordered: false });
    const sent = envelope('early');
    expect(await transport.publish([sent])).toMatchObject([{ ok: true }]);
    const got: string[] = [];
    await transport.subscribe({ consumer: 'c', topics: ['early'], ordered: false, concurrency: 1 }, async (d) => {
      got.push(d.envelope.messageId);
      await d.ack();
    });
    await eventually(() => expect(got).toEqual([sent.messageId]));
  });

  it('rejects with a retriable TransportError when the broker is unreachable', async () => {
    const transport = new RabbitMqTransport({ connection: 'amqp://guest:guest@127.0.0.1:1', connectTimeoutMs: 2_000 });
    cleanups.push(() => transport.close());
    const error = await transport.publish([envelope('t')]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TransportError);
    expect((error as TransportError).retriable).toBe(true);
    const refused = await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async () => {}).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(TransportError);
    expect((refused as TransportError).retriable).toBe(true);
  });

  it('answers a closed transport with ClosedError, and close is idempotent', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    await Promise.all([transport.close(), transport.close()]);
    await expect(transport.publish([envelope('t')])).rejects.toBeInstanceOf(ClosedError);
    await expect(transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async () => {})).rejects.toBeInstanceOf(
      ClosedError,
    );
  });

  it('supports await using', async () => {
    const prefix = `courier-${testId()}`;
    let escaped: RabbitMqTransport;
    {
      await using transport = new RabbitMqTransport({ connection: BROKER_URL, prefix });
      escaped = transport;
      await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
      expect(transport.connected).toBe(true);
    }
    expect(escaped.connected).toBe(false);
    await deleteTopology(prefix, ['c'], [1_000, 5_000, 20_000, 60_000, 300_000]);
  });
});

describe('RabbitMqTransport topology', () => {
  it('declares quorum queues, safe dead-lettering, tiers with queue TTL and single active consumer when ordered', async () => {
    const { prefix, transport } = setup({}, ['plain', 'ordered']);
    const handler = async (d: Delivery) => d.ack();
    await transport.subscribe({ consumer: 'plain', topics: ['a', 'b'], ordered: false, concurrency: 2 }, handler);
    await transport.subscribe({ consumer: 'ordered', topics: ['a'], ordered: true, concurrency: 1 }, handler);
    const out = await rabbitmqctl('list_queues', '--formatter', 'json', 'name', 'type', 'arguments', 'durable');
    // rabbitmqctl renders arguments as [name, type, value] triples.
    const queues = new Map(
      (JSON.parse(out) as { name: string; type: string; durable: boolean; arguments: [string, string, unknown][] }[])
        .filter((q) => q.name.startsWith(prefix))
        .map((q) => [q.name, { ...q, arguments: Object.fromEntries(q.arguments.map(([k, , v]) => [k, v])) }] as const),
    );
    expect([...queues.keys()].sort()).toEqual(
      [
        `${prefix}.q.ordered`,
        `${prefix}.q.ordered.dead`,
        `${prefix}.q.plain`,
        `${prefix}.q.plain.dead`,
        `${prefix}.q.plain.retry.200ms`,
        `${prefix}.q.plain.retry.600ms`,
      ].sort(),
    );
    for (const queue of queues.values()) {
      expect(queue.type).toBe('quorum');
      expect(queue.durable).toBe(true);
    }
    expect(queues.get(`${prefix}.q.plain`)!.arguments).toMatchObject({
      'x-dead-letter-strategy': 'at-least-once',
      'x-overflow': 'reject-publish',
      'x-dead-letter-routing-key': `${prefix}.q.plain.dead`,
    });
    expect(queues.get(`${prefix}.q.plain`)!.arguments['x-single-active-consumer']).toBeUndefined();
    expect(queues.get(`${prefix}.q.ordered`)!.arguments).toMatchObject({ 'x-single-active-consumer': true });
    expect(queues.get(`${prefix}.q.plain.retry.600ms`)!.arguments).toMatchObject({
      'x-message-ttl': 600,
      'x-dead-letter-strategy': 'at-least-once',
      'x-overflow': 'reject-publish',
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': `${prefix}.q.plain`,
    });
  });

  it('reports a consumer that switches between ordered and unordered as a config error', async () => {
    const { transport } = setup();
    await transport.provision({ consumer: 'c', topics: ['t'], ordered: false });
    await expect(transport.subscribe({ consumer: 'c', topics: ['t'], ordered: true, concurrency: 1 }, async () => {})).rejects.toMatchObject({
      code: 'CONFIG_INVALID',
    });
    // The transport keeps working after the channel error.
    await expect(transport.publish([envelope('t')])).resolves.toMatchObject([{ ok: true }]);
  });
});
