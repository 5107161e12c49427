import { ENVELOPE_FIELDS, decodeEnvelope, type DeadLetterReason, type Envelope } from '@courier/core';
import type { MessageAttributeValue } from '@aws-sdk/client-sqs';

/**
 * The message attributes Courier writes. SQS (and SNS) take at most 10 attributes per
 * message, fewer than the envelope's fields, so the envelope's metadata travels as one JSON
 * attribute and only what a subscription filter or an operator may route on gets its own:
 * at most five of the ten (a message carries at most four at once), leaving the rest to
 * the user's infrastructure.
 */
export const ATTRIBUTES = {
  /** Every envelope field but the payload, as JSON (the body is the payload). */
  envelope: 'courier-envelope',
  /** The message type, alone, so SNS filter policies and console users can route on it. */
  type: 'courier-type',
  /** On a replayed copy: the id of the dead letter it was replayed from. */
  replay: 'courier-replay',
  /** On a dead-letter queue's copy: reason, attempt and time, as JSON. */
  dead: 'courier-dead',
  /** Standard queues: the attempt of a copy a `retry` sent (absent: 1). */
  attempt: 'courier-attempt',
  /** Standard queues: when a retry's copy is due, if later than SQS's 15-minute DelaySeconds (epoch ms). */
  due: 'courier-due',
} as const;

/** SQS's limit on one message: body plus every attribute's name, type and value, in bytes. */
export const SQS_MESSAGE_BYTES = 256 * 1024;

/**
 * Room kept for the attributes, so that `maxMessageBytes` (the payload alone) is honest:
 * an envelope whose metadata needs more is refused at publish, in its result.
 */
export const ATTRIBUTE_ROOM_BYTES = 16 * 1024;

/**
 * Characters SQS accepts in a body or attribute value (#x9, #xA, #xD, #x20-#xD7FF,
 * #xE000-#xFFFD, #x10000-#x10FFFF, https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html).
 * Outside them the service refuses the message, and ElasticMQ fails the whole batch, so
 * the transport refuses such a message itself, alone.
 */
// eslint-disable-next-line no-control-regex -- the control characters SQS allows are the point
const INVALID_CHARACTER = /[^\x09\x0A\x0D\x20-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/u;

/** The envelope's metadata (every field but the payload) as the `courier-envelope` attribute holds it. */
function metadataOf(envelope: Envelope): string {
  return JSON.stringify(Object.fromEntries(ENVELOPE_FIELDS.filter((field) => field !== 'payload').map((field) => [field, envelope[field]])));
}

/** The attributes of a message carrying `envelope`, with `extra` Courier attributes. */
export function attributesOf(envelope: Envelope, extra: Readonly<Record<string, string>> = {}): Record<string, MessageAttributeValue> {
  const attributes: Record<string, MessageAttributeValue> = {
    [ATTRIBUTES.envelope]: { DataType: 'String', StringValue: metadataOf(envelope) },
    [ATTRIBUTES.type]: { DataType: 'String', StringValue: envelope.type },
  };
  for (const [name, value] of Object.entries(extra)) attributes[name] = { DataType: 'String', StringValue: value };
  return attributes;
}

/** The size SQS counts for a message: body plus each attribute's name, data type and value, in UTF-8 bytes. */
export function messageBytes(body: string, attributes: Readonly<Record<string, MessageAttributeValue>>): number {
  let bytes = Buffer.byteLength(body, 'utf8');
  for (const [name, value] of Object.entries(attributes)) {
    bytes += Buffer.byteLength(name, 'utf8') + Buffer.byteLength(value.DataType ?? '', 'utf8') + Buffer.byteLength(value.StringValue ?? '', 'utf8');
  }
  return bytes;
}

/** Problems that make SQS refuse `envelope` as Courier encodes it, whatever the queue's state; empty when none. */
export function contentProblems(envelope: Envelope): string[] {
  const problems: string[] = [];
  if (INVALID_CHARACTER.test(envelope.payload)) problems.push(`payload of message '${envelope.messageId}' has a character SQS refuses (allowed: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF)`);
  if (INVALID_CHARACTER.test(metadataOf(envelope))) problems.push(`envelope fields of message '${envelope.messageId}' have a character SQS refuses in an attribute value`);
  if (envelope.payload.length === 0) problems.push(`payload of message '${envelope.messageId}' is empty (SQS refuses an empty body)`);
  return problems;
}

/** A received message's Courier attributes as plain strings. */
export type ReceivedAttributes = Readonly<Record<string, MessageAttributeValue>> | undefined;

/**
 * The envelope of a received message: its `courier-envelope` attribute plus the body as
 * payload, checked by `decodeEnvelope`.
 *
 * Guarantees: throws `SerializationError` (`ENVELOPE_INVALID`) for anything that is not a
 * valid envelope (no attribute, malformed JSON, a missing field).
 */
export function envelopeOf(body: string | undefined, attributes: ReceivedAttributes): Envelope {
  const metadata = attributes?.[ATTRIBUTES.envelope]?.StringValue;
  let parsed: unknown;
  try {
    parsed = metadata === undefined ? undefined : JSON.parse(metadata);
  } catch {
    parsed = 'not JSON';
  }
  const record = parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) ? { ...(parsed as Record<string, unknown>), payload: body } : parsed;
  return decodeEnvelope(record);
}

/** What a dead-letter queue's copy records about why it is there. */
export interface DeadMark {
  readonly reason: DeadLetterReason;
  readonly attempt: number;
  readonly deadAt: string;
}

/** The `courier-dead` attribute value. */
export function deadMarkValue(mark: DeadMark): string {
  // JSON escapes control characters and lone surrogates, not U+FFFE and U+FFFF, which SQS
  // refuses (ElasticMQ fails the whole request): a handler's error text may hold them.
  return JSON.stringify({ code: mark.reason.code, message: mark.reason.message, attempt: mark.attempt, deadAt: mark.deadAt }).replace(/[\uFFFE\uFFFF]/g, '\uFFFD');
}

/** The dead mark of a dead-letter queue's message; absent (moved by the redrive policy, not by Courier): undefined. */
export function deadMarkOf(attributes: ReceivedAttributes): DeadMark | undefined {
  const value = attributes?.[ATTRIBUTES.dead]?.StringValue;
  if (value === undefined) return undefined;
  try {
    const parsed = JSON.parse(value) as { code?: unknown; message?: unknown; attempt?: unknown; deadAt?: unknown };
    return {
      reason: { code: String(parsed.code ?? 'UNKNOWN'), message: String(parsed.message ?? '') },
      attempt: Number(parsed.attempt) || 1,
      deadAt: typeof parsed.deadAt === 'string' ? parsed.deadAt : new Date(0).toISOString(),
    };
  } catch {
    return undefined;
  }
}

/**
 * An SQS queue name for a Courier name: SQS takes A-Z a-z 0-9 - _ (80 at most, `.fifo`
 * included), Courier topics also `.`, which becomes `_`.
 */
export function queueNamePart(name: string): string {
  return name.replace(/\./g, '_').replace(/[^A-Za-z0-9_-]/g, '-');
}
