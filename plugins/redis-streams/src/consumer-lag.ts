import { TransportError } from '@courier/core';
import type { Redis } from 'ioredis';
import { isServerReply } from './redis-connections.js';
import type { StreamKeys } from './stream-keys.js';

/** Keys per `SCAN` step: a few round trips for a large keyspace, none of them long. */
const SCAN_COUNT = '1000';

/**
 * A consumer group's lag as Redis counts it: the sum of `lag` from `XINFO GROUPS` (Redis 7.0
 * or later) of the group on every topic stream under the prefix (found by `SCAN … TYPE
 * stream`) and on the consumer's own retry stream — entries added to a stream that the group
 * has not been delivered yet. Entries delivered and not acknowledged (the group's pending
 * list) are not in it, nor retry copies waiting in the due set for their time. Null when no
 * stream has a group of that name. Read-only commands: nothing is created, read or moved.
 *
 * Rejects with a `TransportError` when Redis cannot say: a server older than 7.0 (no `lag`
 * field), or a group whose lag Redis reports as nil (entries deleted after the point the
 * group has read up to; Courier deletes only entries already delivered, so this takes an
 * `XDEL` by someone else, and passes once the group has read past it).
 */
export async function readConsumerLag(client: Redis, keys: StreamKeys, consumer: string): Promise<number | null> {
  const streams = new Set<string>();
  let cursor = '0';
  do {
    const [next, found] = (await client.call('SCAN', cursor, 'MATCH', keys.topicPattern(), 'COUNT', SCAN_COUNT, 'TYPE', 'stream')) as [string, string[]];
    for (const key of found) streams.add(key);
    cursor = next;
  } while (cursor !== '0');
  // Every subscription creates its group on the retry stream too (MKSTREAM), so a group that
  // subscribed has a place here even when its topic streams were deleted.
  streams.add(keys.retry(consumer));
  let known = false;
  let total = 0;
  for (const stream of streams) {
    let groups: unknown[][];
    try {
      groups = (await client.call('XINFO', 'GROUPS', stream)) as unknown[][];
    } catch (error) {
      // The retry stream of a consumer that never subscribed, or a stream deleted since the scan.
      if (isServerReply(error) && /no such key/i.test(String((error as Error).message))) continue;
      throw error;
    }
    for (const group of groups) {
      const fields = pairs(group);
      if (fields.get('name') !== consumer) continue;
      known = true;
      if (!fields.has('lag')) {
        throw new TransportError(`redis-streams: consumerLag needs Redis 7.0 or later (XINFO GROUPS of '${stream}' reports no lag for group '${consumer}')`, { retriable: false });
      }
      const lag = fields.get('lag');
      if (typeof lag !== 'number') {
        throw new TransportError(
          `redis-streams: Redis cannot tell the lag of group '${consumer}' on '${stream}' (entries were deleted past where the group has read; it can again once the group reads past them)`,
          { retriable: true },
        );
      }
      total += lag;
    }
  }
  return known ? total : null;
}

/** An `XINFO` reply's flat name/value list as a map. */
function pairs(flat: readonly unknown[]): Map<string, unknown> {
  const map = new Map<string, unknown>();
  for (let index = 0; index + 1 < flat.length; index += 2) map.set(String(flat[index]), flat[index + 1]);
  return map;
}
