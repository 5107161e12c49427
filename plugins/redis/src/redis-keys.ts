import { createHash } from 'node:crypto';

/** Longest messageId or consumer name (UTF-8 bytes) kept readable in a key; longer ones are hashed. */
export const RAW_PART_BYTES = 80;

/**
 * One part of a key: the text itself (`=` + text) when short, else `#` + its SHA-256
 * (base64url, 43 characters; `%` for text with lone surrogates, hashed from UTF-16). The marker keeps the two forms apart, so a short id that
 * looks like a hash never meets a hashed one; the hash bounds every key's length whatever
 * the id's. Exact bytes: no trimming, case folding or Unicode normalisation, so ids that
 * differ only in those are different keys.
 */
export function keyPart(text: string): string {
  // UTF-8 would turn a lone surrogate into U+FFFD, making two ids one key: such text is
  // hashed from its UTF-16 code units instead, under a marker of its own.
  if (LONE_SURROGATE.test(text)) return `%${createHash('sha256').update(text, 'utf16le').digest('base64url')}`;
  if (Buffer.byteLength(text, 'utf8') <= RAW_PART_BYTES) return `=${text}`;
  return `#${createHash('sha256').update(text, 'utf8').digest('base64url')}`;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** The keys one store uses under its prefix. */
export class RedisInboxKeys {
  readonly #prefix: string;

  constructor(prefix: string) {
    this.#prefix = prefix;
  }

  /** Set of the consumer names (suffixes included) that have an index. */
  get consumers(): string {
    return `${this.#prefix}consumers`;
  }

  /**
   * The claim, then completion record, of (consumer, messageId). The consumer part is
   * length-prefixed so that a ':' inside a consumer name cannot make two pairs one key.
   */
  record(consumer: string, messageId: string): string {
    const name = keyPart(consumer);
    return `${this.#prefix}r:${name.length}:${name}:${keyPart(messageId)}`;
  }

  /** Handler starts counted by `recordStart` for (consumer, messageId). */
  starts(consumer: string, messageId: string): string {
    const name = keyPart(consumer);
    return `${this.#prefix}s:${name.length}:${name}:${keyPart(messageId)}`;
  }

  /** Sorted set of one consumer name's completion records, scored by completion time (Redis clock, ms). */
  index(consumer: string): string {
    return `${this.#prefix}i:${keyPart(consumer)}`;
  }
}
