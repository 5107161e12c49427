// The kit's inbox-store cases against RedisInboxStore. The handler's unit of work is the
// in-memory database's transaction (the reference store's, standing in for an
// application's SQL database): effects and outbox rows commit in it, and the Redis record
// is written after it commits, as in production with `unitOfWork`. Halt cases skip, saying
// why: the store has no InboxHalts.
import type { InMemoryTransaction } from '@courier/core';
import { createInMemoryStoreFixture, describeInboxStore } from '@courier/conformance';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll } from 'vitest';
import { RedisInboxStore } from '../src/index.js';
import { connectRedis, deleteUnder } from './support/redis.js';

let redis: Redis;
beforeAll(async () => {
  redis = await connectRedis();
});
afterAll(() => redis.disconnect());

describeInboxStore<InMemoryTransaction>('redis', async (context) => {
  const base = await createInMemoryStoreFixture(context);
  const prefix = `courier-test:${context.testId}:`;
  const inbox = new RedisInboxStore<InMemoryTransaction>({ redis, prefix, unitOfWork: (work) => base.transaction(work) });
  return {
    ...base,
    inbox,
    close: async () => {
      await inbox.close();
      await base.close();
      await deleteUnder(redis, prefix);
    },
  };
});
