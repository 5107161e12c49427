import { decodeEnvelope, type Envelope } from '@courier/core';
import type { IHeaders } from 'kafkajs';

/**
 * Header names of the envelope fields. Each field has a header of its own (readable with
 * any Kafka tool); the key is the record key and the payload the record value. User
 * headers keep their names: the `courier-` prefix is reserved for these, so they never clash.
 */
export const HEADERS = {
  messageId: 'courier-message-id',
  type: 'courier-type',
  version: 'courier-version',
  topic: 'courier-topic',
  occurredAt: 'courier-occurred-at',
  correlationId: 'courier-correlation-id',
  causationId: 'courier-causation-id',
  traceparent: 'courier-traceparent',
  tracestate: 'courier-tracestate',
  /** Delivery attempt of a retry copy (absent: 1). Broker redeliveries never change it. */
  attempt: 'courier-attempt',
  /** Epoch milliseconds before which a retry copy is not handed to the handler. */
  retryAt: 'courier-retry-at',
  /** Present on a copy an operator replayed from the dead letters. */
  replayed: 'courier-replayed',
  /** Dead-letter records: why, when, and where the record was consumed. */
  deadCode: 'courier-dead-code',
  deadMessage: 'courier-dead-message',
  /** Present when `deadMessage` was cut to fit the broker: the whole reason's length in UTF-8 bytes. */
  deadMessageBytes: 'courier-dead-message-bytes',
  deadAt: 'courier-dead-at',
  origin: 'courier-origin',
} as const;

/** A record as the producer takes it. */
export interface OutgoingRecord {
  readonly key: string | null;
  readonly value: string | null;
  readonly headers: Record<string, string>;
}

/** Maps an envelope to a record: key → record key, payload → value, every other field → a header. */
export function encodeRecord(envelope: Envelope, extra: Record<string, string> = {}): OutgoingRecord {
  const headers: Record<string, string> = { ...envelope.headers };
  headers[HEADERS.messageId] = envelope.messageId;
  headers[HEADERS.type] = envelope.type;
  headers[HEADERS.version] = String(envelope.version);
  headers[HEADERS.topic] = envelope.topic;
  headers[HEADERS.occurredAt] = envelope.occurredAt;
  headers[HEADERS.correlationId] = envelope.correlationId;
  if (envelope.causationId !== null) headers[HEADERS.causationId] = envelope.causationId;
  if (envelope.traceparent !== null) headers[HEADERS.traceparent] = envelope.traceparent;
  if (envelope.tracestate !== null) headers[HEADERS.tracestate] = envelope.tracestate;
  return { key: envelope.key, value: envelope.payload, headers: { ...headers, ...extra } };
}

/** Record headers as strings (Kafka carries bytes; Courier writes UTF-8 text only). */
export function headerText(headers: IHeaders | undefined): Record<string, string> {
  const out: Record<string, string> = Object.create(null) as Record<string, string>;
  for (const [name, raw] of Object.entries(headers ?? {})) {
    const value = Array.isArray(raw) ? raw[raw.length - 1] : raw;
    if (value !== undefined) out[name] = Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
  }
  return out;
}

/**
 * Rebuilds the envelope of a consumed record, checked by `decodeEnvelope` (throws a
 * `SerializationError` `ENVELOPE_INVALID` for a record that is not a Courier message).
 */
export function decodeRecord(key: Buffer | null, value: Buffer | null, headers: Record<string, string>): Envelope {
  const user: Record<string, string> = {};
  for (const [name, text] of Object.entries(headers)) {
    // defineProperty: a header named `__proto__` is data, never the object's prototype.
    if (!name.toLowerCase().startsWith('courier-')) Object.defineProperty(user, name, { value: text, enumerable: true, writable: true, configurable: true });
  }
  const version = headers[HEADERS.version];
  return decodeEnvelope({
    messageId: headers[HEADERS.messageId],
    type: headers[HEADERS.type],
    version: version === undefined || !/^\d+$/.test(version) ? version : Number(version),
    topic: headers[HEADERS.topic],
    occurredAt: headers[HEADERS.occurredAt],
    key: key === null ? null : key.toString('utf8'),
    correlationId: headers[HEADERS.correlationId],
    causationId: headers[HEADERS.causationId] ?? null,
    traceparent: headers[HEADERS.traceparent] ?? null,
    tracestate: headers[HEADERS.tracestate] ?? null,
    headers: user,
    payload: value === null ? undefined : value.toString('utf8'),
  });
}
