// The tests' Redis: the server scripts/services.sh starts (COURIER_REDIS_URL). Every test
// writes under a prefix of its own and deletes it afterwards, so files run in parallel
// against the shared server and leave nothing behind.
import { Redis } from 'ioredis';

/** Address of the Redis 7 server (scripts/services.sh exports it). */
export const redisUrl = process.env['COURIER_REDIS_URL'] ?? 'redis://127.0.0.1:6379';

/**
 * Opens a client and checks the server answers; an unreachable server fails the test
 * loudly with how to start it, never skips it.
 */
export async function connectRedis(): Promise<Redis> {
  const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 2, connectTimeout: 5_000 });
  try {
    await redis.connect();
    await redis.ping();
  } catch (error) {
    redis.disconnect();
    throw new Error(
      `Redis is not reachable at ${redisUrl} (${error instanceof Error ? error.message : String(error)}): start it with \`redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no\` or \`eval "$(bash scripts/services.sh)"\``,
      { cause: error },
    );
  }
  return redis;
}

/** Every key under `prefix` (SCAN, never KEYS on a shared server). */
export async function keysUnder(redis: Redis, prefix: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${escapeGlob(prefix)}*`, 'COUNT', 500);
    found.push(...keys);
    cursor = next;
  } while (cursor !== '0');
  return found.sort();
}

/** Deletes every key under `prefix`. */
export async function deleteUnder(redis: Redis, prefix: string): Promise<void> {
  const keys = await keysUnder(redis, prefix);
  if (keys.length > 0) await redis.unlink(...keys);
}

function escapeGlob(text: string): string {
  return text.replace(/[*?[\]\\]/g, (char) => `\\${char}`);
}
