import { boundReason, type DeadLetter, type TransportDeadLetters } from '@courier/core';
import { DEAD_AT_FIELD, DEAD_CODE_FIELD, DEAD_REASON_FIELD, decodeEntry, fieldMap, parseEntries } from './stream-codec.js';
import type { RedisConnections } from './redis-connections.js';
import type { StreamKeys } from './stream-keys.js';
import { REPLAY_SCRIPT } from './stream-scripts.js';

/** A stream entry id (`<ms>-<seq>`): the only ids a dead letter can have. */
const ENTRY_ID = /^\d+-\d+$/;

/**
 * Dead letters of a consumer, kept in its dead-letter stream (`<prefix>:dead:<consumer>`).
 *
 * Guarantees: `list` reads with `XRANGE` (it creates nothing and hides nothing from another
 * reader); an entry that never was a valid envelope (`ENVELOPE_INVALID`) is left out of the
 * list, since it has no envelope to show (operators read it with `XRANGE`). `replay` copies
 * the envelope into the consumer's retry stream with attempt 1 and the replay mark and
 * deletes the dead entry in one script; `purge` deletes entries. Both count what they did.
 */
export class RedisStreamsDeadLetters implements TransportDeadLetters {
  readonly #connections: RedisConnections;
  readonly #keys: StreamKeys;
  readonly #checkOpen: () => void;

  constructor(connections: RedisConnections, keys: StreamKeys, checkOpen: () => void) {
    this.#connections = connections;
    this.#keys = keys;
    this.#checkOpen = checkOpen;
  }

  async list(consumer: string, options: { limit?: number } = {}): Promise<readonly DeadLetter[]> {
    this.#checkOpen();
    const client = await this.#connections.commands();
    const limit = options.limit ?? 1_000;
    const letters: DeadLetter[] = [];
    let start = '-';
    // Invalid entries are skipped, so read in pages until `limit` valid ones or the end.
    while (letters.length < limit) {
      const page = parseEntries(await client.call('XRANGE', this.#keys.dead(consumer), start, '+', 'COUNT', String(Math.max(limit, 100))));
      for (const entry of page) {
        const letter = toDeadLetter(consumer, entry.id, entry.fields);
        if (letter) letters.push(letter);
        if (letters.length >= limit) break;
      }
      if (page.length < Math.max(limit, 100)) break;
      start = `(${page[page.length - 1]!.id}`;
    }
    return letters;
  }

  async replay(consumer: string, ids: readonly string[]): Promise<number> {
    this.#checkOpen();
    const client = await this.#connections.commands();
    let count = 0;
    for (const id of new Set(ids)) {
      if (!ENTRY_ID.test(id)) continue;
      count += Number(await client.eval(REPLAY_SCRIPT, 2, this.#keys.dead(consumer), this.#keys.retry(consumer), id));
    }
    return count;
  }

  async purge(consumer: string, ids: readonly string[]): Promise<number> {
    this.#checkOpen();
    const valid = [...new Set(ids)].filter((id) => ENTRY_ID.test(id));
    if (valid.length === 0) return 0;
    const client = await this.#connections.commands();
    return Number(await client.call('XDEL', this.#keys.dead(consumer), ...valid));
  }
}

function toDeadLetter(consumer: string, id: string, fields: readonly string[]): DeadLetter | undefined {
  let decoded;
  try {
    decoded = decodeEntry(fields);
  } catch {
    return undefined;
  }
  const map = fieldMap(fields);
  const deadAt = Number(map.get(DEAD_AT_FIELD));
  return {
    id,
    consumer,
    envelope: decoded.envelope,
    attempt: decoded.attempt,
    reason: boundReason({ code: map.get(DEAD_CODE_FIELD) ?? '', message: map.get(DEAD_REASON_FIELD) ?? '' }),
    deadAt: new Date(Number.isFinite(deadAt) ? deadAt : Number(id.split('-')[0])),
  };
}
