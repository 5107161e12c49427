import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';

/** The subset of an ioredis client the store uses (the user's client, never one of its own). */
export type RedisInboxClient = Pick<Redis, 'eval' | 'evalsha' | 'smembers'>;

/**
 * A Lua script run atomically by Redis: EVALSHA, falling back to EVAL when the server does
 * not have it cached (NOSCRIPT after a restart or SCRIPT FLUSH). Unlike ioredis's
 * `defineCommand`, it adds nothing to the caller's client object.
 */
export class LuaScript {
  readonly #source: string;
  readonly #sha: string;
  readonly #keys: number;

  constructor(keys: number, source: string) {
    this.#keys = keys;
    this.#source = source;
    this.#sha = createHash('sha1').update(source).digest('hex');
  }

  async run(client: RedisInboxClient, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    if (keys.length !== this.#keys) throw new Error(`script takes ${this.#keys} keys, got ${keys.length}`);
    try {
      return await client.evalsha(this.#sha, this.#keys, ...keys, ...args);
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith('NOSCRIPT')) throw error;
      return client.eval(this.#source, this.#keys, ...keys, ...args);
    }
  }
}

// Values of a record key: `c:<token>` while claimed (PX = claim length), `d:<ms>` once
// completed (PX = retention), ms being the Redis clock at completion.
const NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

/** KEYS record; ARGV token, claimMs → {'claimed'|'done'|'busy', pttl}. */
export const CLAIM = new LuaScript(
  1,
  `local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'c:' .. ARGV[1], 'PX', ARGV[2])
  return {'claimed', 0}
end
if string.sub(v, 1, 2) == 'd:' then return {'done', 0} end
return {'busy', redis.call('PTTL', KEYS[1])}`,
);

/** KEYS record; ARGV token, claimMs → 1 when the claim was still the token's and is extended, else 0. */
export const RENEW = new LuaScript(
  1,
  `if redis.call('GET', KEYS[1]) == 'c:' .. ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`,
);

/** KEYS record; ARGV token → 1 when the token's claim was deleted (a failed run lets the next one in at once). */
export const RELEASE = new LuaScript(
  1,
  `if redis.call('GET', KEYS[1]) == 'c:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`,
);

/**
 * KEYS record, index, consumers, starts; ARGV token, retentionMs, consumer name →
 * 'completed' | 'done' (someone else completed it) | 'taken' (another claimant holds it).
 * Fenced: a claimant whose claim another took cannot complete; one whose claim merely ran
 * out with no one else claiming still records (its work did run).
 */
export const COMPLETE = new LuaScript(
  4,
  `local v = redis.call('GET', KEYS[1])
if v and v ~= 'c:' .. ARGV[1] then
  if string.sub(v, 1, 2) == 'd:' then return 'done' end
  return 'taken'
end
${NOW}
local retention = tonumber(ARGV[2])
redis.call('SET', KEYS[1], 'd:' .. now, 'PX', retention)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - retention))
redis.call('PEXPIRE', KEYS[2], retention)
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('DEL', KEYS[4])
return 'completed'`,
);

/** KEYS starts; ARGV retentionMs → the count after this start. */
export const RECORD_START = new LuaScript(
  1,
  `local count = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return count`,
);

/** KEYS record, index, starts → 1 when a completion record was deleted (a claim in progress is left alone). */
export const FORGET = new LuaScript(
  3,
  `redis.call('DEL', KEYS[3])
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 2) == 'd:' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  return 1
end
return 0`,
);

/**
 * KEYS index, consumers; ARGV olderThanMs, batchSize, consumer name → {deleted, examined}.
 * Deletes up to a batch of records completed at or before the cutoff (Redis clock), drops
 * their index entries (and entries whose record already expired), and the consumer's name
 * once its index is empty — atomically with respect to COMPLETE, which adds both again.
 */
export const PRUNE = new LuaScript(
  2,
  `${NOW}
local cutoff = now - tonumber(ARGV[1])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
local deleted = 0
for _, key in ipairs(members) do
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, 2) == 'd:' and tonumber(string.sub(v, 3)) <= cutoff then
    deleted = deleted + redis.call('DEL', key)
  end
  redis.call('ZREM', KEYS[1], key)
end
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[3]) end
return {deleted, #members}`,
);

/**
 * KEYS index; ARGV retentionMs → {records, ageOfOldestMs}. Drops index entries older than
 * the retention first (their records have expired), so the count is of live records.
 */
export const COUNT = new LuaScript(
  1,
  `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])))
local records = redis.call('ZCARD', KEYS[1])
if records == 0 then return {0, 0} end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {records, now - tonumber(oldest[2])}`,
);
