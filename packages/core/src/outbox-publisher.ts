import type { Tracer } from '@opentelemetry/api';
import { uuidv7 } from 'uuidv7';
import type { OutboxPublisher, PublishOptions } from './bus-types.js';
import {
  ENVELOPE_LIMITS,
  envelopeLimitProblems,
  headerProblems,
  isValidTopic,
  isValidType,
  MAX_PRIORITY,
  NO_HEADERS,
  PRIORITY_HEADER,
  sealEnvelope,
  unstorableProblem,
  type Envelope,
  type NamedLimits,
} from './envelope.js';
import { ConfigError, SerializationError } from './errors.js';
import { serializePayload } from './json.js';
import { hasUnstorableText } from './reason-text.js';
import { isPriority, validateForPublish, type MessageDefinition } from './message-definition.js';
import type { AppendResult, OutboxAppend, OutboxStore, PublishedId } from './outbox-store.js';
import { captureTrace } from './telemetry.js';

/** What a publisher inherits when it publishes from inside a handler. */
export interface Causation {
  readonly correlationId: string;
  readonly causationId: string;
}

/** Settings shared by every publisher of one bus. */
export interface PublisherSettings {
  readonly maxPayloadBytes: number;
  /** The limits the bus's stores and transport declared; every envelope must fit them all. */
  readonly limits?: readonly NamedLimits[];
  readonly newId: () => string;
  readonly tracer: Tracer;
  /** The transport's `validate`: problems that make the broker refuse an envelope, checked at publish. */
  readonly validate?: (envelope: Envelope) => readonly string[];
}

/**
 * The range of schedules `publish` accepts (`delay`, `notBefore`), the same whatever the
 * store: every supported database holds these instants (MariaDB's `DATETIME` ends with
 * year 9999; times before 1970 have no use as a schedule).
 *
 * Guarantees: a schedule outside it is refused at `publish()` with a `ConfigError` naming
 * the option, so it never reaches the database.
 */
export const SCHEDULE_LIMITS = Object.freeze({
  /** Longest `delay`: 100 years of 365.25 days, in milliseconds. Later instants take `notBefore`. */
  maxDelayMs: 100 * 365.25 * 24 * 60 * 60 * 1000,
  /** Earliest `notBefore`: 1970-01-01T00:00:00.000Z. */
  earliestMs: Date.UTC(1970, 0, 1),
  /** Latest `notBefore` (and `occurredAt`): 9999-12-31T23:59:59.999Z. */
  latestMs: Date.UTC(9999, 11, 31, 23, 59, 59, 999),
});

/** Default message id: UUIDv7, time-ordered so outbox and broker indexes stay append-mostly. */
export const newMessageId = (): string => uuidv7();

/**
 * Builds the envelope for one publish call, validating everything first.
 *
 * Guarantees: either returns a complete, valid append or throws (listing every problem
 * with the options, or naming the payload field at fault) — never a half-built row. An
 * envelope the transport's `validate` finds problems with throws a `ConfigError` naming
 * the message type and each problem. Each option is read once, so what was checked is
 * what the envelope carries; the envelope and its headers are frozen, and when it keeps
 * every rule of `decodeEnvelope` it is sealed, so a store's `acceptEnvelope` takes it
 * without checking it again.
 */
export function buildAppend(
  definition: MessageDefinition<unknown, unknown>,
  payload: unknown,
  options: PublishOptions = {},
  settings: PublisherSettings,
  causation?: Causation,
): OutboxAppend {
  if (definition === null || typeof definition !== 'object' || typeof definition.type !== 'string' || typeof definition.topic !== 'string') {
    throw new ConfigError('publish needs a message definition from defineMessage(...)');
  }
  // A definition not made by defineMessage (a spread copy with a changed type) would otherwise
  // reach the store, whose check says SerializationError: it is the caller's input.
  if (!isValidType(definition.type) || !isValidTopic(definition.topic)) {
    const problems = [
      ...(isValidType(definition.type) ? [] : [hasUnstorableText(definition.type) ? unstorableProblem(`type ${JSON.stringify(definition.type)}`, definition.type) : `type ${JSON.stringify(definition.type)} is not a valid message type`]),
      ...(isValidTopic(definition.topic) ? [] : [hasUnstorableText(definition.topic) ? unstorableProblem(`topic ${JSON.stringify(definition.topic)}`, definition.topic) : `topic ${JSON.stringify(definition.topic)} is not a valid topic`]),
    ];
    throw new ConfigError(problems.map((problem) => `publish: ${problem}`));
  }
  if (options === null || typeof options !== 'object') throw new ConfigError(`publish '${definition.type}': options must be an object`);
  const given = readOptions(options);
  const problems = optionProblems(given);
  const priority = given.priority ?? definition.priority;
  if (given.priority !== undefined && !isPriority(given.priority)) {
    problems.push(`'priority' must be an integer from 0 to ${MAX_PRIORITY}, got ${JSON.stringify(given.priority)}`);
  } else if (given.priority === undefined && priority !== undefined && !isPriority(priority)) {
    problems.push(`the definition's 'priority' must be an integer from 0 to ${MAX_PRIORITY}, got ${JSON.stringify(priority)}`);
  }
  if (problems.length > 0) throw new ConfigError(problems.map((problem) => `publish '${definition.type}': ${problem}`));
  validateForPublish(definition, payload);
  const text = serializePayload(payload);
  // A UTF-16 code unit is at most 3 UTF-8 bytes: a short payload needs no count.
  if (text.length * 3 > settings.maxPayloadBytes) {
    const bytes = Buffer.byteLength(text, 'utf8');
    if (bytes > settings.maxPayloadBytes) {
      throw new SerializationError(
        'PAYLOAD_TOO_LARGE',
        `payload of '${definition.type}' is ${bytes} bytes; the limit is ${settings.maxPayloadBytes} (min of the configured limit and the transport's)`,
        { path: 'payload' },
      );
    }
  }
  const messageId = (given.messageId as string | undefined) ?? settings.newId();
  const trace = captureTrace(settings.tracer, definition.type, definition.topic, messageId);
  const envelope: Envelope = Object.freeze({
    messageId,
    type: definition.type,
    version: definition.version,
    topic: definition.topic,
    occurredAt: ((given.occurredAt as Date | undefined) ?? new Date()).toISOString(),
    key: (given.key as string | undefined) ?? null,
    correlationId: (given.correlationId as string | undefined) ?? causation?.correlationId ?? messageId,
    causationId: (given.causationId as string | undefined) ?? causation?.causationId ?? null,
    traceparent: trace.traceparent,
    tracestate: trace.tracestate,
    headers: priority === undefined ? (given.headers as Readonly<Record<string, string>>) : withPriority(given.headers as Readonly<Record<string, string>>, priority as number),
    payload: text,
  });
  // One ConfigError with every problem: the declared limits and what the transport refuses.
  const limitIssues = envelopeLimitProblems(envelope, settings.limits ?? NO_LIMITS);
  const refused = settings.validate?.(envelope);
  if (refused !== undefined && refused.length > 0) limitIssues.push(...refused);
  if (limitIssues.length > 0) throw new ConfigError(limitIssues.map((problem) => `publish '${definition.type}': ${problem}`));
  // Not sealed (a definition not made by defineMessage, a custom newId's id, a trace field
  // out of bounds): the store's acceptEnvelope validates it then, as before.
  sealEnvelope(envelope);
  const delay = given.delay as number | undefined;
  const notBefore = given.notBefore as Date | undefined;
  if (delay === undefined && notBefore === undefined) return { envelope };
  return delay !== undefined ? { envelope, delayMs: delay } : { envelope, notBefore: notBefore! };
}

const NO_LIMITS: readonly NamedLimits[] = Object.freeze([]);

/**
 * Creates the publisher `bus.outbox(tx)` and `ctx.publish` use.
 *
 * On a store that declares `asyncAppend`, `publish` always returns a promise: a validation
 * problem rejects it (nothing written) and so does a failed write. `track`, when given, is
 * called with every such promise before `publish` returns, with a handler already attached
 * so a rejection the caller never awaits is not an unhandled rejection; the consumer uses
 * it to await every append of a handler before it commits.
 */
export function createOutboxPublisher<Tx, A extends AppendResult>(
  store: OutboxStore<Tx, A>,
  tx: Tx,
  settings: PublisherSettings,
  causation?: Causation,
  track?: (pending: Promise<string>) => void,
): OutboxPublisher<A> {
  const tracked = (pending: Promise<string>): Promise<string> => {
    track?.(pending);
    return pending;
  };
  if (store.asyncAppend === true) {
    return {
      publish(definition, payload, options) {
        let pending: Promise<string>;
        try {
          const append = buildAppend(definition, payload, options, settings, causation);
          // Called now, not in a later microtask: appends of one unit of work reach the
          // driver in publish order.
          const written = store.append(tx, [append]);
          pending = Promise.resolve(written).then(() => append.envelope.messageId);
        } catch (error) {
          pending = Promise.reject(error as Error);
        }
        return tracked(pending) as PublishedId<A>;
      },
    };
  }
  return {
    publish(definition, payload, options) {
      const append = buildAppend(definition, payload, options, settings, causation);
      const written: unknown = store.append(tx, [append]);
      // A store that returns a promise without declaring asyncAppend still has its write
      // awaited (validation problems throw, as the flag's absence says).
      if (isPromiseLike(written)) return tracked(Promise.resolve(written).then(() => append.envelope.messageId)) as PublishedId<A>;
      return append.envelope.messageId as PublishedId<A>;
    },
  };
}

function isPromiseLike(value: unknown): value is PromiseLike<unknown> {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof (value as { then?: unknown }).then === 'function';
}

/** The options of one publish call, each read once (a getter answers once). */
interface GivenOptions {
  readonly key: unknown;
  readonly delay: unknown;
  readonly notBefore: unknown;
  readonly messageId: unknown;
  readonly correlationId: unknown;
  readonly causationId: unknown;
  readonly occurredAt: unknown;
  /** A frozen copy of the headers, {@link NO_HEADERS} without any; the value as given when it is not an object (a problem). */
  readonly headers: unknown;
  readonly priority: unknown;
}

/** `headers` plus the priority header (user headers cannot hold it: checked before). */
function withPriority(headers: Readonly<Record<string, string>>, priority: number): Readonly<Record<string, string>> {
  const copy: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) Object.defineProperty(copy, name, { value, enumerable: true, writable: true, configurable: true });
  copy[PRIORITY_HEADER] = String(priority);
  return Object.freeze(copy);
}

function readOptions(options: PublishOptions): GivenOptions {
  const headers: unknown = options.headers;
  return {
    key: options.key,
    delay: options.delay,
    notBefore: options.notBefore,
    messageId: options.messageId,
    correlationId: options.correlationId,
    causationId: options.causationId,
    occurredAt: options.occurredAt,
    priority: options.priority,
    // Own enumerable string keys, copied as data (a `__proto__` name stays a header), as
    // decodeEnvelope copies them: the envelope carries exactly the headers checked.
    headers:
      headers === undefined
        ? NO_HEADERS
        : headers === null || typeof headers !== 'object' || Array.isArray(headers)
          ? headers
          : Object.freeze(Object.fromEntries(Object.entries(headers as Record<string, unknown>))),
  };
}

function optionProblems(options: GivenOptions): string[] {
  const problems: string[] = [];
  idProblem(problems, 'messageId', options.messageId);
  idProblem(problems, 'correlationId', options.correlationId);
  idProblem(problems, 'causationId', options.causationId);
  const key = options.key;
  if (key !== undefined && (typeof key !== 'string' || key.length === 0 || key.length > ENVELOPE_LIMITS.keyLength)) {
    problems.push(`'key' must be a non-empty string of at most ${ENVELOPE_LIMITS.keyLength} characters`);
  } else if (key !== undefined && hasUnstorableText(key as string)) {
    problems.push(unstorableProblem(`'key'`, key as string));
  }
  const delay = options.delay;
  if (delay !== undefined && (typeof delay !== 'number' || !Number.isFinite(delay) || delay < 0)) {
    problems.push(`'delay' must be a finite number of milliseconds, 0 or more`);
  } else if (delay !== undefined && delay > SCHEDULE_LIMITS.maxDelayMs) {
    problems.push(`'delay' is ${delay} ms; at most ${SCHEDULE_LIMITS.maxDelayMs} (100 years) is allowed: use 'notBefore' for a fixed instant`);
  }
  const notBefore = options.notBefore;
  if (notBefore !== undefined && !(notBefore instanceof Date && !Number.isNaN(notBefore.getTime()))) {
    problems.push(`'notBefore' must be a valid Date`);
  } else if (notBefore !== undefined && !withinRange(notBefore, SCHEDULE_LIMITS.earliestMs)) {
    problems.push(`'notBefore' is ${describeDate(notBefore)}; it must be from ${isoOf(SCHEDULE_LIMITS.earliestMs)} to ${isoOf(SCHEDULE_LIMITS.latestMs)}`);
  }
  if (delay !== undefined && notBefore !== undefined) problems.push(`give 'delay' or 'notBefore', not both`);
  const occurredAt = options.occurredAt;
  if (occurredAt !== undefined && !(occurredAt instanceof Date && !Number.isNaN(occurredAt.getTime()))) {
    problems.push(`'occurredAt' must be a valid Date`);
  } else if (occurredAt !== undefined && !withinRange(occurredAt, YEAR_ZERO_MS)) {
    // The envelope carries it as ISO-8601 with a four-digit year.
    problems.push(`'occurredAt' is ${describeDate(occurredAt)}; it must be from ${isoOf(YEAR_ZERO_MS)} to ${isoOf(SCHEDULE_LIMITS.latestMs)}`);
  }
  if (options.headers !== NO_HEADERS) {
    const headerIssues = headerProblems(options.headers);
    if (headerIssues.length > 0) problems.push(...headerIssues);
  }
  return problems;
}

function idProblem(problems: string[], field: 'messageId' | 'correlationId' | 'causationId', value: unknown): void {
  if (value === undefined) return;
  if (typeof value !== 'string' || value.length === 0 || value.length > ENVELOPE_LIMITS.idLength) {
    problems.push(`'${field}' must be a non-empty string of at most ${ENVELOPE_LIMITS.idLength} characters`);
  } else if (hasUnstorableText(value)) {
    problems.push(unstorableProblem(`'${field}'`, value));
  }
}

/** 0000-01-01T00:00:00.000Z, the earliest instant ISO-8601 writes with four digits. (`Date.UTC` maps years 0-99 to 19xx.) */
const YEAR_ZERO_MS = Date.parse('0000-01-01T00:00:00.000Z');

function withinRange(value: unknown, earliestMs: number): boolean {
  const ms = (value as Date).getTime();
  return ms >= earliestMs && ms <= SCHEDULE_LIMITS.latestMs;
}

function isoOf(ms: number): string {
  return new Date(ms).toISOString();
}

function describeDate(value: unknown): string {
  return isoOf((value as Date).getTime());
}
