import type { DeadLetterReason } from './transport.js';

/**
 * Upper bounds of the text the core hands to a transport's `Delivery.deadLetter` /
 * `Delivery.retry` (a {@link DeadLetterReason}) and to an inbox store's halt methods (the
 * `error` of `halt`, `rehalt`, `settleHead`), in UTF-8 bytes.
 *
 * Why a bound at all: the text is a handler's error message, whatever it quotes (a whole
 * payload, a stack, a driver's statement), and it lands in a broker header (AMQP headers
 * travel in one frame, Kafka and NATS headers count against the message size) or a
 * database column (`TEXT` holds 64 KiB on MariaDB). The bounds are small enough for every
 * transport and store Courier has, and large enough for any message worth reading.
 *
 * Guarantees: {@link boundReason} and {@link boundReasonText} never return more than these
 * many bytes; text within them (and free of the characters {@link sanitizeText} replaces)
 * is passed on unchanged, so a port that stores up to these limits round-trips it.
 */
export const REASON_LIMITS = {
  /** Most UTF-8 bytes of a reason's `code`. */
  codeBytes: 200,
  /** Most UTF-8 bytes of a reason's `message`, and of a halt's `error` text. */
  messageBytes: 4096,
} as const;

// U+0000 (PostgreSQL `text` cannot hold it) and UTF-16 surrogates that are not part of a
// pair (no UTF-8 encoding exists; drivers write U+FFFD or refuse). One pass finds both.
// eslint-disable-next-line no-control-regex -- U+0000 is exactly what it looks for
const UNSTORABLE = /\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** True when `text` holds a character no supported database can store: U+0000 or a lone UTF-16 surrogate. */
export function hasUnstorableText(text: string): boolean {
  UNSTORABLE.lastIndex = 0;
  return UNSTORABLE.test(text);
}

/**
 * Names the first character of `text` that no supported database can store (U+0000 or a
 * lone surrogate) with its position, or returns undefined when there is none.
 */
export function unstorableCharacter(text: string): string | undefined {
  UNSTORABLE.lastIndex = 0;
  const match = UNSTORABLE.exec(text);
  if (match === null) return undefined;
  const unit = match[0].charCodeAt(0);
  const name = unit === 0 ? 'U+0000 (NUL)' : `a lone surrogate U+${unit.toString(16).toUpperCase()}`;
  return `${name} at index ${match.index}`;
}

/**
 * Returns `text` with every U+0000 and every lone UTF-16 surrogate replaced by U+FFFD (the
 * replacement character), so that PostgreSQL `text`, MariaDB `utf8mb4` and every wire
 * format can hold it. Other characters, and `text` without those, are returned unchanged.
 */
export function sanitizeText(text: string): string {
  if (!hasUnstorableText(text)) return text;
  return text.replace(UNSTORABLE, '\uFFFD');
}

/**
 * Sanitises `text` ({@link sanitizeText}) and cuts it to at most `maxBytes` UTF-8 bytes.
 *
 * Guarantees: the result is at most `maxBytes` bytes and is returned unchanged when the
 * sanitised text fits. A cut never splits a character (or a surrogate pair) and ends with
 * a marker saying it was cut and how long the text was (` … [cut: 102400 bytes]`); when
 * `maxBytes` is too small for the marker, the text is cut without one. Idempotent: a result
 * given again comes back as it is.
 */
export function boundText(text: string, maxBytes: number): string {
  const clean = sanitizeText(text);
  // A UTF-16 code unit is at most 3 UTF-8 bytes: short texts need no count.
  if (clean.length * 3 <= maxBytes) return clean;
  const bytes = Buffer.byteLength(clean, 'utf8');
  if (bytes <= maxBytes) return clean;
  const marker = ` … [cut: ${bytes} bytes]`;
  const markerBytes = Buffer.byteLength(marker, 'utf8');
  const withMarker = markerBytes < maxBytes;
  return cutUtf8(clean, withMarker ? maxBytes - markerBytes : maxBytes) + (withMarker ? marker : '');
}

/** The longest prefix of `text` (whole code points) that fits `maxBytes` UTF-8 bytes. */
function cutUtf8(text: string, maxBytes: number): string {
  let used = 0;
  let end = 0;
  for (const char of text) {
    const cp = char.codePointAt(0)!;
    const size = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (used + size > maxBytes) break;
    used += size;
    end += char.length;
  }
  return text.slice(0, end);
}

/**
 * The error text of a halt (`InboxHalts.halt` / `rehalt` / `settleHead`), bounded to
 * {@link REASON_LIMITS}`.messageBytes` and sanitised ({@link boundText}). The core applies
 * it to every halt error it passes; a store may apply it again at its storage boundary.
 */
export function boundReasonText(text: string): string {
  return boundText(text, REASON_LIMITS.messageBytes);
}

/**
 * `reason` with its `code` and `message` bounded to {@link REASON_LIMITS} and sanitised
 * ({@link boundText}): what the core hands to `Delivery.deadLetter` and `Delivery.retry`.
 * Returns `reason` itself when both already fit.
 */
export function boundReason(reason: DeadLetterReason): DeadLetterReason {
  const code = boundText(reason.code, REASON_LIMITS.codeBytes);
  const message = boundText(reason.message, REASON_LIMITS.messageBytes);
  return code === reason.code && message === reason.message ? reason : { code, message };
}
