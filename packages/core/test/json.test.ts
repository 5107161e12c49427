import { describe, expect, it } from 'vitest';
import { SerializationError, serializePayload } from '@courier/core';

describe('serializePayload', () => {
  it('keeps plain JSON byte for byte', () => {
    expect(serializePayload({ a: [1, 'x', true, null, { b: 2.5 }] })).toBe('{"a":[1,"x",true,null,{"b":2.5}]}');
  });

  it.each([
    ['undefined', { a: undefined }, "'payload.a' is undefined"],
    ['BigInt', { a: 1n }, "'payload.a' is a BigInt"],
    ['function', { a: () => 1 }, "'payload.a' is a function"],
    ['Date', { at: new Date(0) }, "'payload.at' is a Date"],
    ['Map', { m: new Map() }, "'payload.m' is a Map"],
    ['Set', [new Set()], "'payload[0]' is a Set"],
    ['NaN', { n: Number.NaN }, "'payload.n' is NaN"],
    ['Infinity', { n: Number.POSITIVE_INFINITY }, "'payload.n' is Infinity"],
    ['-0', { n: -0 }, "'payload.n' is -0"],
    ['class instance', { c: new (class Money {})() }, "'payload.c' is a Money"],
    ['sparse array', { list: [1, , 3] }, "'payload.list[1]' is a hole"],
  ])('refuses %s naming the field', (_name, value, message) => {
    expect(() => serializePayload(value)).toThrowError(SerializationError);
    expect(() => serializePayload(value)).toThrowError(message);
  });

  // The walk writes a path out only when it reports a problem: these check it is the
  // path of the field at fault, after siblings that were fine were walked and left.
  it.each([
    ['after valid siblings', { a: { b: 1 }, c: [1, 2], d: { e: Number.NaN } }, 'payload.d.e', 'is NaN'],
    ['through arrays and odd keys', { orders: [{ 'line items': [{ qty: 1 }, { qty: undefined }] }] }, 'payload.orders[0]["line items"][1].qty', 'is undefined'],
    ['an accessor', { a: { get b() { return 1; } } }, 'payload.a.b', 'is an accessor property'],
    ['a hole after a nested value', [[1], , 3], 'payload[1]', 'is a hole'],
  ])('names the path %s', (_name, value, path, reason) => {
    const error = (() => {
      try {
        serializePayload(value);
      } catch (caught) {
        return caught;
      }
      return undefined;
    })();
    expect(error).toBeInstanceOf(SerializationError);
    expect((error as SerializationError).message.startsWith(`'${path}' ${reason}`)).toBe(true);
    expect((error as SerializationError).path).toBe(path);
  });

  it('names the depth it gave up at, with the given root', () => {
    expect(() => serializePayload({ a: { b: { c: 1 } } }, 'body', 2)).toThrowError("'body.a.b.c' is nested deeper than 2 levels");
  });

  it('refuses cycles', () => {
    const a: Record<string, unknown> = { x: 1 };
    a['self'] = a;
    expect(() => serializePayload(a)).toThrowError("'payload.self' is a circular reference");
  });
});
