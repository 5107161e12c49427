import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ENVELOPE_FIELDS, SerializationError, decodeEnvelope, type Envelope } from '@courier/core';

const prototypeNames = () => Object.getOwnPropertyNames(Object.prototype).sort();
const PROTOTYPE_BEFORE = prototypeNames();

/** Decodes `input` and checks the decoder's guarantees: a frozen envelope or an ENVELOPE_INVALID SerializationError, no pollution. */
function decodeChecked(input: unknown): Envelope | SerializationError {
  let outcome: Envelope | SerializationError;
  try {
    outcome = decodeEnvelope(input);
    expect(Object.isFrozen(outcome)).toBe(true);
    expect(Object.isFrozen(outcome.headers)).toBe(true);
    expect(Object.keys(outcome).sort()).toEqual([...ENVELOPE_FIELDS].sort());
  } catch (error) {
    if (!(error instanceof SerializationError) || error.code !== 'ENVELOPE_INVALID') throw error;
    expect(error.message).toMatch(/^(invalid envelope: |envelope must be an object)/);
    outcome = error;
  }
  expect(({} as Record<string, unknown>)['polluted']).toBeUndefined();
  expect(prototypeNames()).toEqual(PROTOTYPE_BEFORE);
  return outcome;
}

const typeArb = fc.stringMatching(/^[A-Za-z0-9_-]{1,12}(\.[A-Za-z0-9_-]{1,12}){0,3}$/);
const topicArb = fc.stringMatching(/^[A-Za-z0-9._-]{1,40}$/);
const idArb = fc.oneof(fc.uuid(), fc.string({ minLength: 1, maxLength: 200 }));
const headerNameArb = fc
  .string({ minLength: 1, maxLength: 30 })
  .filter((name) => !name.toLowerCase().startsWith('courier-'));
const traceparentArb = fc
  .tuple(fc.stringMatching(/^[0-9a-f]{32}$/), fc.stringMatching(/^[0-9a-f]{16}$/), fc.constantFrom('00', '01'))
  .map(([traceId, spanId, flags]) => `00-${traceId}-${spanId}-${flags}`);

const validEnvelopeArb: fc.Arbitrary<Envelope> = fc.record({
  messageId: idArb,
  type: typeArb,
  version: fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }),
  topic: topicArb,
  occurredAt: fc
    .date({ min: new Date('0001-01-01T00:00:00.000Z'), max: new Date('9999-12-31T23:59:59.999Z'), noInvalidDate: true })
    .map((date) => date.toISOString()),
  key: fc.option(fc.string({ minLength: 1, maxLength: 1024 }), { nil: null }),
  correlationId: idArb,
  causationId: fc.option(idArb, { nil: null }),
  traceparent: fc.option(traceparentArb, { nil: null }),
  tracestate: fc.option(fc.string({ maxLength: 512 }), { nil: null }),
  headers: fc.dictionary(headerNameArb, fc.string({ maxLength: 200 }), { maxKeys: 8 }),
  payload: fc.json(),
});

/** A value of the wrong kind for any envelope field. */
const hostileValueArb = fc.oneof(
  fc.anything({ withBigInt: true, withDate: true, withMap: true, withSet: true, withTypedArray: true, withNullPrototype: true, withSparseArray: true }),
  fc.constantFrom(null, undefined, '', 0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, true, [], {}, 'courier-x', '__proto__'),
  fc.string({ maxLength: 50 }),
);

describe('decodeEnvelope on hostile input', () => {
  it('only ever returns a frozen envelope or throws ENVELOPE_INVALID, for any value at all', () => {
    fc.assert(
      fc.property(fc.anything({ withBigInt: true, withDate: true, withMap: true, withSet: true, withNullPrototype: true, withObjectString: true }), (input) => {
        decodeChecked(input);
      }),
      { numRuns: 500 },
    );
  });

  it('rejects a wrong value in any field, naming that field', () => {
    const fieldArb = fc.constantFrom(...ENVELOPE_FIELDS);
    fc.assert(
      fc.property(validEnvelopeArb, fieldArb, hostileValueArb, (envelope, field, value) => {
        const input: Record<string, unknown> = { ...envelope, [field]: value };
        const outcome = decodeChecked(input);
        if (outcome instanceof SerializationError) expect(outcome.message).toContain(`'${field === 'headers' ? '' : field}`);
      }),
      { numRuns: 500 },
    );
  });

  it('rejects a value of the wrong type for every field, listing them all', () => {
    const wrong = {
      messageId: 1,
      type: ['orders.X'],
      version: '1',
      topic: {},
      occurredAt: new Date(),
      key: 5,
      correlationId: null,
      causationId: false,
      traceparent: 12,
      tracestate: {},
      headers: 'a=b',
      payload: { a: 1 },
    };
    const outcome = decodeChecked(wrong);
    expect(outcome).toBeInstanceOf(SerializationError);
    for (const field of ENVELOPE_FIELDS) expect((outcome as Error).message).toContain(`'${field}'`);
  });

  it('treats __proto__ and constructor keys as data and never pollutes a prototype', () => {
    fc.assert(
      fc.property(validEnvelopeArb, fc.constantFrom('__proto__', 'constructor', 'prototype', 'hasOwnProperty', 'toString'), fc.string({ maxLength: 20 }), (envelope, name, value) => {
        const wire = JSON.stringify(envelope);
        // JSON.parse makes `__proto__` an own property, exactly as hostile wire input would.
        const top = JSON.parse(`{"${name}":{"polluted":true},${wire.slice(1)}`);
        const topOutcome = decodeChecked(top);
        expect(topOutcome).not.toBeInstanceOf(SerializationError);
        expect(Object.getPrototypeOf(topOutcome)).toBe(Object.prototype);
        expect(Object.keys(topOutcome)).not.toContain(name);

        const inHeaders = JSON.parse(wire);
        inHeaders.headers = JSON.parse(`{${JSON.stringify(name)}:${JSON.stringify(value)}}`);
        const decoded = decodeChecked(inHeaders) as Envelope;
        expect(Object.getOwnPropertyDescriptor(decoded.headers, name)?.value).toBe(value);
        expect(Object.getPrototypeOf(decoded.headers)).toBe(Object.prototype);

        const objectValue = JSON.parse(wire);
        objectValue.headers = JSON.parse(`{${JSON.stringify(name)}:{"polluted":true}}`);
        expect(decodeChecked(objectValue)).toBeInstanceOf(SerializationError);
      }),
      { numRuns: 200 },
    );
  });

  it('rejects huge strings in every string field without echoing them', () => {
    const huge = 'x'.repeat(2_000_000);
    const base: Envelope = {
      messageId: 'm',
      type: 'a.B',
      version: 1,
      topic: 'a',
      occurredAt: '2024-01-01T00:00:00.000Z',
      key: null,
      correlationId: 'c',
      causationId: null,
      traceparent: null,
      tracestate: null,
      headers: {},
      payload: '{}',
    };
    for (const field of ['messageId', 'type', 'topic', 'occurredAt', 'key', 'correlationId', 'causationId', 'traceparent', 'tracestate'] as const) {
      const outcome = decodeChecked({ ...base, [field]: huge });
      expect(outcome, field).toBeInstanceOf(SerializationError);
      expect((outcome as Error).message).toContain(`'${field}' is longer than`);
      expect((outcome as Error).message.length).toBeLessThan(500);
    }
    expect(decodeChecked({ ...base, headers: { big: huge } })).toBeInstanceOf(SerializationError);
    const many = Object.fromEntries(Array.from({ length: 10_000 }, (_, index) => [`h${index}`, 'v']));
    expect((decodeChecked({ ...base, headers: many }) as Error).message).toContain('at most 64 are allowed');
  });

  it('survives JSON.parse of random text', () => {
    fc.assert(
      fc.property(fc.oneof(fc.json(), fc.string(), fc.jsonValue().map((value) => JSON.stringify({ headers: value, payload: value, version: value }))), (text) => {
        let parsed: unknown;
        try {
          parsed = JSON.parse(text);
        } catch {
          return;
        }
        decodeChecked(parsed);
      }),
      { numRuns: 500 },
    );
  });

  it('never mutates its input', () => {
    fc.assert(
      fc.property(validEnvelopeArb, (envelope) => {
        const input = structuredClone(envelope);
        decodeChecked(input);
        expect(input).toEqual(envelope);
      }),
      { numRuns: 100 },
    );
  });
});

describe('decodeEnvelope on valid input', () => {
  it('round-trips: decode(envelope) and decode(JSON wire form) deep-equal the envelope', () => {
    fc.assert(
      fc.property(validEnvelopeArb, (envelope) => {
        expect(decodeChecked(envelope)).toEqual(envelope);
        const wire = JSON.stringify(Object.fromEntries(ENVELOPE_FIELDS.map((field) => [field, envelope[field]])));
        expect(decodeChecked(JSON.parse(wire))).toEqual(envelope);
      }),
      { numRuns: 300 },
    );
  });
});
