import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ClosedError, ConfigError, InMemoryBroker, type Delivery, type Envelope, type Transport } from '@courier/core';

let counter = 0;
function envelope(key: string | null = null, overrides: Partial<Envelope> = {}): Envelope {
  counter += 1;
  const messageId = `m-${counter}`;
  return {
    messageId,
    type: 'tests.Thing',
    version: 1,
    topic: 'tests',
    occurredAt: '2024-01-01T00:00:00.000Z',
    key,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
    ...overrides,
  };
}

async function until(check: () => boolean, timeoutMs = 2_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(5);
  }
}

async function record(transport: Transport, consumer: string, handle: (delivery: Delivery) => Promise<void> = (d) => d.ack(), ordered = false) {
  const seen: Delivery[] = [];
  const subscription = await transport.subscribe({ consumer, topics: ['tests'], ordered, concurrency: 4 }, async (delivery) => {
    seen.push(delivery);
    await handle(delivery);
  });
  return { seen, subscription, ids: () => seen.map((delivery) => delivery.envelope.messageId) };
}

describe('InMemoryBroker', () => {
  it('declares its capabilities, with a configurable size limit enforced per message', async () => {
    await using broker = new InMemoryBroker({ maxMessageBytes: 10 });
    const transport = broker.connect();
    expect(transport.capabilities).toEqual({ orderingByKey: true, orderedPipelining: true, nativeDelay: true, nativeDeadLetter: true, maxMessageBytes: 10 });
    const results = await transport.publish([envelope(null, { payload: '"12345678"' }), envelope(null, { payload: '"123456789"' })]);
    expect(results.map((result) => result.ok)).toEqual([true, false]);
    expect(results[1]).toMatchObject({ ok: false, error: { code: 'PAYLOAD_TOO_LARGE', retriable: false } });
    expect(() => new InMemoryBroker({ maxMessageBytes: 0 })).toThrowError(ConfigError);
  });

  it('copies messages through their wire form: deliveries are frozen and share nothing with the publisher', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    const inbox = await record(transport, 'c');
    const headers: Record<string, string> = { a: '1' };
    const sent = envelope(null, { headers });
    await transport.publish([sent]);
    headers['a'] = 'changed';
    await until(() => inbox.seen.length === 1);
    const got = inbox.seen[0]!.envelope;
    expect(got.headers).toEqual({ a: '1' });
    expect(got).not.toBe(sent);
    expect(Object.isFrozen(got) && Object.isFrozen(got.headers)).toBe(true);
  });

  it('keeps messages of a topic nobody subscribed to for the first group that does', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    const early = envelope();
    await transport.publish([early]);
    const first = await record(transport, 'first');
    await until(() => first.seen.length === 1);
    const late = await record(transport, 'late');
    await transport.publish([envelope()]);
    await until(() => late.seen.length === 1 && first.seen.length === 2);
    expect(late.ids()).not.toContain(early.messageId);
  });

  it('rejects selected messages until the rule is removed', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    const bad = envelope();
    const remove = broker.failPublish((candidate) => candidate.messageId === bad.messageId);
    expect((await transport.publish([bad]))[0]).toMatchObject({ ok: false, error: { code: 'PUBLISH_REJECTED', retriable: true } });
    remove();
    expect((await transport.publish([bad]))[0]).toEqual({ messageId: bad.messageId, ok: true });
  });

  it('gives back a delivery whose handler returned or threw without settling, same attempt', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    let calls = 0;
    const inbox = await record(transport, 'c', async (delivery) => {
      calls += 1;
      if (calls === 1) return;
      if (calls === 2) throw new Error('escaped');
      await delivery.ack();
    });
    await transport.publish([envelope()]);
    await until(() => calls === 3);
    expect(inbox.seen.map((delivery) => delivery.attempt)).toEqual([1, 1, 1]);
  });

  it('ignores a second settle and rejects settles from a killed connection', async () => {
    await using broker = new InMemoryBroker();
    const doomed = broker.connect();
    const held: Delivery[] = [];
    await doomed.subscribe({ consumer: 'c', topics: ['tests'], ordered: false, concurrency: 2 }, (delivery) => {
      held.push(delivery);
      return new Promise(() => undefined);
    });
    await doomed.publish([envelope(), envelope()]);
    await until(() => held.length === 2);
    await held[0]!.ack();
    await held[0]!.deadLetter({ code: 'X', message: 'ignored' });
    expect(await doomed.deadLetters.list('c')).toEqual([]);
    broker.kill(doomed);
    expect(doomed.state).toBe('killed');
    await expect(held[1]!.ack()).rejects.toThrowError(/was killed/);
    await expect(doomed.publish([envelope()])).rejects.toBeInstanceOf(ClosedError);
    const survivor = await record(broker.connect(), 'c');
    await until(() => survivor.seen.length === 1);
    expect(survivor.ids()).toEqual([held[1]!.envelope.messageId]);
  });

  it('after a kill, an ordered group gets the unsettled head of a key before the rest of the key', async () => {
    await using broker = new InMemoryBroker();
    const doomed = broker.connect();
    const held: Delivery[] = [];
    await doomed.subscribe({ consumer: 'c', topics: ['tests'], ordered: true, concurrency: 4 }, (delivery) => {
      held.push(delivery);
      return new Promise(() => undefined);
    });
    const [k1, k2, k3] = [envelope('k'), envelope('k'), envelope('k')];
    await doomed.publish([k1, k2, k3]);
    await until(() => held.length === 1);
    broker.kill(doomed);
    const survivor = await record(broker.connect(), 'c', (delivery) => delivery.ack(), true);
    await until(() => survivor.seen.length === 3);
    expect(survivor.ids()).toEqual([k1.messageId, k2.messageId, k3.messageId]);
  });

  it('holds deliveries and refuses subscribe during an outage', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    const inbox = await record(transport, 'c');
    broker.setAvailable(false);
    await expect(transport.subscribe({ consumer: 'd', topics: ['tests'], ordered: false, concurrency: 1 }, async () => undefined)).rejects.toMatchObject({
      retriable: true,
    });
    await expect(transport.publish([envelope()])).rejects.toMatchObject({ name: 'TransportError', retriable: true });
    broker.setAvailable(true);
    await transport.publish([envelope()]);
    await until(() => inbox.seen.length === 1);
  });

  it('keeps dead letters per consumer group', async () => {
    await using broker = new InMemoryBroker();
    const transport = broker.connect();
    const a = await record(transport, 'a', (delivery) => delivery.deadLetter({ code: 'A', message: 'a' }));
    const b = await record(transport, 'b', (delivery) => delivery.ack());
    await transport.publish([envelope()]);
    await until(() => a.seen.length === 1 && b.seen.length === 1);
    expect((await transport.deadLetters.list('a')).map((letter) => letter.reason.code)).toEqual(['A']);
    expect(await transport.deadLetters.list('b')).toEqual([]);
    expect(await transport.deadLetters.replay('nobody', ['x'])).toBe(0);
  });

  it('validates endpoints listing every problem, and refuses foreign transports and use after close', async () => {
    const broker = new InMemoryBroker();
    const transport = broker.connect();
    await expect(transport.subscribe({ consumer: '', topics: [], ordered: false, concurrency: 0 }, async () => undefined)).rejects.toMatchObject({
      problems: [expect.stringContaining("'consumer'"), expect.stringContaining("'topics'"), expect.stringContaining("'concurrency'")],
    });
    expect(() => broker.kill({} as Transport)).toThrowError(ConfigError);
    await Promise.all([broker.close(), broker.close()]);
    expect(() => broker.connect()).toThrowError(ClosedError);
    await expect(transport.publish([envelope()])).rejects.toBeInstanceOf(ClosedError);
  });
});
