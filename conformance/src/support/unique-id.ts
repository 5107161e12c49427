import { randomBytes } from 'node:crypto';

/**
 * Returns a fresh test id: `t` followed by 12 lowercase hex digits.
 *
 * Guarantees: safe as (part of) a table, schema, queue, topic or consumer name on every
 * supported store and broker; collisions are as unlikely as 48 random bits allow.
 */
export function uniqueId(): string {
  return `t${randomBytes(6).toString('hex')}`;
}
