// The courier.config.ts an operator writes for a service whose inbox is on Redis: the CLI
// finds `stats()` on the store and shows its consumers in `courier stats`.
import { defineCourierConfig } from '@courier/cli';
import { RedisInboxStore } from '../../src/index.js';
import { connectRedis } from './redis.js';

export default defineCourierConfig(async () => {
  const redis = await connectRedis();
  return {
    inbox: new RedisInboxStore({ redis, prefix: process.env['COURIER_REDIS_STATS_PREFIX'] ?? 'courier:inbox:' }),
    close: async () => void redis.disconnect(),
  };
});
