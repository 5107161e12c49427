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

  it('refuses cycles', () => {
    const a: Record<string, unknown> = { x: 1 };
    a['self'] = a;
    expect(() => serializePayload(a)).toThrowError("'payload.self' is a circular reference");
  });
});
