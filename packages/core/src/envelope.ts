import { SerializationError } from './errors.js';

/**
 * The one envelope every message travels in, the same on every transport and store.
 *
 * Guarantees: `messageId` is set once by the producer and never changes on retry or
 * replay; `payload` is the JSON text exactly as it was stored and published (stores and
 * transports keep it byte for byte); `headers` never contain the reserved `courier-`
 * prefix (transports use that prefix for their own metadata).
 */
export interface Envelope {
  /** Unique id (UUIDv7 by default: time-ordered). */
  readonly messageId: string;
  /** Stable contract name, e.g. `orders.OrderPlaced`. */
  readonly type: string;
  /** Integer contract version, 1 or more. */
  readonly version: number;
  /** Where the message is published. */
  readonly topic: string;
  /** ISO-8601 UTC time with milliseconds at which the business fact happened. */
  readonly occurredAt: string;
  /** Ordering / partition key; order is promised per (topic, key). `null` when unordered. */
  readonly key: string | null;
  /** The conversation this message belongs to. */
  readonly correlationId: string;
  /** The messageId of the message whose handling produced this one, if any. */
  readonly causationId: string | null;
  /** W3C `traceparent` of the producer's span, if a trace was active. */
  readonly traceparent: string | null;
  /** W3C `tracestate`, if any. */
  readonly tracestate: string | null;
  /** Free string map for user extensions; the `courier-` prefix is reserved. */
  readonly headers: Readonly<Record<string, string>>;
  /** The serialised JSON payload. */
  readonly payload: string;
}

/** The envelope fields in a fixed order, for mappings and round-trip checks. */
export const ENVELOPE_FIELDS = [
  'messageId',
  'type',
  'version',
  'topic',
  'occurredAt',
  'key',
  'correlationId',
  'causationId',
  'traceparent',
  'tracestate',
  'headers',
  'payload',
] as const satisfies readonly (keyof Envelope)[];

/** Header prefix reserved for Courier's own metadata on every transport. */
export const RESERVED_HEADER_PREFIX = 'courier-';

/** Upper bounds applied by {@link decodeEnvelope}, so hostile input cannot exhaust memory. */
export const ENVELOPE_LIMITS = {
  idLength: 200,
  typeLength: 200,
  topicLength: 249,
  keyLength: 1024,
  headerCount: 64,
  headerNameLength: 200,
  headerValueLength: 4096,
} as const;

const TYPE_PATTERN = /^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/;
const TOPIC_PATTERN = /^[A-Za-z0-9._-]+$/;
const ISO_MILLIS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** True when `type` is a valid message type name: dot-separated segments of `[A-Za-z0-9_-]`. */
export function isValidType(type: string): boolean {
  return type.length > 0 && type.length <= ENVELOPE_LIMITS.typeLength && TYPE_PATTERN.test(type);
}

/** True when `topic` is a valid topic name: `[A-Za-z0-9._-]`, at most 249 characters (Kafka's limit). */
export function isValidTopic(topic: string): boolean {
  return topic.length > 0 && topic.length <= ENVELOPE_LIMITS.topicLength && TOPIC_PATTERN.test(topic);
}

/**
 * Lists every problem with user headers: non-string values, empty or reserved names
 * (`courier-` prefix, any case), too many or too long. Returns an empty list when fine.
 */
export function headerProblems(headers: unknown, root = 'headers'): string[] {
  if (headers === undefined) return [];
  if (headers === null || typeof headers !== 'object' || Array.isArray(headers)) {
    return [`'${root}' must be an object of string values`];
  }
  const problems: string[] = [];
  const entries = Object.entries(headers as Record<string, unknown>);
  if (entries.length > ENVELOPE_LIMITS.headerCount) {
    problems.push(`'${root}' has ${entries.length} entries; at most ${ENVELOPE_LIMITS.headerCount} are allowed`);
  }
  for (const [name, value] of entries) {
    if (name.length === 0) problems.push(`'${root}' has an empty header name`);
    else if (name.length > ENVELOPE_LIMITS.headerNameLength) problems.push(`header name '${name.slice(0, 40)}…' is too long`);
    if (name.toLowerCase().startsWith(RESERVED_HEADER_PREFIX)) {
      problems.push(`header '${name}' uses the reserved '${RESERVED_HEADER_PREFIX}' prefix`);
    }
    if (typeof value !== 'string') problems.push(`header '${name}' must be a string, got ${describeType(value)}`);
    else if (value.length > ENVELOPE_LIMITS.headerValueLength) {
      problems.push(`header '${name}' is ${value.length} characters; at most ${ENVELOPE_LIMITS.headerValueLength} are allowed`);
    }
  }
  return problems;
}

/**
 * Validates an untrusted value (a decoded wire record, a database row) and returns a
 * fresh, frozen {@link Envelope}.
 *
 * Guarantees: never throws anything but `SerializationError` (code `ENVELOPE_INVALID`,
 * listing every problem); never mutates its input or any prototype; copies only the
 * known fields into null-prototype-free plain objects, so `__proto__` keys in headers
 * are kept as data and cannot pollute.
 */
export function decodeEnvelope(input: unknown): Envelope {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    throw new SerializationError('ENVELOPE_INVALID', `envelope must be an object, got ${describeType(input)}`);
  }
  const record = input as Record<string, unknown>;
  const read = (field: string): unknown => (Object.prototype.hasOwnProperty.call(record, field) ? record[field] : undefined);
  const problems: string[] = [];
  const requiredString = (field: string, max: number, pattern?: RegExp): string => {
    const value = read(field);
    if (typeof value !== 'string' || value.length === 0) {
      problems.push(`'${field}' must be a non-empty string, got ${describeType(value)}`);
      return '';
    }
    if (value.length > max) problems.push(`'${field}' is longer than ${max} characters`);
    else if (pattern && !pattern.test(value)) problems.push(`'${field}' is malformed: ${JSON.stringify(value.slice(0, 80))}`);
    return value;
  };
  const optionalString = (field: string, max: number, pattern?: RegExp): string | null => {
    const value = read(field);
    if (value === undefined || value === null) return null;
    if (typeof value !== 'string') {
      problems.push(`'${field}' must be a string or null, got ${describeType(value)}`);
      return null;
    }
    if (value.length > max) problems.push(`'${field}' is longer than ${max} characters`);
    else if (pattern && !pattern.test(value)) problems.push(`'${field}' is malformed: ${JSON.stringify(value.slice(0, 80))}`);
    return value;
  };

  const messageId = requiredString('messageId', ENVELOPE_LIMITS.idLength);
  const type = requiredString('type', ENVELOPE_LIMITS.typeLength, TYPE_PATTERN);
  const rawVersion = read('version');
  const version = typeof rawVersion === 'number' ? rawVersion : Number.NaN;
  if (!Number.isSafeInteger(version) || version < 1) {
    problems.push(`'version' must be an integer of 1 or more, got ${describeType(rawVersion)}`);
  }
  const topic = requiredString('topic', ENVELOPE_LIMITS.topicLength, TOPIC_PATTERN);
  const occurredAt = requiredString('occurredAt', 30, ISO_MILLIS);
  if (occurredAt && ISO_MILLIS.test(occurredAt) && Number.isNaN(Date.parse(occurredAt))) {
    problems.push(`'occurredAt' is not a real date: ${JSON.stringify(occurredAt)}`);
  }
  const key = optionalString('key', ENVELOPE_LIMITS.keyLength);
  const correlationId = requiredString('correlationId', ENVELOPE_LIMITS.idLength);
  const causationId = optionalString('causationId', ENVELOPE_LIMITS.idLength);
  const traceparent = optionalString('traceparent', 55, TRACEPARENT);
  const tracestate = optionalString('tracestate', 512);
  const rawHeaders = read('headers') ?? {};
  const headerIssues = headerProblems(rawHeaders);
  problems.push(...headerIssues);
  const payload = read('payload');
  if (typeof payload !== 'string') problems.push(`'payload' must be JSON text, got ${describeType(payload)}`);

  if (problems.length > 0) {
    throw new SerializationError('ENVELOPE_INVALID', `invalid envelope: ${problems.join('; ')}`);
  }
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(rawHeaders as Record<string, string>)) {
    Object.defineProperty(headers, name, { value, enumerable: true, writable: false, configurable: false });
  }
  return Object.freeze({
    messageId,
    type,
    version,
    topic,
    occurredAt,
    key,
    correlationId,
    causationId,
    traceparent,
    tracestate,
    headers: Object.freeze(headers),
    payload: payload as string,
  });
}

/** Size in bytes of an envelope's payload as UTF-8, the figure compared with size limits. */
export function payloadBytes(envelope: Pick<Envelope, 'payload'>): number {
  return Buffer.byteLength(envelope.payload, 'utf8');
}

function describeType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  if (typeof value === 'string') return `string ${JSON.stringify(value.slice(0, 40))}`;
  if (typeof value === 'number') return `number ${value}`;
  return typeof value;
}
