import { describe, expect, it } from 'vitest';
import { classifyDriverError, classifyError, toBigInt, toNullableString, toNumber, type SqlExecutor } from '../src/index.js';

// A driver error as node-postgres raises a unique violation.
const duplicate = Object.assign(new Error('duplicate key value violates unique constraint'), { code: '23505' });

describe('classifyError', () => {
  it('uses the executor’s own classification when it has one', () => {
    const executor: Pick<SqlExecutor<never>, 'classifyError'> = { classifyError: () => 'transient' };
    expect(classifyError(executor, duplicate)).toBe('transient');
  });

  it('falls back to classifyDriverError without one', () => {
    expect(classifyDriverError(duplicate)).toBe('duplicate');
    expect(classifyError({}, duplicate)).toBe('duplicate');
  });
});

describe('row readers', () => {
  it('read integers as drivers return them', () => {
    expect(toBigInt(12)).toBe(12n);
    expect(toBigInt('9007199254740993')).toBe(9007199254740993n);
    expect(toBigInt(5n)).toBe(5n);
    expect(() => toBigInt(null)).toThrow(TypeError);
    expect(() => toBigInt('')).toThrow(TypeError);
    expect(toNumber('3')).toBe(3);
    expect(toNumber(null)).toBe(0);
    expect(toNumber(4n)).toBe(4);
  });

  it('read nullable text, Buffers as UTF-8', () => {
    expect(toNullableString(null)).toBeNull();
    expect(toNullableString(undefined)).toBeNull();
    expect(toNullableString(Buffer.from('clé', 'utf8'))).toBe('clé');
    expect(toNullableString(7)).toBe('7');
  });
});
