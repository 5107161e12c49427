import { ENVELOPE_FIELDS, type Envelope } from '@courier/core';
import { uuidv7 } from 'uuidv7';

/**
 * Builds a valid {@link Envelope} for tests: a fresh UUIDv7 `messageId` (also the
 * `correlationId`), type `conformance.Tested` version 1, topic `conformance`,
 * `occurredAt` now, no key, no causation or trace, no headers, payload `{}`;
 * `overrides` replace any field.
 */
export function makeEnvelope(overrides: Partial<Envelope> = {}): Envelope {
  const messageId = overrides.messageId ?? uuidv7();
  return {
    messageId,
    type: 'conformance.Tested',
    version: 1,
    topic: 'conformance',
    occurredAt: new Date().toISOString(),
    key: null,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
    ...overrides,
  };
}

/** Header map with an own `__proto__` entry (as data), to prove stores and transports never treat it as a prototype. */
export function protoHeaders(value = 'not-a-prototype'): Readonly<Record<string, string>> {
  const headers: Record<string, string> = {};
  Object.defineProperty(headers, '__proto__', { value, enumerable: true, writable: true, configurable: true });
  headers['x-other'] = 'other';
  return headers;
}

/**
 * The envelope in a comparable form: every field, headers as sorted `[name, value]`
 * pairs (so an own `__proto__` header is compared as data).
 */
export function comparableEnvelope(envelope: Envelope): Record<string, unknown> {
  const fields: Record<string, unknown> = Object.fromEntries(ENVELOPE_FIELDS.map((field) => [field, envelope[field]]));
  fields['headers'] = Object.entries(envelope.headers).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return fields;
}
