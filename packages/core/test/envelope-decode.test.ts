import { describe, expect, it } from 'vitest';
import { SerializationError, decodeEnvelope } from '@courier/core';

const base = {
  messageId: 'm1',
  type: 'notes.NoteTaken',
  version: 1,
  topic: 'notes',
  occurredAt: '2026-12-06T04:00:00.123Z',
  correlationId: 'm1',
  payload: '{}',
};

const problemsOf = (input: unknown): string => {
  try {
    decodeEnvelope(input);
  } catch (error) {
    expect(error).toBeInstanceOf(SerializationError);
    return (error as Error).message;
  }
  throw new Error('decodeEnvelope accepted the input');
};

describe('decodeEnvelope (the relay decodes every claimed row with it)', () => {
  it('tells a malformed occurredAt from a well-formed one that is not a real date, once each', () => {
    const malformed = problemsOf({ ...base, occurredAt: 'yesterday' });
    expect(malformed).toContain(`'occurredAt' is malformed`);
    expect(malformed).not.toContain('not a real date');
    const unreal = problemsOf({ ...base, occurredAt: '2026-13-45T99:99:99.999Z' });
    expect(unreal).toContain(`'occurredAt' is not a real date`);
    expect(unreal).not.toContain('malformed');
    expect(problemsOf({ ...base, occurredAt: 7 })).toContain(`'occurredAt' must be a non-empty string`);
  });

  it('lists every unstorable text field, in field order', () => {
    const message = problemsOf({ ...base, messageId: 'a\u0000', key: 'b\u0000', correlationId: 'c\uD800', causationId: 'd\u0000', tracestate: 'e\uDC00' });
    const fields = ["'messageId'", "'key'", "'correlationId'", "'causationId'", "'tracestate'"];
    const at = fields.map((field) => message.indexOf(`${field} holds`));
    expect(at.every((index) => index >= 0)).toBe(true);
    expect([...at].sort((a, b) => a - b)).toEqual(at);
  });

  it('gives an envelope without headers frozen empty headers, and copies headers it has', () => {
    const bare = decodeEnvelope(base);
    expect(bare.headers).toEqual({});
    expect(Object.isFrozen(bare.headers)).toBe(true);
    expect(Object.isFrozen(bare)).toBe(true);
    const source = { tenant: 'a' };
    const withHeaders = decodeEnvelope({ ...base, headers: source });
    expect(withHeaders.headers).toEqual({ tenant: 'a' });
    expect(withHeaders.headers).not.toBe(source);
    expect(Object.isFrozen(withHeaders.headers)).toBe(true);
  });
});
