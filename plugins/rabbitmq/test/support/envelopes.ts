import type { Envelope } from '@courier/core';
import { randomUUID } from 'node:crypto';

/** A valid envelope on `topic` with a fresh messageId; `overrides` replace any field. */
export function envelope(topic: string, overrides: Partial<Envelope> = {}): Envelope {
  const messageId = randomUUID();
  return {
    messageId,
    type: 'test.Consumed',
    version: 1,
    topic,
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
