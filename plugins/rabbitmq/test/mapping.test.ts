import { ConfigError, SerializationError, type Envelope } from '@courier/core';
import { describe, expect, it } from 'vitest';
import { chooseDelayTier, COURIER_HEADERS, fromAmqpMessage, RabbitMqTransport, rabbitMqNames, toAmqpMessage } from '../src/index.js';

const full: Envelope = {
  messageId: '0190d6f2-8a5b-7cc0-9b3a-4d5e6f708192',
  type: 'orders.OrderPlaced',
  version: 3,
  topic: 'orders',
  occurredAt: '2024-07-01T12:34:56.789Z',
  key: 'order-42',
  correlationId: 'corr-1',
  causationId: 'cause-1',
  traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
  tracestate: 'congo=t61rcWkgMzE',
  headers: { tenant: 'acme', 'x-custom': 'ünïcødé ✓' },
  payload: '{"orderId":"42","total":12.5,"tags":["a"],"note":"日本"}',
};

const minimal: Envelope = {
  ...full,
  key: null,
  causationId: null,
  traceparent: null,
  tracestate: null,
  headers: {},
};

/** What amqplib hands a consumer for a message published with these properties. */
function received(message: ReturnType<typeof toAmqpMessage>) {
  return { content: message.content, properties: { ...message.properties, headers: { ...message.properties.headers } } };
}

describe('envelope ↔ AMQP mapping', () => {
  it('maps fields onto AMQP properties and courier- headers', () => {
    const { content, properties } = toAmqpMessage(full);
    expect(content.toString('utf8')).toBe(full.payload);
    expect(properties).toMatchObject({
      messageId: full.messageId,
      correlationId: 'corr-1',
      type: 'orders.OrderPlaced',
      timestamp: Math.floor(Date.parse(full.occurredAt) / 1000),
      contentType: 'application/json',
      deliveryMode: 2,
    });
    expect(properties.headers).toMatchObject({
      tenant: 'acme',
      [COURIER_HEADERS.occurredAt]: full.occurredAt,
      [COURIER_HEADERS.version]: 3,
      [COURIER_HEADERS.topic]: 'orders',
      [COURIER_HEADERS.key]: 'order-42',
      [COURIER_HEADERS.causationId]: 'cause-1',
      [COURIER_HEADERS.traceparent]: full.traceparent,
      [COURIER_HEADERS.tracestate]: full.tracestate,
    });
  });

  it.each([
    ['every field set', full],
    ['nullable fields null', minimal],
    ['empty-string key (distinct from null)', { ...minimal, key: '' }],
  ])('round-trips with %s', (_, envelope) => {
    expect(fromAmqpMessage(received(toAmqpMessage(envelope)))).toEqual(envelope);
  });

  it('keeps a __proto__ header as data through amqplib table decoding', () => {
    const headers: Record<string, string> = {};
    Object.defineProperty(headers, '__proto__', { value: 'data', enumerable: true, writable: true, configurable: true });
    const back = fromAmqpMessage(received(toAmqpMessage({ ...minimal, headers })));
    expect(Object.entries(back.headers)).toEqual([['__proto__', 'data']]);
    expect(Object.getPrototypeOf(back.headers)).toBe(Object.prototype);
  });

  it('refuses a user header RabbitMQ owns, which could not round-trip', () => {
    expect(() => toAmqpMessage({ ...minimal, headers: { 'x-death': 'mine' } })).toThrow(SerializationError);
  });

  it('refuses the sender-selected routing headers CC and BCC (case-sensitive, as RabbitMQ), naming each, in the mapping and in validate alike', () => {
    const transport = new RabbitMqTransport({ connection: 'amqp://127.0.0.1:1' });
    const headers = { CC: 'x', BCC: 'y', 'X-Death': 'z', cc: 'fine', 'x-tenant': 'fine' };
    const problems = transport.validate({ ...minimal, headers });
    expect(problems).toHaveLength(3);
    expect(problems[0]).toContain("header 'CC' is reserved by RabbitMQ for sender-selected routing");
    expect(problems[1]).toContain("header 'BCC'");
    expect(problems[2]).toContain("header 'X-Death'");
    expect(() => toAmqpMessage({ ...minimal, headers })).toThrow(/'CC'.*'BCC'.*'X-Death'/);
    expect(transport.validate({ ...minimal, headers: { cc: 'fine', 'x-tenant': 'fine' } })).toEqual([]);
    expect(toAmqpMessage({ ...minimal, headers: { cc: 'fine', 'x-tenant': 'fine' } }).properties.headers).toMatchObject({ cc: 'fine', 'x-tenant': 'fine' });
  });

  it('leaves routing headers of other producers out of the user headers', () => {
    const message = received(toAmqpMessage(full));
    message.properties.headers['CC'] = ['elsewhere'];
    expect(fromAmqpMessage(message).headers).toEqual(full.headers);
  });

  it('leaves broker-added headers out of the user headers', () => {
    const message = received(toAmqpMessage(full));
    message.properties.headers['x-death'] = [{ count: 1 }];
    message.properties.headers['x-delivery-count'] = 2;
    message.properties.headers['x-first-death-reason'] = 'expired';
    message.properties.headers[COURIER_HEADERS.attempt] = 3;
    expect(fromAmqpMessage(message).headers).toEqual(full.headers);
  });

  it('falls back to the whole-second timestamp without courier-occurred-at', () => {
    const message = received(toAmqpMessage(full));
    delete message.properties.headers[COURIER_HEADERS.occurredAt];
    expect(fromAmqpMessage(message).occurredAt).toBe('2024-07-01T12:34:56.000Z');
  });

  it('rejects a body that is not UTF-8 and a message missing required fields', () => {
    const message = received(toAmqpMessage(full));
    expect(() => fromAmqpMessage({ ...message, content: Buffer.from([0xff, 0xfe]) })).toThrow(/not valid UTF-8/);
    expect(() => fromAmqpMessage({ content: Buffer.from('{}'), properties: {} })).toThrow(SerializationError);
  });
});

describe('delay tiers', () => {
  const tiers = [1_000, 5_000, 20_000];

  it('clamps below the first and above the last tier', () => {
    expect(chooseDelayTier(tiers, 0)).toBe(0);
    expect(chooseDelayTier(tiers, 1_000)).toBe(0);
    expect(chooseDelayTier(tiers, 999_999)).toBe(2);
  });

  it('picks between neighbours so the expected delay is the requested one', () => {
    // 2,000 ms lies a quarter of the way from 1 s to 5 s: the upper tier with p = 0.25.
    expect(chooseDelayTier(tiers, 2_000, () => 0.2)).toBe(1);
    expect(chooseDelayTier(tiers, 2_000, () => 0.3)).toBe(0);
    let total = 0;
    let seed = 1;
    const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
    for (let i = 0; i < 20_000; i++) total += tiers[chooseDelayTier(tiers, 2_000, random)]!;
    expect(total / 20_000).toBeGreaterThan(1_900);
    expect(total / 20_000).toBeLessThan(2_100);
  });

  it('names one retry queue per tier under the prefix', () => {
    expect(rabbitMqNames('courier', 'payments', [500, 1_000, 120_000, 7_200_000])).toEqual({
      exchange: 'courier.topics',
      queue: 'courier.q.payments',
      deadLetterQueue: 'courier.q.payments.dead',
      retryQueues: [
        { delayMs: 500, name: 'courier.q.payments.retry.500ms' },
        { delayMs: 1_000, name: 'courier.q.payments.retry.1s' },
        { delayMs: 120_000, name: 'courier.q.payments.retry.2m' },
        { delayMs: 7_200_000, name: 'courier.q.payments.retry.2h' },
      ],
    });
  });
});

describe('config', () => {
  it('lists every problem at once', () => {
    let error: unknown;
    try {
      new RabbitMqTransport({ connection: 'http://nope', prefix: 'bad prefix', confirmWindow: 0, delayTiersMs: [5, 1] });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toHaveLength(4);
  });

  it('declares its capabilities', () => {
    const transport = new RabbitMqTransport({ connection: 'amqp://localhost', maxMessageBytes: 1024 });
    expect(transport.capabilities).toEqual({
      orderingByKey: true,
      orderedPipelining: false,
      nativeDelay: false,
      priorities: true,
      nativeDeadLetter: true,
      maxMessageBytes: 1024,
      // The default 10 s timeout plus the 2.5 s by which the sweep may find it late.
      publishTimeoutMs: 12_500,
    });
    expect(new RabbitMqTransport({ connection: 'amqp://localhost', publishTimeoutMs: 600 }).capabilities.publishTimeoutMs).toBe(750);
  });
});
