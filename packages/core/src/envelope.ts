import { SerializationError } from './errors.js';
import { hasUnstorableText, unstorableCharacter } from './reason-text.js';

/**
 * The one envelope every message travels in, the same on every transport and store.
 *
 * Guarantees: `messageId` is set once by the producer and never changes on retry or
 * replay; `payload` is the JSON text exactly as it was stored and published (stores and
 * transports keep it byte for byte); `headers` never contain the reserved `courier-`
 * prefix (transports use that prefix for their own metadata), except a valid
 * {@link PRIORITY_HEADER} that core's publish sets from `priority`.
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

/**
 * The one Courier header an envelope may carry: the message's priority, `'0'` (lowest) to
 * `'9'`, set from `priority` (the definition's or the publish call's), never by user
 * headers. A header rather than an envelope field, so every store keeps it with the other
 * headers without a schema change. Transports that declare `capabilities.priorities`
 * honour it (RabbitMQ maps it to AMQP `priority`); others carry or ignore it. Handlers do
 * not see it in `message.headers`.
 */
export const PRIORITY_HEADER = 'courier-priority';

/** Highest message priority (0 is the lowest): AMQP allows 255, RabbitMQ advises at most 10 levels. */
export const MAX_PRIORITY = 9;

const PRIORITY_VALUE = /^[0-9]$/;
const ALLOW_PRIORITY = Object.freeze({ allowPriority: true });

/** The priority `envelope` carries ({@link PRIORITY_HEADER}), or null when it has none. */
export function envelopePriority(envelope: Pick<Envelope, 'headers'>): number | null {
  const value = envelope.headers[PRIORITY_HEADER];
  return value !== undefined && PRIORITY_VALUE.test(value) ? Number(value) : null;
}

/**
 * Upper bounds applied by {@link decodeEnvelope} and at publish, so hostile input cannot
 * exhaust memory.
 *
 * `…Length` entries count UTF-16 code units, never fewer than the characters a SQL
 * `varchar(n)` counts; `…Bytes` entries count UTF-8 bytes, the unit wire formats count
 * (an AMQP header name is at most 255 bytes). Types and topics are ASCII by their
 * patterns, so for them characters and bytes agree. Stores and transports may declare
 * tighter limits of their own ({@link PortLimits}).
 */
export const ENVELOPE_LIMITS = {
  idLength: 200,
  typeLength: 200,
  topicLength: 249,
  keyLength: 1024,
  headerCount: 64,
  headerNameBytes: 200,
  headerValueBytes: 4096,
} as const;

/** A length limit on one string field. A value must fit every bound given; an absent bound does not apply. */
export interface LengthLimit {
  /** Most Unicode characters (code points): what SQL `varchar(n)` counts. */
  readonly chars?: number;
  /** Most UTF-8 bytes: what wire formats count (AMQP short strings hold 255). */
  readonly bytes?: number;
}

/**
 * The longest values a store or transport can hold, declared by the port itself
 * (`limits` on `OutboxStore`, `InboxStore` and `Transport`) so that the bus refuses what
 * does not fit where it is given — a consumer name at `subscribe`, an envelope field at
 * `publish` — instead of failing later in the database or at the broker.
 *
 * Guarantees a declaring port makes: every value within its declared limits (and within
 * {@link ENVELOPE_LIMITS}) is stored or sent and round-trips. A field left out has no
 * limit beyond the core's. The conformance suite appends and records at exactly the
 * declared limits.
 */
export interface PortLimits {
  /**
   * Consumer (group) names as the port receives them. An `InboxStore` also receives the
   * names with Courier's suffixes (`~alone`, `~dead`): the bus subtracts them itself, so
   * the store declares its plain column size. A `Transport` receives the bare name in
   * `Endpoint.consumer` and accounts for whatever names it derives from it.
   */
  readonly consumer?: LengthLimit;
  /** `messageId`, `correlationId` and `causationId`. */
  readonly id?: LengthLimit;
  readonly type?: LengthLimit;
  readonly topic?: LengthLimit;
  readonly key?: LengthLimit;
  /** Each user header name. */
  readonly headerName?: LengthLimit;
  /** Each user header value. */
  readonly headerValue?: LengthLimit;
}

/** The fields of {@link PortLimits}, in the order problems are listed. */
export const PORT_LIMIT_FIELDS = ['consumer', 'id', 'type', 'topic', 'key', 'headerName', 'headerValue'] as const satisfies readonly (keyof PortLimits)[];

/**
 * Lists every problem with a port's `limits` declaration (not an object, an unknown
 * field, a bound that is not a positive integer). Empty when it is fine or absent.
 */
export function portLimitsProblems(limits: unknown, root: string): string[] {
  if (limits === undefined) return [];
  if (limits === null || typeof limits !== 'object' || Array.isArray(limits)) return [`'${root}' must be an object`];
  const problems: string[] = [];
  for (const [field, limit] of Object.entries(limits as Record<string, unknown>)) {
    if (!(PORT_LIMIT_FIELDS as readonly string[]).includes(field)) {
      problems.push(`'${root}.${field}' is not a known limit (${PORT_LIMIT_FIELDS.join(', ')})`);
      continue;
    }
    if (limit === undefined) continue;
    if (limit === null || typeof limit !== 'object' || Array.isArray(limit)) {
      problems.push(`'${root}.${field}' must be an object with 'chars' and/or 'bytes'`);
      continue;
    }
    for (const [unit, bound] of Object.entries(limit as Record<string, unknown>)) {
      if (unit !== 'chars' && unit !== 'bytes') problems.push(`'${root}.${field}.${unit}' is not a known unit (chars, bytes)`);
      else if (bound !== undefined && (typeof bound !== 'number' || !Number.isSafeInteger(bound) || bound < 1)) {
        problems.push(`'${root}.${field}.${unit}' must be an integer of 1 or more, got ${describeType(bound)}`);
      }
    }
  }
  return problems;
}

/** Number of Unicode code points in `value`: the length SQL `varchar(n)` compares with `n`. */
export function charCount(value: string): number {
  let count = 0;
  for (const _ of value) count += 1;
  return count;
}

/**
 * Says how `value` exceeds `limit`, or returns undefined when it fits. `what` names the
 * value (quoted by the caller), `holder` the port whose limit it is.
 */
export function lengthProblem(what: string, value: string, limit: LengthLimit | undefined, holder: string): string | undefined {
  if (limit === undefined) return undefined;
  if (limit.chars !== undefined) {
    const chars = charCount(value);
    if (chars > limit.chars) return `${what} is ${chars} characters; ${holder} holds at most ${limit.chars}`;
  }
  if (limit.bytes !== undefined) {
    const bytes = Buffer.byteLength(value, 'utf8');
    if (bytes > limit.bytes) return `${what} is ${bytes} UTF-8 bytes; ${holder} holds at most ${limit.bytes}`;
  }
  return undefined;
}

/** A port's declared limits together with the name error messages give it. */
export interface NamedLimits {
  readonly holder: string;
  readonly limits: PortLimits | undefined;
}

/**
 * Lists every field of `envelope` that exceeds a declared limit of one of `ports`: ids,
 * type, topic, key, header names and values. At most one problem per value (the first
 * port it does not fit). Empty when everything fits.
 */
export function envelopeLimitProblems(envelope: Envelope, ports: readonly NamedLimits[]): string[] {
  const problems: string[] = [];
  if (ports.length === 0) return problems;
  // A value's name is built only for a problem: every publish checks every field, and
  // naming each one up front was most of this function's cost when all fit.
  let port = firstExceeded(ports, 'id', envelope.messageId);
  if (port) problems.push(limitProblem(`'messageId' ${quoteStart(envelope.messageId)}`, envelope.messageId, port, 'id'));
  // The correlationId defaults to the messageId: the same value is reported once.
  if (envelope.correlationId !== envelope.messageId && (port = firstExceeded(ports, 'id', envelope.correlationId))) {
    problems.push(limitProblem(`'correlationId' ${quoteStart(envelope.correlationId)}`, envelope.correlationId, port, 'id'));
  }
  const causationId = envelope.causationId;
  if (causationId !== null && causationId !== envelope.messageId && (port = firstExceeded(ports, 'id', causationId))) {
    problems.push(limitProblem(`'causationId' ${quoteStart(causationId)}`, causationId, port, 'id'));
  }
  if ((port = firstExceeded(ports, 'type', envelope.type))) problems.push(limitProblem(`type '${envelope.type}'`, envelope.type, port, 'type'));
  if ((port = firstExceeded(ports, 'topic', envelope.topic))) problems.push(limitProblem(`topic '${envelope.topic}'`, envelope.topic, port, 'topic'));
  const key = envelope.key;
  if (key !== null && (port = firstExceeded(ports, 'key', key))) problems.push(limitProblem(`'key' ${quoteStart(key)}`, key, port, 'key'));
  if (envelope.headers !== NO_HEADERS) {
    for (const [name, value] of Object.entries(envelope.headers)) {
      if ((port = firstExceeded(ports, 'headerName', name))) problems.push(limitProblem(`header name ${quoteStart(name)}`, name, port, 'headerName'));
      if ((port = firstExceeded(ports, 'headerValue', value))) problems.push(limitProblem(`header ${quoteStart(name)}`, value, port, 'headerValue'));
    }
  }
  return problems;
}

type EnvelopeLimitField = Exclude<keyof PortLimits, 'consumer'>;

/** The first of `ports` whose limit on `field` `value` exceeds, if any. */
function firstExceeded(ports: readonly NamedLimits[], field: EnvelopeLimitField, value: string): NamedLimits | undefined {
  for (let index = 0; index < ports.length; index += 1) {
    const limit = ports[index]!.limits?.[field];
    if (limit !== undefined && exceeds(value, limit)) return ports[index];
  }
  return undefined;
}

function limitProblem(label: string, value: string, port: NamedLimits, field: EnvelopeLimitField): string {
  return lengthProblem(label, value, port.limits?.[field], port.holder)!;
}

/**
 * True when `value` exceeds `limit` (what {@link lengthProblem} reports). A string of n
 * UTF-16 units has at most n code points and at most 3n UTF-8 bytes, so short values are
 * settled without counting.
 */
function exceeds(value: string, limit: LengthLimit): boolean {
  if (limit.chars !== undefined && value.length > limit.chars && charCount(value) > limit.chars) return true;
  if (limit.bytes !== undefined && value.length * 3 > limit.bytes && Buffer.byteLength(value, 'utf8') > limit.bytes) return true;
  return false;
}

/** `'text'`, cut to its first 40 characters (with `…`) so a huge value does not flood a message. */
function quoteStart(value: string): string {
  const start = [...value.slice(0, 41)].slice(0, 40).join('');
  return start.length < value.length ? `'${start}…'` : `'${value}'`;
}

/**
 * Says that `value` (named by `what`) holds a character no supported database can store —
 * U+0000 (PostgreSQL `text` refuses it) or a lone UTF-16 surrogate (no UTF-8 encoding
 * exists) — naming the first one and where it is. Call it for a value that has one
 * (`hasUnstorableText`). Envelope text fields are refused with it at publish (and by
 * {@link decodeEnvelope}), so such a value never fails a producer's transaction at commit.
 */
export function unstorableProblem(what: string, value: string): string {
  return `${what} holds ${unstorableCharacter(value) ?? 'a character'}, which databases cannot store`;
}

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
 * (`courier-` prefix, any case; with `allowPriority`, a valid {@link PRIORITY_HEADER} is
 * accepted, as in a stored envelope), too many, names and values longer than
 * {@link ENVELOPE_LIMITS} allows in UTF-8 bytes, or holding U+0000 or a lone surrogate
 * ({@link unstorableProblem}). Returns an empty list when fine.
 */
export function headerProblems(headers: unknown, root = 'headers', options: { readonly allowPriority?: boolean } = {}): string[] {
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
    const nameBytes = Buffer.byteLength(name, 'utf8');
    if (name.length === 0) problems.push(`'${root}' has an empty header name`);
    else if (nameBytes > ENVELOPE_LIMITS.headerNameBytes) {
      problems.push(`header name ${quoteStart(name)} is ${nameBytes} UTF-8 bytes; at most ${ENVELOPE_LIMITS.headerNameBytes} are allowed`);
    }
    if (name === PRIORITY_HEADER && options.allowPriority === true) {
      if (typeof value !== 'string' || !PRIORITY_VALUE.test(value)) problems.push(`header '${PRIORITY_HEADER}' must be a digit from 0 to ${MAX_PRIORITY}`);
      continue;
    }
    if (name.toLowerCase().startsWith(RESERVED_HEADER_PREFIX)) {
      problems.push(`header '${name}' uses the reserved '${RESERVED_HEADER_PREFIX}' prefix`);
    }
    if (hasUnstorableText(name)) problems.push(unstorableProblem(`header name ${quoteStart(name)}`, name));
    if (typeof value !== 'string') problems.push(`header ${quoteStart(name)} must be a string, got ${describeType(value)}`);
    else {
      const valueBytes = Buffer.byteLength(value, 'utf8');
      if (valueBytes > ENVELOPE_LIMITS.headerValueBytes) {
        problems.push(`header ${quoteStart(name)} is ${valueBytes} UTF-8 bytes; at most ${ENVELOPE_LIMITS.headerValueBytes} are allowed`);
      }
      if (hasUnstorableText(value)) problems.push(unstorableProblem(`header ${quoteStart(name)}`, value));
    }
  }
  return problems;
}

/**
 * Validates an untrusted value (a decoded wire record, a database row) and returns a
 * fresh, frozen {@link Envelope}.
 * Text fields holding U+0000 or a lone surrogate are refused ({@link unstorableProblem}):
 * no store could keep such an envelope.
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
  // Module-level readers, not closures: the relay decodes every claimed row, and closures
  // created per call were most of this function's cost at tens of thousands of rows a second.
  const problems: string[] = [];
  const messageId = requiredString(record, problems, 'messageId', ENVELOPE_LIMITS.idLength);
  const type = requiredString(record, problems, 'type', ENVELOPE_LIMITS.typeLength, TYPE_PATTERN);
  const rawVersion = own(record, 'version');
  const version = typeof rawVersion === 'number' ? rawVersion : Number.NaN;
  if (!Number.isSafeInteger(version) || version < 1) {
    problems.push(`'version' must be an integer of 1 or more, got ${describeType(rawVersion)}`);
  }
  const topic = requiredString(record, problems, 'topic', ENVELOPE_LIMITS.topicLength, TOPIC_PATTERN);
  const before = problems.length;
  const occurredAt = requiredString(record, problems, 'occurredAt', 30, ISO_MILLIS);
  // Well-formed (no problem added above; the pattern is not run twice) yet not a real date.
  if (problems.length === before && Number.isNaN(Date.parse(occurredAt))) {
    problems.push(`'occurredAt' is not a real date: ${JSON.stringify(occurredAt)}`);
  }
  const key = optionalString(record, problems, 'key', ENVELOPE_LIMITS.keyLength);
  const correlationId = requiredString(record, problems, 'correlationId', ENVELOPE_LIMITS.idLength);
  const causationId = optionalString(record, problems, 'causationId', ENVELOPE_LIMITS.idLength);
  const traceparent = optionalString(record, problems, 'traceparent', 55, TRACEPARENT);
  const tracestate = optionalString(record, problems, 'tracestate', 512);
  // What the patterns above do not already exclude (type, topic, occurredAt, traceparent are
  // ASCII). Field by field, not a loop over a list of pairs built per call: every row a relay
  // claims passes here, and those arrays were a third of what a decode allocated.
  storable(problems, 'messageId', messageId);
  storable(problems, 'key', key);
  storable(problems, 'correlationId', correlationId);
  storable(problems, 'causationId', causationId);
  storable(problems, 'tracestate', tracestate);
  const rawHeaders = own(record, 'headers') ?? NO_HEADERS;
  const headersObject = rawHeaders !== null && typeof rawHeaders === 'object' && !Array.isArray(rawHeaders);
  const entries = headersObject ? Object.entries(rawHeaders as Record<string, string>) : [];
  // An object without entries has nothing to check: most rows a relay decodes.
  if (!headersObject || entries.length > 0) {
    const headerIssues = headerProblems(rawHeaders, 'headers', ALLOW_PRIORITY);
    if (headerIssues.length > 0) problems.push(...headerIssues);
  }
  const payload = own(record, 'payload');
  if (typeof payload !== 'string') problems.push(`'payload' must be JSON text, got ${describeType(payload)}`);

  if (problems.length > 0) {
    throw new SerializationError('ENVELOPE_INVALID', `invalid envelope: ${problems.join('; ')}`);
  }
  // No headers (most envelopes): the one shared frozen empty object, as core's publish path
  // gives such an envelope; nothing to copy or freeze per row a relay decodes.
  let headers: Readonly<Record<string, string>> = NO_HEADERS;
  if (entries.length > 0) {
    const copy: Record<string, string> = {};
    for (const [name, value] of entries) {
      Object.defineProperty(copy, name, { value, enumerable: true, writable: false, configurable: false });
    }
    headers = Object.freeze(copy);
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
    headers,
    payload: payload as string,
  });
}

/**
 * Envelopes that core's publish path built and {@link sealEnvelope} found to keep every
 * rule of {@link decodeEnvelope}. Private to this module: the only way in is `sealEnvelope`,
 * which core's `buildAppend` calls and the package does not export.
 */
const sealed = new WeakSet<object>();

/** Headers of an envelope published without any: one frozen object, shared (never written to). */
export const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

/**
 * Brands `envelope`, which core's publish path just built, when it is frozen (its headers
 * too) and keeps every rule {@link decodeEnvelope} applies; returns whether it did. An
 * envelope it does not brand is validated by {@link acceptEnvelope} like any other, so a
 * rule checked here only saves work and never lets a bad envelope through. Must accept
 * nothing `decodeEnvelope` refuses (`test/envelope-seal.test.ts` checks it on envelopes
 * published with generated options). Its one assumption, which `buildAppend` keeps:
 * `occurredAt` is `toISOString()` of a valid Date. Internal to core: not exported from the
 * package.
 */
export function sealEnvelope(envelope: Envelope): boolean {
  const e = envelope;
  const ok =
    Object.isFrozen(e) &&
    Object.isFrozen(e.headers) &&
    isId(e.messageId) &&
    typeof e.type === 'string' &&
    isValidType(e.type) &&
    Number.isSafeInteger(e.version) &&
    e.version >= 1 &&
    typeof e.topic === 'string' &&
    isValidTopic(e.topic) &&
    // Date#toISOString() of a valid Date (see above) always parses: the format is what can
    // still be wrong (a year beyond 9999 is written with six digits and a sign).
    typeof e.occurredAt === 'string' &&
    ISO_MILLIS.test(e.occurredAt) &&
    (e.key === null || (typeof e.key === 'string' && e.key.length <= ENVELOPE_LIMITS.keyLength && !hasUnstorableText(e.key))) &&
    isId(e.correlationId) &&
    (e.causationId === null || (typeof e.causationId === 'string' && e.causationId.length <= ENVELOPE_LIMITS.idLength && !hasUnstorableText(e.causationId))) &&
    (e.traceparent === null || (typeof e.traceparent === 'string' && TRACEPARENT.test(e.traceparent))) &&
    (e.tracestate === null || (typeof e.tracestate === 'string' && e.tracestate.length <= 512 && !hasUnstorableText(e.tracestate))) &&
    (e.headers === NO_HEADERS || headerProblems(e.headers, 'headers', ALLOW_PRIORITY).length === 0) &&
    typeof e.payload === 'string';
  if (ok) sealed.add(e);
  return ok;
}

/**
 * Returns `value` as a valid {@link Envelope}: as it is when core's publish built it (it
 * was checked then, by the rules below, and it is frozen, so it cannot have changed), and
 * otherwise whatever {@link decodeEnvelope} returns for it. Stores call it in `append`, so
 * that an envelope from `bus.outbox(tx).publish()` is not validated twice while one from
 * any other caller is validated in full.
 *
 * Guarantees: returns only envelopes `decodeEnvelope` accepts, frozen with frozen headers;
 * throws what `decodeEnvelope` throws (`SerializationError`, code `ENVELOPE_INVALID`,
 * listing every problem) for anything else — a hand-made object, a copy of a published
 * envelope (spread or `structuredClone`, changed or not), a proxy of one. Nothing outside
 * core can mark an object as built by core.
 */
export function acceptEnvelope(value: unknown): Envelope {
  return typeof value === 'object' && value !== null && sealed.has(value) ? (value as Envelope) : decodeEnvelope(value);
}

function isId(value: unknown): boolean {
  return typeof value === 'string' && value.length > 0 && value.length <= ENVELOPE_LIMITS.idLength && !hasUnstorableText(value);
}

/** `record[field]` when it is the record's own property (never an inherited one). */
function own(record: Record<string, unknown>, field: string): unknown {
  return Object.prototype.hasOwnProperty.call(record, field) ? record[field] : undefined;
}

/** Records in `problems` a text field of {@link decodeEnvelope} no store could keep (U+0000, a lone surrogate). */
function storable(problems: string[], field: string, value: string | null): void {
  if (value !== null && hasUnstorableText(value)) problems.push(unstorableProblem(`'${field}'`, value));
}

/** A required string field of {@link decodeEnvelope}; records what is wrong in `problems`. */
function requiredString(record: Record<string, unknown>, problems: string[], field: string, max: number, pattern?: RegExp): string {
  const value = own(record, field);
  if (typeof value !== 'string' || value.length === 0) {
    problems.push(`'${field}' must be a non-empty string, got ${describeType(value)}`);
    return '';
  }
  if (value.length > max) problems.push(`'${field}' is longer than ${max} characters`);
  else if (pattern && !pattern.test(value)) problems.push(`'${field}' is malformed: ${JSON.stringify(value.slice(0, 80))}`);
  return value;
}

/** An optional (string or null) field of {@link decodeEnvelope}; records what is wrong in `problems`. */
function optionalString(record: Record<string, unknown>, problems: string[], field: string, max: number, pattern?: RegExp): string | null {
  const value = own(record, field);
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string') {
    problems.push(`'${field}' must be a string or null, got ${describeType(value)}`);
    return null;
  }
  if (value.length > max) problems.push(`'${field}' is longer than ${max} characters`);
  else if (pattern && !pattern.test(value)) problems.push(`'${field}' is malformed: ${JSON.stringify(value.slice(0, 80))}`);
  return value;
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
