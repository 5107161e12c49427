// How an envelope lives in a stream entry. Redis stream entries are flat field/value lists of
// binary-safe strings, so the envelope travels whole as one JSON field (lossless: every field
// is a JSON string, number or null, and JSON.stringify escapes lone surrogates as ASCII), and
// what the transport itself adds (the attempt, the replay mark) travels in fields of its own
// beside it, so a retry copy rewrites those without touching the envelope text.
import { ENVELOPE_FIELDS, decodeEnvelope, type DeadLetterReason, type Envelope } from '@courier/core';

/** Field holding the envelope as JSON text. */
export const ENVELOPE_FIELD = 'envelope';
/** Field holding the delivery attempt (absent: 1), raised on each retry copy. */
export const ATTEMPT_FIELD = 'courier-attempt';
/** Field marking a replayed copy ('1'), carried onto the copies its retries write. */
export const REPLAYED_FIELD = 'courier-replayed';

/** A stream entry as XREADGROUP / XRANGE / XAUTOCLAIM return it: id and flat field list. */
export interface RawEntry {
  readonly id: string;
  readonly fields: readonly string[];
}

/** A decoded entry: the envelope and what the transport carried beside it. */
export interface DecodedEntry {
  readonly envelope: Envelope;
  readonly attempt: number;
  readonly replayed: boolean;
}

/** The fields an XADD of `envelope` writes, in order (flat field/value list). */
export function encodeFields(envelope: Envelope, attempt: number, replayed: boolean): string[] {
  const fields = [ENVELOPE_FIELD, encodeEnvelope(envelope), ATTEMPT_FIELD, String(attempt)];
  if (replayed) fields.push(REPLAYED_FIELD, '1');
  return fields;
}

/** The envelope as JSON text, fields in a fixed order (no prototype or extra fields carried). */
export function encodeEnvelope(envelope: Envelope): string {
  return JSON.stringify(Object.fromEntries(ENVELOPE_FIELDS.map((field) => [field, envelope[field]])));
}

/** Field/value map of a flat field list (the last value of a repeated field wins). */
export function fieldMap(fields: readonly string[]): Map<string, string> {
  const map = new Map<string, string>();
  for (let index = 0; index + 1 < fields.length; index += 2) map.set(fields[index]!, fields[index + 1]!);
  return map;
}

/**
 * Decodes an entry the transport wrote. Throws `SerializationError` (`ENVELOPE_INVALID`)
 * when the envelope field is missing, not JSON, or not a valid envelope; an attempt field
 * that is not a positive integer counts as 1, since the attempt only drives retry backoff.
 */
export function decodeEntry(fields: readonly string[]): DecodedEntry {
  const map = fieldMap(fields);
  const text = map.get(ENVELOPE_FIELD);
  let parsed: unknown;
  try {
    parsed = text === undefined ? undefined : JSON.parse(text);
  } catch {
    parsed = text;
  }
  const envelope = decodeEnvelope(parsed);
  return { envelope, attempt: parseAttempt(map.get(ATTEMPT_FIELD)), replayed: map.get(REPLAYED_FIELD) === '1' };
}

function parseAttempt(text: string | undefined): number {
  const value = text === undefined ? 1 : Number(text);
  return Number.isSafeInteger(value) && value >= 1 ? value : 1;
}

/** Dead-letter entry fields beside the original's (see `deadFields`). */
export const DEAD_CODE_FIELD = 'courier-dead-code';
export const DEAD_REASON_FIELD = 'courier-dead-reason';
export const DEAD_AT_FIELD = 'courier-dead-at';

/** The fields of a dead-letter entry: the original's fields whole, then the reason (deadAt is set by the server's clock in the script). */
export function deadFields(original: readonly string[], reason: DeadLetterReason): string[] {
  const kept: string[] = [];
  for (let index = 0; index + 1 < original.length; index += 2) {
    const name = original[index]!;
    if (name === DEAD_CODE_FIELD || name === DEAD_REASON_FIELD || name === DEAD_AT_FIELD) continue;
    kept.push(name, original[index + 1]!);
  }
  return [...kept, DEAD_CODE_FIELD, reason.code, DEAD_REASON_FIELD, reason.message];
}

/** Parses a RESP array of entries ([id, [field, value, ...]]) into `RawEntry`s; entries whose fields are nil (deleted) are left out. */
export function parseEntries(reply: unknown): RawEntry[] {
  if (!Array.isArray(reply)) return [];
  const entries: RawEntry[] = [];
  for (const item of reply as unknown[]) {
    if (!Array.isArray(item)) continue;
    const [id, fields] = item as [unknown, unknown];
    if (typeof id !== 'string' || !Array.isArray(fields)) continue;
    entries.push({ id, fields: fields.map(String) });
  }
  return entries;
}
