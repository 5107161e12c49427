import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigError, SerializationError, decodeForConsume, defineMessage, validateForPublish } from '@courier/core';

function problemsOf(act: () => unknown): readonly string[] {
  try {
    act();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    expect(error).toMatchObject({ code: 'CONFIG_INVALID', retriable: false });
    return (error as ConfigError).problems;
  }
  return expect.unreachable('expected a ConfigError');
}

describe('defineMessage', () => {
  it('derives the topic from the type prefix and freezes the definition', () => {
    const Placed = defineMessage('orders.OrderPlaced', { version: 2, upcasters: { 1: (p) => p } });
    expect(Placed).toMatchObject({ type: 'orders.OrderPlaced', version: 2, topic: 'orders', schema: undefined });
    expect(Object.isFrozen(Placed)).toBe(true);
    expect(Object.isFrozen(Placed.upcasters)).toBe(true);
    expect(defineMessage('orders.v2.Shipped', { version: 1, topic: 'shipping.events' }).topic).toBe('shipping.events');
    expect(defineMessage('Standalone', { version: 1, topic: 'misc' }).topic).toBe('misc');
  });

  it.each(['', ' ', 'orders.', '.orders', 'orders..Placed', 'orders.Order Placed', 'orders/Placed', 'orders.Plaçed', 'x'.repeat(201)])(
    'refuses the malformed type %j',
    (type) => {
      const problems = problemsOf(() => defineMessage(type, { version: 1, topic: 'orders' }));
      expect(problems).toHaveLength(1);
      expect(problems[0]).toContain(`message type ${JSON.stringify(type)} is malformed`);
    },
  );

  it.each([0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53, '1', null, undefined])('refuses the version %j', (version) => {
    const problems = problemsOf(() => defineMessage('orders.OrderPlaced', { version: version as number }));
    expect(problems).toEqual([`version of 'orders.OrderPlaced' must be an integer of 1 or more, got ${JSON.stringify(version)}`]);
  });

  it('lists every problem at once', () => {
    const problems = problemsOf(() =>
      defineMessage('', { version: 0.5, schema: { validate: () => true } as never, upcasters: { 1: 'not a function' as never } }),
    );
    expect(problems).toHaveLength(4);
    expect(problems[0]).toContain('message type "" is malformed');
    expect(problems[1]).toContain('must be an integer of 1 or more, got 0.5');
    expect(problems[2]).toContain("has no prefix; give it a 'topic'");
    expect(problems[3]).toContain('is not a Standard Schema validator');

    const more = problemsOf(() => defineMessage('orders.X', { version: 3, topic: 'bad topic', upcasters: { 2: 42 as never } }));
    expect(more).toEqual([
      `topic "bad topic" of 'orders.X' is malformed: use letters, digits, '.', '_' or '-'`,
      `upcaster 2 of 'orders.X' must be a function`,
    ]);
  });

  it('refuses a missing config object with a ConfigError, not a TypeError', () => {
    const problems = problemsOf(() => defineMessage('orders.X', undefined as never));
    expect(problems[0]).toContain("version of 'orders.X'");
  });
});

describe('validateForPublish and decodeForConsume', () => {
  const V1 = defineMessage('people.Registered', { version: 1 });
  const V3 = defineMessage('people.Registered', {
    version: 3,
    schema: z.object({ name: z.object({ first: z.string(), last: z.string() }), email: z.email() }).transform((p) => ({ ...p, display: `${p.name.first} ${p.name.last}` })),
    upcasters: {
      1: (p) => {
        const { fullName, ...rest } = p as { fullName: string };
        const [first = '', last = ''] = fullName.split(' ');
        return { ...rest, name: { first, last } };
      },
      2: (p) => ({ email: 'unknown@example.com', ...(p as object) }),
    },
  });

  it('upcasts 1→2→3 in order, then validates, returning the schema output', async () => {
    await expect(decodeForConsume(V3, 1, { fullName: 'Ada Lovelace' })).resolves.toEqual({
      name: { first: 'Ada', last: 'Lovelace' },
      email: 'unknown@example.com',
      display: 'Ada Lovelace',
    });
    await expect(decodeForConsume(V3, 2, { name: { first: 'A', last: 'B' }, email: 'a@b.co' })).resolves.toMatchObject({ email: 'a@b.co' });
    await expect(decodeForConsume(V1, 1, { anything: [1] })).resolves.toEqual({ anything: [1] });
  });

  it('refuses a newer version, and a version with no upcaster path, with UNSUPPORTED_VERSION', async () => {
    await expect(decodeForConsume(V1, 2, {})).rejects.toMatchObject({ code: 'UNSUPPORTED_VERSION', retriable: false, message: expect.stringContaining('version 2 is newer than the consumer knows (1)') });
    const Gap = defineMessage('people.Gap', { version: 3, upcasters: { 2: (p) => p } });
    await expect(decodeForConsume(Gap, 1, {})).rejects.toMatchObject({ code: 'UNSUPPORTED_VERSION', message: expect.stringContaining('version 1 has no upcaster to version 2') });
  });

  it('refuses a payload invalid after upcasting with PAYLOAD_INVALID naming the path', async () => {
    const error = await decodeForConsume(V3, 3, { name: { first: 'A', last: 7 }, email: 'x' }).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(SerializationError);
    expect(error).toMatchObject({ code: 'PAYLOAD_INVALID', path: 'payload.name.last' });
    expect((error as Error).message).toContain("'payload.name.last'");
    expect((error as Error).message).toContain("'payload.email'");
  });

  it('refuses an asynchronous schema on publish, where validation must be synchronous', () => {
    const Async = defineMessage('people.Async', { version: 1, schema: z.object({ a: z.string() }).refine(async () => true) });
    expect(() => validateForPublish(Async, { a: 'x' })).toThrowError(/validates asynchronously/);
  });
});
