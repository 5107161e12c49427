import type { StandardSchemaV1 } from '@standard-schema/spec';
import { isValidTopic, isValidType, MAX_PRIORITY } from './envelope.js';
import { ConfigError, SerializationError } from './errors.js';

/** Converts a payload of version `n` into version `n + 1`. Must be pure. */
export type Upcaster = (payload: unknown) => unknown;

/** Arguments of {@link defineMessage}. */
export interface MessageDefinitionConfig<TSchema extends StandardSchemaV1 | undefined> {
  /** Current contract version, an integer of 1 or more. */
  readonly version: number;
  /** Where the message is published; defaults to the type's prefix (`orders` for `orders.OrderPlaced`). */
  readonly topic?: string;
  /** Any Standard Schema validator (zod, valibot, arktype…). Validation on publish must be synchronous. */
  readonly schema?: TSchema;
  /** `upcasters[n]` turns a version-`n` payload into version `n + 1`, for every `n` below `version`. */
  readonly upcasters?: Readonly<Record<number, Upcaster>>;
  /**
   * Default priority of its messages, 0 (lowest) to 9 (`MAX_PRIORITY`); a publish call's
   * `priority` overrides it. Honoured only by transports declaring `capabilities.priorities`
   * and consumers that ask for it (RabbitMQ: `queueLimits[consumer].maxPriority`).
   */
  readonly priority?: number;
}

/** Payload type a definition carries: the schema's input on publish, output on consume. */
export type PayloadOf<D> = D extends MessageDefinition<infer P, unknown> ? P : never;
/** The payload type handlers receive. */
export type DecodedOf<D> = D extends MessageDefinition<unknown, infer O> ? O : never;

/**
 * A message contract: its stable type name, current version, topic and validation.
 * Immutable; safe to share across buses and modules.
 */
export interface MessageDefinition<TInput = unknown, TOutput = TInput> {
  readonly type: string;
  readonly version: number;
  readonly topic: string;
  readonly schema: StandardSchemaV1<TInput, TOutput> | undefined;
  readonly upcasters: Readonly<Record<number, Upcaster>>;
  /** Default priority of its messages (see {@link MessageDefinitionConfig.priority}); absent when none. */
  readonly priority?: number;
}

type InferInput<S> = S extends StandardSchemaV1<infer I, unknown> ? I : unknown;
type InferOutput<S> = S extends StandardSchemaV1<unknown, infer O> ? O : unknown;

/**
 * Declares a message contract.
 *
 * Guarantees: throws `ConfigError` listing every problem (malformed type, non-integer
 * version, invalid topic, a missing upcaster between 1 and `version`) so a bad contract
 * fails at start-up, not in production traffic.
 */
export function defineMessage<TSchema extends StandardSchemaV1 | undefined = undefined>(
  type: string,
  config: MessageDefinitionConfig<TSchema>,
): MessageDefinition<InferInput<TSchema>, InferOutput<TSchema>> {
  const problems: string[] = [];
  if (typeof type !== 'string' || !isValidType(type)) {
    problems.push(
      `message type ${JSON.stringify(type)} is malformed: use dot-separated segments of letters, digits, '_' or '-', e.g. 'orders.OrderPlaced'`,
    );
  }
  const version: unknown = config?.version;
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 1) {
    problems.push(`version of '${String(type)}' must be an integer of 1 or more, got ${JSON.stringify(version)}`);
  }
  let topic = config?.topic;
  if (topic === undefined && typeof type === 'string' && type.includes('.')) topic = type.slice(0, type.indexOf('.'));
  if (topic === undefined) problems.push(`message type '${String(type)}' has no prefix; give it a 'topic'`);
  else if (typeof topic !== 'string' || !isValidTopic(topic)) {
    problems.push(`topic ${JSON.stringify(topic)} of '${String(type)}' is malformed: use letters, digits, '.', '_' or '-'`);
  }
  const schema = config?.schema;
  if (schema !== undefined && (typeof schema !== 'object' || schema === null || !('~standard' in schema))) {
    problems.push(`schema of '${String(type)}' is not a Standard Schema validator (zod, valibot, arktype…)`);
  }
  const upcasters = config?.upcasters ?? {};
  if (typeof version === 'number' && Number.isSafeInteger(version)) {
    for (let from = 1; from < version; from += 1) {
      if (upcasters[from] !== undefined && typeof upcasters[from] !== 'function') {
        problems.push(`upcaster ${from} of '${String(type)}' must be a function`);
      }
    }
  }
  const priority: unknown = config?.priority;
  if (priority !== undefined && !isPriority(priority)) {
    problems.push(`priority of '${String(type)}' must be an integer from 0 to ${MAX_PRIORITY}, got ${JSON.stringify(priority)}`);
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze({
    ...(priority === undefined ? {} : { priority: priority as number }),
    type,
    version: version as number,
    topic: topic as string,
    schema: schema as StandardSchemaV1<InferInput<TSchema>, InferOutput<TSchema>> | undefined,
    upcasters: Object.freeze({ ...upcasters }),
  });
}

/** True for a valid message priority: an integer from 0 to `MAX_PRIORITY`. */
export function isPriority(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0 && value <= MAX_PRIORITY;
}

/**
 * Validates `value` with the definition's schema synchronously (the publish path) and
 * returns the value to store: the payload as given, not the schema's transformed output,
 * so consumers validate the same bytes the producer checked.
 */
export function validateForPublish(definition: MessageDefinition<unknown, unknown>, value: unknown): void {
  if (definition.schema === undefined) return;
  const result = definition.schema['~standard'].validate(value);
  if (result instanceof Promise) {
    throw new ConfigError(`schema of '${definition.type}' validates asynchronously; outbox publish needs a synchronous schema`);
  }
  if (result.issues) throw schemaError(definition, result.issues, 'payload');
}

/**
 * Brings a decoded payload of `version` up to the definition's current version with
 * its upcasters, then validates it (awaiting asynchronous schemas). Throws
 * `SerializationError` (`UNSUPPORTED_VERSION` or `PAYLOAD_INVALID`) when it cannot.
 */
export async function decodeForConsume(
  definition: MessageDefinition<unknown, unknown>,
  version: number,
  payload: unknown,
): Promise<unknown> {
  if (version > definition.version) {
    throw new SerializationError(
      'UNSUPPORTED_VERSION',
      `'${definition.type}' version ${version} is newer than the consumer knows (${definition.version})`,
    );
  }
  let current = payload;
  for (let from = version; from < definition.version; from += 1) {
    const upcaster = definition.upcasters[from];
    if (upcaster === undefined) {
      throw new SerializationError(
        'UNSUPPORTED_VERSION',
        `'${definition.type}' version ${from} has no upcaster to version ${from + 1}`,
      );
    }
    current = upcaster(current);
  }
  if (definition.schema === undefined) return current;
  const result = await definition.schema['~standard'].validate(current);
  if (result.issues) throw schemaError(definition, result.issues, 'payload');
  return result.value;
}

function schemaError(
  definition: MessageDefinition<unknown, unknown>,
  issues: ReadonlyArray<StandardSchemaV1.Issue>,
  root: string,
): SerializationError {
  const rendered = issues.slice(0, 10).map((issue) => {
    const path = (issue.path ?? [])
      .map((segment) => (typeof segment === 'object' && segment !== null ? segment.key : segment))
      .map((segment) => (typeof segment === 'number' ? `[${segment}]` : `.${String(segment)}`))
      .join('');
    return `'${root}${path}' ${issue.message}`;
  });
  const first = issues[0];
  const firstPath = first?.path?.map((s) => (typeof s === 'object' && s !== null ? s.key : s)).join('.');
  return new SerializationError('PAYLOAD_INVALID', `payload of '${definition.type}' is invalid: ${rendered.join('; ')}`, {
    path: firstPath ? `${root}.${firstPath}` : root,
  });
}
