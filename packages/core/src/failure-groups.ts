/**
 * Failure groups: dead letters that failed the same way, counted together, so an operator
 * facing 4,000 dead letters sees three causes instead of 4,000 rows (what ServicePulse
 * calls failed-message groups). The `courier dead groups` command and any admin page use
 * these functions, so a group has the same id and the same members everywhere.
 */

/** What one dead letter contributes to its group; every field as the operator sees it. */
export interface FailureFacts {
  /** The message type (`envelope.type`). */
  readonly type: string;
  /** The error code (`HANDLER_FAILED`, `PUBLISH_UNROUTABLE`, …); null when none was recorded. */
  readonly code: string | null;
  /** The error text as stored; normalised by {@link normaliseErrorMessage} for grouping. */
  readonly error: string | null;
  /** The consumer that gave up on it; null for a dead outbox row (never published). */
  readonly consumer: string | null;
  /** When it was dead-lettered; null when the place did not record it. */
  readonly at: Date | null;
}

/** Dead letters that share (type, code, normalised error, consumer). */
export interface FailureGroup<T> {
  /**
   * Stable id of the group: the same (type, code, normalised error, consumer) gives the same
   * id in every process and every release that keeps this normalisation, so a script or a
   * runbook can name a group (`courier dead replay --group <id>`). Twelve hex digits.
   */
  readonly id: string;
  readonly type: string;
  readonly code: string | null;
  readonly consumer: string | null;
  /** The normalised error every member shares (ids, numbers, quoted values as placeholders). */
  readonly error: string;
  readonly count: number;
  /** Earliest and latest dead-lettering among the members that recorded one; null when none did. */
  readonly firstSeen: Date | null;
  readonly lastSeen: Date | null;
  /** The members, in the order they were given. */
  readonly members: readonly T[];
}

/** Longest normalised error kept; longer text is cut so a group key stays small. */
const NORMALISED_MAX = 300;

// Order matters: the longer, more specific shapes are replaced before the bare numbers
// inside them would be.
const REPLACEMENTS: readonly (readonly [RegExp, string])[] = [
  // Quoted values: a key, a name, an id someone put in quotes. The quote kind is kept.
  [/"(?:[^"\\\n]|\\.)*"/g, '"<value>"'],
  [/'(?:[^'\\\n]|\\.)*'/g, "'<value>'"],
  [/`[^`\n]*`/g, '`<value>`'],
  // ISO-8601 timestamps and dates.
  [/\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?/g, '<time>'],
  // UUIDs (any version) and ULIDs.
  [/\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/gi, '<id>'],
  [/\b(?=[0-9A-HJKMNP-TV-Z]*\d)[0-9A-HJKMNP-TV-Z]{26}\b/g, '<id>'],
  // Hex runs of 8+ with at least one digit (hashes, object ids, trace ids): a word like
  // "deadbeef" alone stays a word.
  [/\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b/gi, '<id>'],
  // IPv4 addresses with an optional port.
  [/\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b/g, '<address>'],
  // Numbers, also inside identifiers such as order-42 or user42 (the digits vary, the shape does not).
  [/\d+(?:\.\d+)?/g, '<n>'],
];

/**
 * Normalises an error text for grouping: quoted values, timestamps, UUIDs/ULIDs, long hex
 * ids, IP addresses and numbers become placeholders (`'<value>'`, `<time>`, `<id>`,
 * `<address>`, `<n>`), whitespace is collapsed, and the result is cut at 300 characters.
 *
 * Guarantees: deterministic and pure (the same text always gives the same result, in every
 * process); two texts that differ only in such values give the same result; the result of
 * a normalised text is itself (idempotent). `null` or empty gives `''`.
 */
export function normaliseErrorMessage(error: string | null | undefined): string {
  if (!error) return '';
  let text = error.replace(/\s+/g, ' ').trim();
  for (const [pattern, placeholder] of REPLACEMENTS) text = text.replace(pattern, placeholder);
  return text.length > NORMALISED_MAX ? `${text.slice(0, NORMALISED_MAX - 1)}…` : text;
}

/**
 * The id of the group of (type, code, normalised error, consumer): 64-bit FNV-1a over the
 * four fields' UTF-8 bytes, cut to twelve hex digits. `error` must already be normalised.
 * Not a security hash: it only has to be stable and spread well over a few thousand groups.
 */
export function failureGroupId(type: string, code: string | null, error: string, consumer: string | null): string {
  const bytes = new TextEncoder().encode([type, code ?? '', error, consumer ?? ''].join('\u0000'));
  let hash = 0xcbf29ce484222325n;
  for (const byte of bytes) {
    hash ^= BigInt(byte);
    hash = (hash * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return hash.toString(16).padStart(16, '0').slice(0, 12);
}

/**
 * Groups dead letters by (type, code, normalised error, consumer), with a count and the
 * first and last time a member was dead-lettered.
 *
 * Guarantees: every item is in exactly one group; groups come largest first, then the most
 * recently seen first, then by id, so the order is stable for the same input; a group's
 * `id` depends only on its four key fields ({@link failureGroupId}).
 */
export function groupFailures<T>(items: readonly T[], factsOf: (item: T) => FailureFacts): FailureGroup<T>[] {
  const groups = new Map<string, { id: string; type: string; code: string | null; consumer: string | null; error: string; members: T[]; first: number; last: number }>();
  for (const item of items) {
    const facts = factsOf(item);
    const error = normaliseErrorMessage(facts.error);
    const id = failureGroupId(facts.type, facts.code, error, facts.consumer);
    let group = groups.get(id);
    if (!group) groups.set(id, (group = { id, type: facts.type, code: facts.code, consumer: facts.consumer, error, members: [], first: Infinity, last: -Infinity }));
    group.members.push(item);
    const at = facts.at?.getTime();
    if (at !== undefined && !Number.isNaN(at)) {
      group.first = Math.min(group.first, at);
      group.last = Math.max(group.last, at);
    }
  }
  return [...groups.values()]
    .map(
      (group): FailureGroup<T> => ({
        id: group.id,
        type: group.type,
        code: group.code,
        consumer: group.consumer,
        error: group.error,
        count: group.members.length,
        firstSeen: Number.isFinite(group.first) ? new Date(group.first) : null,
        lastSeen: Number.isFinite(group.last) ? new Date(group.last) : null,
        members: group.members,
      }),
    )
    .sort((a, b) => b.count - a.count || (b.lastSeen?.getTime() ?? 0) - (a.lastSeen?.getTime() ?? 0) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
