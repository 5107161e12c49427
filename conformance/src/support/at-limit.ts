import type { LengthLimit } from '@courier/core';

/**
 * The longest string that fits both `limit` (a port's declared limit) and `maxUnits`
 * UTF-16 code units (the core's own bound), ending in `tail` (ASCII).
 *
 * The rest is `fill` (one code unit; multibyte by default): under a character bound it
 * is all `fill`, so a port that counts bytes where it declared characters is caught;
 * under a byte bound it is as many `fill` as fit, topped up with ASCII `a` to reach the
 * byte bound exactly.
 */
export function atLimit(limit: LengthLimit | undefined, maxUnits: number, tail = '', fill = 'é'): string {
  const chars = Math.min(maxUnits, limit?.chars ?? Number.POSITIVE_INFINITY) - tail.length;
  if (limit?.bytes === undefined) return fill.repeat(chars) + tail;
  const bytes = limit.bytes - tail.length;
  const fills = Math.min(chars, Math.floor(bytes / Buffer.byteLength(fill, 'utf8')));
  const ascii = Math.min(chars - fills, bytes - fills * Buffer.byteLength(fill, 'utf8'));
  return fill.repeat(fills) + 'a'.repeat(ascii) + tail;
}

/** `limit` with its byte bound lowered to `bytes` (the core's byte limit) where that is tighter. */
export function tighter(limit: LengthLimit | undefined, bytes: number): LengthLimit {
  return { ...limit, bytes: Math.min(limit?.bytes ?? bytes, bytes) };
}
