import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  ConfigError,
  CourierError,
  InMemoryBroker,
  SerializationError,
  StorageError,
  defineMessage,
  type InMemoryTransaction,
  type OutboxPublisher,
} from '@courier/core';
import { harness } from './support/harness.js';

const Note = defineMessage('notes.NoteTaken', { version: 1 });
const Order = defineMessage('orders.OrderPlaced', {
  version: 1,
  schema: z.object({
    orderId: z.string(),
    lines: z.array(z.object({ sku: z.string(), qty: z.number().int().positive() })),
  }),
});

/** Returns what `act` threw, failing the test when it did not throw. */
function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

/** Pending rows' messageIds and payloads, claimed under a throwaway lease (no relay runs in these tests). */
async function rows(h: ReturnType<typeof harness>) {
  const batch = await h.outbox.claim({ owner: 'inspector', limit: 1_000, leaseMs: 60_000, perKey: 1_000 });
  return batch.records.map((record) => ({ messageId: record.envelope.messageId, payload: record.envelope.payload }));
}

describe('bus.outbox(tx).publish: bad input', () => {
  it.each([
    ['a BigInt', { n: 1n }, "'payload.n'", 'BigInt'],
    ['a function', { f: () => 1 }, "'payload.f'", 'function'],
    ['a Date', { at: new Date(0) }, "'payload.at'", 'Date'],
    ['undefined', { u: undefined }, "'payload.u'", 'undefined'],
    ['NaN', { list: [1, Number.NaN] }, "'payload.list[1]'", 'NaN'],
    ['Infinity', { deep: { x: Number.NEGATIVE_INFINITY } }, "'payload.deep.x'", 'Infinity'],
    ['a Map', { m: new Map([[1, 2]]) }, "'payload.m'", 'Map'],
    ['a Set', { s: new Set([1]) }, "'payload.s'", 'Set'],
    ['a class instance', { money: new (class Money { amount = 1; })() }, "'payload.money'", 'Money'],
    ['a top-level undefined', undefined, "'payload'", 'undefined'],
  ])('refuses %s in the payload naming the field, and writes nothing of it', async (_name, payload, path, what) => {
    await using h = harness();
    let kept = '';
    await h.commit((tx) => {
      const error = thrown(() => h.bus.outbox(tx).publish(Note, payload as never));
      expect(error).toBeInstanceOf(SerializationError);
      expect(error).toMatchObject({ code: 'PAYLOAD_NOT_JSON', retriable: false });
      expect((error as Error).message).toContain(path);
      expect((error as Error).message).toContain(what);
      kept = h.bus.outbox(tx).publish(Note, { ok: true });
    });
    expect(await rows(h)).toEqual([{ messageId: kept, payload: '{"ok":true}' }]);
  });

  it('refuses a cyclic payload naming the cycle', async () => {
    await using h = harness();
    const cyclic: Record<string, unknown> = { a: { b: {} } };
    (cyclic['a'] as { b: Record<string, unknown> }).b['back'] = cyclic;
    await h.commit((tx) => {
      expect(() => h.bus.outbox(tx).publish(Note, cyclic)).toThrowError("'payload.a.b.back' is a circular reference");
    });
    expect(await rows(h)).toEqual([]);
  });

  it('refuses a payload its schema rejects with PAYLOAD_INVALID naming the path, and keeps the payload as given when valid', async () => {
    await using h = harness();
    let kept = '';
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const error = thrown(() => outbox.publish(Order, { orderId: 'o-1', lines: [{ sku: 'a', qty: 1 }, { sku: 'b', qty: -2 }] }));
      expect(error).toBeInstanceOf(SerializationError);
      expect(error).toMatchObject({ code: 'PAYLOAD_INVALID', path: 'payload.lines.1.qty' });
      expect((error as Error).message).toContain("'payload.lines[1].qty'");
      expect((error as Error).message).toContain("'orders.OrderPlaced'");
      expect(() => outbox.publish(Order, { lines: [] } as never)).toThrowError("'payload.orderId'");
      kept = outbox.publish(Order, { orderId: 'o-2', lines: [{ sku: 'c', qty: 3 }] });
    });
    expect(await rows(h)).toEqual([{ messageId: kept, payload: '{"orderId":"o-2","lines":[{"sku":"c","qty":3}]}' }]);
  });

  it("refuses a payload over the transport's maxMessageBytes when it is below the configured limit", async () => {
    await using h = harness({ broker: { maxMessageBytes: 64 } });
    const fits = { text: 'x'.repeat(64 - '{"text":""}'.length) };
    const over = { text: 'x'.repeat(65 - '{"text":""}'.length) };
    let kept = '';
    await h.commit((tx) => {
      const error = thrown(() => h.bus.outbox(tx).publish(Note, over));
      expect(error).toBeInstanceOf(SerializationError);
      expect(error).toMatchObject({ code: 'PAYLOAD_TOO_LARGE', path: 'payload' });
      expect((error as Error).message).toMatch(/65 bytes; the limit is 64/);
      kept = h.bus.outbox(tx).publish(Note, fits);
    });
    expect((await rows(h)).map((row) => row.messageId)).toEqual([kept]);
  });

  it("refuses a payload over the configured maxPayloadBytes when it is below the transport's", async () => {
    await using h = harness({ bus: { maxPayloadBytes: 20 } });
    await h.commit((tx) => {
      // Multi-byte characters count as their UTF-8 bytes: 8 × 2 bytes + 11 of JSON = 27.
      expect(() => h.bus.outbox(tx).publish(Note, { text: 'é'.repeat(8) })).toThrowError(/27 bytes; the limit is 20/);
      h.bus.outbox(tx).publish(Note, { text: 'é'.repeat(4) });
    });
    expect(await rows(h)).toHaveLength(1);
  });

  it('refuses non-string headers and the reserved courier- prefix in any case, listing every header at fault', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const error = thrown(() =>
        outbox.publish(Note, {}, { headers: { tenant: 42, flag: true, 'Courier-Attempt': '1', 'COURIER-x': 'y', 'courier-trace': 'z' } as never }),
      );
      expect(error).toBeInstanceOf(ConfigError);
      const problems = (error as ConfigError).problems.join('\n');
      expect(problems).toContain("header 'tenant' must be a string, got number 42");
      expect(problems).toContain("header 'flag' must be a string, got boolean");
      expect(problems).toContain("header 'Courier-Attempt' uses the reserved 'courier-' prefix");
      expect(problems).toContain("header 'COURIER-x' uses the reserved");
      expect(problems).toContain("header 'courier-trace' uses the reserved");
      expect((error as ConfigError).problems).toHaveLength(5);
      expect(() => outbox.publish(Note, {}, { headers: [] as never })).toThrowError("'headers' must be an object of string values");
      outbox.publish(Note, {}, { headers: { 'x-courier-like': 'fine' } });
    });
    expect(await rows(h)).toHaveLength(1);
  });

  it('validates publish options, listing every problem at once', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const cases: [Parameters<OutboxPublisher['publish']>[2], string[]][] = [
        [{ delay: -1 }, ["'delay' must be a finite number of milliseconds, 0 or more"]],
        [{ delay: Number.NaN }, ["'delay'"]],
        [{ notBefore: new Date('not a date') }, ["'notBefore' must be a valid Date"]],
        [{ notBefore: '2030-01-01' as never }, ["'notBefore' must be a valid Date"]],
        [{ delay: 10, notBefore: new Date() }, ["give 'delay' or 'notBefore', not both"]],
        [
          { delay: -5, notBefore: new Date(Number.NaN), key: '', messageId: 7 as never, occurredAt: new Date(Number.NaN) },
          ["'delay'", "'notBefore'", 'not both', "'key'", "'messageId'", "'occurredAt'"],
        ],
      ];
      for (const [options, expected] of cases) {
        const error = thrown(() => outbox.publish(Note, {}, options));
        expect(error).toBeInstanceOf(ConfigError);
        expect((error as ConfigError).problems).toHaveLength(expected.length);
        for (const fragment of expected) expect((error as ConfigError).problems.some((problem) => problem.includes(fragment))).toBe(true);
        for (const problem of (error as ConfigError).problems) expect(problem).toMatch(/^publish 'notes.NoteTaken': /);
      }
    });
    expect(await rows(h)).toEqual([]);
  });

  it('refuses to publish without a unit of work, or with one that has ended', async () => {
    await using h = harness();
    const none = thrown(() => h.bus.outbox(undefined as any).publish(Note, {}));
    expect(none).toBeInstanceOf(CourierError);
    expect(none).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED' });
    const committed = h.db.begin();
    await committed.commit();
    expect(thrown(() => h.bus.outbox(committed).publish(Note, {}))).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    const rolledBack = h.db.begin();
    await rolledBack.rollback();
    expect(thrown(() => h.bus.outbox(rolledBack).publish(Note, {}))).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    expect(thrown(() => h.bus.outbox(new InMemoryBroker() as unknown as InMemoryTransaction).publish(Note, {}))).toMatchObject({
      code: 'UNIT_OF_WORK_REQUIRED',
    });
    expect(await rows(h)).toEqual([]);
  });

  it('refuses a messageId already in the outbox; the earlier row is intact', async () => {
    await using h = harness();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Note, { first: true }, { messageId: 'dup-1' });
    });
    await h.commit((tx) => {
      const error = thrown(() => h.bus.outbox(tx).publish(Note, { second: true }, { messageId: 'dup-1' }));
      expect(error).toBeInstanceOf(StorageError);
      expect(error).toMatchObject({ code: 'DUPLICATE_MESSAGE_ID', retriable: false });
      expect((error as Error).message).toContain("'dup-1'");
    });
    expect(await rows(h)).toEqual([{ messageId: 'dup-1', payload: '{"first":true}' }]);
  });

  it('fails the later of two open transactions that reuse a messageId, writing none of its messages', async () => {
    await using h = harness();
    const earlier = h.db.begin();
    const later = h.db.begin();
    h.bus.outbox(earlier).publish(Note, { from: 'earlier' }, { messageId: 'dup-2' });
    h.bus.outbox(later).publish(Note, { from: 'later' }, { messageId: 'other' });
    h.bus.outbox(later).publish(Note, { from: 'later' }, { messageId: 'dup-2' });
    await earlier.commit();
    await expect(later.commit()).rejects.toMatchObject({ code: 'DUPLICATE_MESSAGE_ID' });
    expect(later.state).toBe('rolled-back');
    expect(await rows(h)).toEqual([{ messageId: 'dup-2', payload: '{"from":"earlier"}' }]);
  });

  it('refuses something that is not a message definition', async () => {
    await using h = harness();
    await h.commit((tx) => {
      expect(() => h.bus.outbox(tx).publish({ type: 'x' } as any, {})).toThrowError(ConfigError);
      expect(() => h.bus.outbox(tx).publish(null as any, {})).toThrowError('publish needs a message definition from defineMessage(...)');
    });
  });

  it('stores the envelope fields as given, defaulting correlationId to the messageId', async () => {
    await using h = harness();
    const occurredAt = new Date('2024-05-06T07:08:09.123Z');
    let a = '';
    await h.commit((tx) => {
      a = h.bus.outbox(tx).publish(Note, { n: 1 }, { key: 'k-1', headers: { tenant: 't' }, occurredAt });
      h.bus.outbox(tx).publish(Note, { n: 2 }, { messageId: 'explicit', correlationId: 'conv', causationId: a });
    });
    const batch = await h.outbox.claim({ owner: 'inspector', limit: 10, leaseMs: 60_000, perKey: 10 });
    const [first, second] = batch.records.map((record) => record.envelope);
    expect(first).toEqual({
      messageId: a,
      type: 'notes.NoteTaken',
      version: 1,
      topic: 'notes',
      occurredAt: '2024-05-06T07:08:09.123Z',
      key: 'k-1',
      correlationId: a,
      causationId: null,
      traceparent: null,
      tracestate: null,
      headers: { tenant: 't' },
      payload: '{"n":1}',
    });
    expect(a).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(second).toMatchObject({ messageId: 'explicit', correlationId: 'conv', causationId: a, key: null });
  });
});
