// A consumer process for the SIGKILL test: claims one message through RedisInboxStore,
// records that its handler started (a Redis list, as an outside effect would be), prints
// STARTED and then hangs in the handler until the test kills it.
import { RedisInboxStore } from '../../src/index.js';
import { connectRedis } from './redis.js';

const { prefix, messageId, consumer, claimMs, effects } = JSON.parse(process.env['COURIER_REDIS_KILL_WORKER'] ?? '{}') as {
  prefix: string;
  messageId: string;
  consumer: string;
  claimMs: number;
  effects: string;
};
const redis = await connectRedis();
const inbox = new RedisInboxStore({ redis, prefix, claimMs, renewEveryMs: Math.floor(claimMs / 4) });
await inbox.run(messageId, consumer, async () => {
  await redis.rpush(effects, `worker-${process.pid}`);
  process.stdout.write('STARTED\n');
  await new Promise(() => undefined);
});
