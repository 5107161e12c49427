import { decodeEnvelope, envelopePriority, PRIORITY_HEADER, SerializationError, type Envelope } from '@courier/core';

/**
 * The AMQP message a {@link toAmqpMessage} call produces: body, and the options of its
 * `basic.publish` (method fields and properties) in the one object amqplib takes.
 */
export interface AmqpMessage {
  readonly content: Buffer;
  readonly properties: AmqpPublishProperties;
}

/**
 * The subset of AMQP basic properties Courier sets, with the `mandatory` flag of
 * `basic.publish`: built once per message so that it is passed to amqplib as it is.
 */
export interface AmqpPublishProperties {
  /** A message no queue takes comes back (`basic.return`) instead of vanishing. */
  readonly mandatory: true;
  readonly messageId: string;
  readonly correlationId: string;
  readonly type: string;
  /** Whole seconds since the epoch: AMQP's `timestamp` cannot hold milliseconds. */
  readonly timestamp: number;
  readonly contentType: 'application/json';
  readonly contentEncoding: 'utf-8';
  /** 2 = persistent. */
  readonly deliveryMode: 2;
  /** The envelope's priority (`courier-priority`), when it has one; honoured by queues declared with `x-max-priority`. */
  readonly priority?: number;
  readonly headers: Record<string, unknown>;
}

/** The subset of an amqplib `Message` that {@link fromAmqpMessage} reads. */
export interface AmqpIncoming {
  readonly content: Buffer;
  readonly properties: {
    readonly messageId?: unknown;
    readonly correlationId?: unknown;
    readonly type?: unknown;
    readonly timestamp?: unknown;
    readonly headers?: Readonly<Record<string, unknown>> | undefined;
  };
}

/**
 * Header names Courier writes. `courier-` is reserved in envelope headers, so none of
 * these can collide with a user header.
 */
export const COURIER_HEADERS = {
  occurredAt: 'courier-occurred-at',
  version: 'courier-version',
  topic: 'courier-topic',
  key: 'courier-key',
  causationId: 'courier-causation-id',
  traceparent: 'courier-traceparent',
  tracestate: 'courier-tracestate',
  attempt: 'courier-attempt',
  deadCode: 'courier-dead-code',
  deadReason: 'courier-dead-reason',
  deadAt: 'courier-dead-at',
  retryCode: 'courier-retry-code',
  /** Set by `deadLetters.replay`: tells a replayed dead letter from a duplicate of it. */
  replayedAt: 'courier-replayed-at',
  originalExchange: 'courier-original-exchange',
  originalRoutingKey: 'courier-original-routing-key',
  protoHeader: 'courier-proto-header',
} as const;

/**
 * Sender-selected routing headers: RabbitMQ routes a message to the extra routing keys
 * listed in `CC` and `BCC` (matched case-sensitively) and requires each to be an array
 * of strings. Courier headers are strings, so the broker would answer one by closing the
 * publish channel (406 PRECONDITION_FAILED, `unacceptable_type_in_header`).
 */
const ROUTING_HEADERS = new Set(['CC', 'BCC']);

/**
 * Headers the broker itself adds on the way (dead-lettering, quorum redelivery counts,
 * shovels, federation, streams) or keeps for other protocols; compared case-insensitively.
 * A user header with one of these names could not round-trip: the broker overwrites it
 * or the decoder drops it.
 */
const BROKER_HEADERS = new Set([
  'x-death',
  'x-delivery-count',
  'x-received-from',
  'x-shovelled',
  'x-shovelled-timestamp',
  'x-stream-offset',
  'x-stream-filter-value',
]);
const BROKER_HEADER_PREFIXES = ['x-first-death-', 'x-last-death-', 'x-mqtt-', 'x-amqp-1.0-'];

/**
 * True for a header name RabbitMQ reserves: a routing header (`CC`, `BCC`) or one the
 * broker adds or owns (`x-death`, `x-first-death-*`, …). Such headers are never user
 * headers: publishing refuses them, decoding and copies leave them out.
 */
export function isBrokerHeader(name: string): boolean {
  if (ROUTING_HEADERS.has(name)) return true;
  const lower = name.toLowerCase();
  return BROKER_HEADERS.has(lower) || BROKER_HEADER_PREFIXES.some((prefix) => lower.startsWith(prefix));
}

/**
 * Lists what makes RabbitMQ refuse or mangle `envelope` whatever the broker's state:
 * each user header whose name RabbitMQ reserves (see {@link isBrokerHeader}). Empty when
 * the envelope can be published. The transport's `validate`; {@link toAmqpMessage}
 * refuses the same envelopes, so the two never disagree.
 */
export function amqpEnvelopeProblems(envelope: Pick<Envelope, 'headers'>): string[] {
  const problems: string[] = [];
  for (const name of Object.keys(envelope.headers)) addHeaderProblem(name, problems);
  return problems;
}

/** Adds to `problems` what is wrong with user header `name` for RabbitMQ (see {@link amqpEnvelopeProblems}). */
function addHeaderProblem(name: string, problems: string[]): void {
  if (ROUTING_HEADERS.has(name)) {
    problems.push(`header '${name}' is reserved by RabbitMQ for sender-selected routing (it must be an array; the broker would close the publish channel)`);
  } else if (isBrokerHeader(name)) {
    problems.push(`header '${name}' is reserved by RabbitMQ and would not round-trip`);
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Maps an envelope onto an AMQP message, losslessly.
 *
 * messageId → `message_id`, correlationId → `correlation_id`, type → `type`,
 * occurredAt → `timestamp` (seconds) plus `courier-occurred-at` (the exact ISO string
 * with milliseconds), payload → the body as UTF-8 JSON (`application/json`), user
 * headers as they are, and every other field in a `courier-*` header; `null` fields are
 * left out so that `null` and `""` stay distinct. Messages are persistent and mandatory
 * (the options are ready for amqplib's `publish` as they are: no copy per send).
 *
 * Throws `SerializationError` (`ENVELOPE_INVALID`) naming every user header RabbitMQ
 * reserves ({@link amqpEnvelopeProblems}: `CC`, `BCC`, `x-death`, …): the broker would
 * refuse it or it would not survive the trip.
 */
export function toAmqpMessage(envelope: Envelope, extraHeaders?: Readonly<Record<string, unknown>>): AmqpMessage {
  const headers: Record<string, unknown> = {};
  // One pass over the user headers checks and copies them: the relay maps every message it
  // sends, and most carry none, so nothing is allocated for them but the headers object.
  let problems: string[] | undefined;
  for (const name of Object.keys(envelope.headers)) {
    if (ROUTING_HEADERS.has(name) || isBrokerHeader(name)) addHeaderProblem(name, (problems ??= []));
    // amqplib decodes a table with `fields[key] = value`, so a `__proto__` header would be
    // swallowed on the way in; it travels under a reserved name instead.
    else if (name === '__proto__') headers[COURIER_HEADERS.protoHeader] = envelope.headers[name];
    else headers[name] = envelope.headers[name];
  }
  if (problems !== undefined) throw new SerializationError('ENVELOPE_INVALID', `message '${envelope.messageId}': ${problems.join('; ')}`);
  headers[COURIER_HEADERS.occurredAt] = envelope.occurredAt;
  headers[COURIER_HEADERS.version] = envelope.version;
  headers[COURIER_HEADERS.topic] = envelope.topic;
  if (envelope.key !== null) headers[COURIER_HEADERS.key] = envelope.key;
  if (envelope.causationId !== null) headers[COURIER_HEADERS.causationId] = envelope.causationId;
  if (envelope.traceparent !== null) headers[COURIER_HEADERS.traceparent] = envelope.traceparent;
  if (envelope.tracestate !== null) headers[COURIER_HEADERS.tracestate] = envelope.tracestate;
  if (extraHeaders) Object.assign(headers, extraHeaders);
  const properties: { -readonly [K in keyof AmqpPublishProperties]: AmqpPublishProperties[K] } = {
    mandatory: true,
    messageId: envelope.messageId,
    correlationId: envelope.correlationId,
    type: envelope.type,
    timestamp: Math.floor(Date.parse(envelope.occurredAt) / 1000),
    contentType: 'application/json',
    contentEncoding: 'utf-8',
    deliveryMode: 2,
    headers,
  };
  // The header (kept with the others, so the envelope round-trips) and AMQP's own property,
  // which is what a priority queue orders by. Set only when there is one (no spread of an
  // empty object into every message's options).
  const priority = envelopePriority(envelope);
  if (priority !== null) properties.priority = priority;
  return { content: Buffer.from(envelope.payload, 'utf8'), properties };
}

/**
 * Reads an envelope back from an AMQP message received from the broker (untrusted input).
 *
 * Guarantees: the inverse of {@link toAmqpMessage}; validated by core's `decodeEnvelope`,
 * so it returns a frozen envelope or throws `SerializationError` (`ENVELOPE_INVALID`)
 * listing every problem, including a body that is not valid UTF-8. `courier-*` and
 * broker-added headers are not user headers and are left out. A message from another
 * producer without `courier-occurred-at` falls back to its whole-second `timestamp`.
 */
export function fromAmqpMessage(message: AmqpIncoming): Envelope {
  const { properties } = message;
  const raw = properties.headers ?? {};
  const userHeaders: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(raw)) {
    // The priority header is the one Courier header an envelope carries (core validates it).
    if ((name.toLowerCase().startsWith('courier-') && name !== PRIORITY_HEADER) || isBrokerHeader(name)) continue;
    // Copied as data: a `__proto__` header must stay a header, never a prototype.
    Object.defineProperty(userHeaders, name, { value: headerText(value), enumerable: true, writable: true, configurable: true });
  }
  const proto = raw[COURIER_HEADERS.protoHeader];
  if (proto !== undefined) {
    Object.defineProperty(userHeaders, '__proto__', { value: headerText(proto), enumerable: true, writable: true, configurable: true });
  }
  let payload: string;
  try {
    payload = utf8.decode(message.content);
  } catch (error) {
    throw new SerializationError('ENVELOPE_INVALID', `message '${String(properties.messageId)}' body is not valid UTF-8`, { cause: error });
  }
  const occurredAt = raw[COURIER_HEADERS.occurredAt] ?? secondsToIso(properties.timestamp);
  return decodeEnvelope({
    messageId: properties.messageId,
    type: properties.type,
    version: numeric(raw[COURIER_HEADERS.version]),
    topic: headerText(raw[COURIER_HEADERS.topic]),
    occurredAt: headerText(occurredAt),
    key: headerText(raw[COURIER_HEADERS.key]) ?? null,
    correlationId: properties.correlationId,
    causationId: headerText(raw[COURIER_HEADERS.causationId]) ?? null,
    traceparent: headerText(raw[COURIER_HEADERS.traceparent]) ?? null,
    tracestate: headerText(raw[COURIER_HEADERS.tracestate]) ?? null,
    headers: userHeaders,
    payload,
  });
}

/** The `courier-attempt` header as a try number of 1 or more (absent or malformed: 1). */
export function attemptOf(headers: Readonly<Record<string, unknown>> | undefined): number {
  const value = numeric(headers?.[COURIER_HEADERS.attempt]);
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1 ? value : 1;
}

// amqplib hands long strings back as strings, but other clients may send byte arrays.
function headerText(value: unknown): unknown {
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  return value;
}

// Integers may arrive as any AMQP integer type; a string of digits is accepted from other clients.
function numeric(value: unknown): unknown {
  if (typeof value === 'bigint') return Number(value);
  if (typeof value === 'string' && /^\d{1,15}$/.test(value)) return Number(value);
  return value;
}

function secondsToIso(timestamp: unknown): string | undefined {
  return typeof timestamp === 'number' && Number.isFinite(timestamp) ? new Date(timestamp * 1000).toISOString() : undefined;
}

/**
 * Publish options for a copy of a received message (retry, dead letter, replay): the same
 * basic properties, persistent and mandatory, with `headers` replacing the original
 * headers. Internal.
 */
export function copyProperties(
  properties: Readonly<Record<string, unknown>>,
  headers: Record<string, unknown>,
): { messageId: string; headers: Record<string, unknown>; deliveryMode: 2; mandatory: true; [property: string]: unknown } {
  const copy: { messageId: string; headers: Record<string, unknown>; deliveryMode: 2; mandatory: true; [property: string]: unknown } = {
    messageId: String(properties['messageId'] ?? ''),
    headers,
    deliveryMode: 2,
    mandatory: true,
  };
  // `priority` too: a retry or replayed copy keeps its place in a priority queue.
  for (const name of ['correlationId', 'type', 'timestamp', 'contentType', 'contentEncoding', 'appId', 'priority']) {
    const value = properties[name];
    if (value !== undefined && value !== null) copy[name] = value;
  }
  return copy;
}
