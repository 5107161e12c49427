import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, StorageError } from '@courier/core';
import { deferred, eventually, uniqueId } from '@courier/conformance';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisInboxStore, type RedisInboxStoreConfig, type RedisInboxUnit } from '../src/index.js';
import { connectRedis, deleteUnder, keysUnder } from './support/redis.js';

let redis: Redis;
const prefixes: string[] = [];

beforeAll(async () => {
  redis = await connectRedis();
});

afterAll(async () => {
  for (const prefix of prefixes) await deleteUnder(redis, prefix);
  redis.disconnect();
});

function store(config: Partial<RedisInboxStoreConfig<RedisInboxUnit>> = {}): { inbox: RedisInboxStore; prefix: string } {
  const prefix = config.prefix ?? `courier-test:${uniqueId()}:`;
  prefixes.push(prefix);
  return { inbox: new RedisInboxStore({ redis, ...config, prefix }), prefix };
}

describe('RedisInboxStore: claim and complete', () => {
  it('runs work with its unit once, then reports duplicates without running', async () => {
    const { inbox } = store();
    const id = uniqueId();
    const units: RedisInboxUnit[] = [];
    expect(await inbox.run(id, 'payments', async (unit) => (units.push(unit), 'paid'))).toEqual({ duplicate: false, value: 'paid' });
    expect(units.map(({ messageId, consumer, signal }) => ({ messageId, consumer, aborted: signal.aborted }))).toEqual([{ messageId: id, consumer: 'payments', aborted: false }]);
    let ran = false;
    expect(await inbox.run(id, 'payments', async () => void (ran = true))).toEqual({ duplicate: true });
    expect(ran).toBe(false);
  });

  it('concurrent duplicates: N parallel deliveries of one id run the work once, never two at once', async () => {
    const { inbox } = store();
    const id = uniqueId();
    let active = 0;
    let most = 0;
    let runs = 0;
    const results = await Promise.all(
      Array.from({ length: 16 }, (_, index) =>
        inbox.run(id, 'payments', async () => {
          active += 1;
          most = Math.max(most, active);
          runs += 1;
          await sleep(50);
          active -= 1;
          return index;
        }),
      ),
    );
    expect(runs).toBe(1);
    expect(most).toBe(1);
    expect(results.filter((result) => !result.duplicate)).toHaveLength(1);
    expect(results.filter((result) => result.duplicate)).toHaveLength(15);
  });

  it('a duplicate arriving while the first runs waits for it, then is a duplicate; after a failure it runs', async () => {
    const { inbox } = store({ pollMs: 20 });
    const id = uniqueId();
    const started = deferred();
    const gate = deferred();
    const first = inbox.run(id, 'payments', async () => {
      started.resolve();
      await gate.promise;
      return 'first';
    });
    await started.promise;
    let secondDone = false;
    let secondRan = false;
    const second = inbox.run(id, 'payments', async () => void (secondRan = true)).finally(() => (secondDone = true));
    await sleep(200);
    expect(secondDone).toBe(false);
    gate.resolve();
    expect(await first).toEqual({ duplicate: false, value: 'first' });
    expect(await second).toEqual({ duplicate: true });
    expect(secondRan).toBe(false);

    // A failing first run releases its claim: the waiting one runs at once (no claim expiry to wait out).
    const other = uniqueId();
    const failing = deferred();
    const failed = inbox.run(other, 'payments', async () => {
      await failing.promise;
      throw new Error('provider down');
    });
    const waiting = inbox.run(other, 'payments', async () => 'second');
    await sleep(50);
    failing.resolve();
    await expect(failed).rejects.toThrow('provider down');
    expect(await waiting).toEqual({ duplicate: false, value: 'second' });
  });

  it('a long run keeps its claim by renewing it past claimMs; no duplicate runs meanwhile', async () => {
    const { inbox } = store({ claimMs: 1_000, renewEveryMs: 200 });
    const id = uniqueId();
    const started = deferred();
    const first = inbox.run(id, 'payments', async (unit) => {
      started.resolve();
      await sleep(2_500);
      return unit.signal.aborted;
    });
    await started.promise;
    let secondRan = false;
    const second = inbox.run(id, 'payments', async () => void (secondRan = true));
    expect(await first).toEqual({ duplicate: false, value: false });
    expect(await second).toEqual({ duplicate: true });
    expect(secondRan).toBe(false);
  });

  it('a crashed claimant\'s claim expires and a redelivery runs', async () => {
    const { inbox, prefix } = store({ claimMs: 1_000 });
    const id = uniqueId();
    // What a claimant that died mid-handler leaves: its claim, expiring after claimMs.
    const probe = await inbox.recordStart(id, 'payments');
    expect(probe).toBe(1);
    const record = (await keysUnder(redis, prefix)).find((key) => key.includes(':s:'))!.replace(':s:', ':r:');
    await redis.set(record, 'c:dead-claimant', 'PX', 1_000);
    const asked = Date.now();
    expect(await inbox.run(id, 'payments', async () => 'redelivered')).toEqual({ duplicate: false, value: 'redelivered' });
    expect(Date.now() - asked).toBeGreaterThanOrEqual(800);
  });

  it('fencing: a run whose claim another took cannot complete, and its work sees the loss on its signal', async () => {
    const { inbox, prefix } = store({ claimMs: 1_000, renewEveryMs: 100 });
    const id = uniqueId();
    const started = deferred();
    const run = inbox.run(id, 'payments', async (unit) => {
      started.resolve();
      await eventually(() => expect(unit.signal.aborted).toBe(true), { timeoutMs: 5_000 });
      return 'late';
    });
    await started.promise;
    const [record] = await keysUnder(redis, `${prefix}r:`);
    // Another claimant took over (as after an expiry): the first must not record.
    await redis.set(record!, 'c:other-claimant', 'PX', 10_000);
    const error = await run.then(() => undefined, (caught: unknown) => caught);
    expect(error).toBeInstanceOf(StorageError);
    expect(String(error)).toContain('another run holds it now');
    expect(await redis.get(record!)).toBe('c:other-claimant');
  });
});

describe('RedisInboxStore: retention and keys', () => {
  it('completed records expire after the retention window, and then the message runs again', async () => {
    const { inbox, prefix } = store({ claimMs: 1_000, retentionMs: 1_500 });
    const id = uniqueId();
    await inbox.run(id, 'payments', async () => undefined);
    const [record] = await keysUnder(redis, `${prefix}r:`);
    const ttl = await redis.pttl(record!);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(1_500);
    expect(await inbox.run(id, 'payments', async () => 'again')).toEqual({ duplicate: true });
    await eventually(async () => expect(await redis.exists(record!)).toBe(0), { timeoutMs: 5_000, intervalMs: 100 });
    expect(await inbox.run(id, 'payments', async () => 'again')).toEqual({ duplicate: false, value: 'again' });
    expect((await inbox.stats()).consumers).toEqual([expect.objectContaining({ consumer: 'payments', records: 1 })]);
  });

  it('keys live under the prefix, long ids are hashed so keys stay bounded, and ":" in names cannot merge pairs', async () => {
    const { inbox, prefix } = store();
    const long = 'x'.repeat(10_000);
    await inbox.run(long, 'c'.repeat(300), async () => undefined);
    await inbox.run('b:c', 'a', async () => undefined);
    expect(await inbox.run('c', 'a:b', async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
    expect(await inbox.run(long, 'c'.repeat(300), async () => 'again')).toEqual({ duplicate: true });
    expect(await inbox.run(`${long}y`, 'c'.repeat(300), async () => 'other')).toEqual({ duplicate: false, value: 'other' });
    const keys = await keysUnder(redis, prefix);
    expect(keys.length).toBeGreaterThan(0);
    for (const key of keys) {
      expect(key.startsWith(prefix)).toBe(true);
      expect(Buffer.byteLength(key) - Buffer.byteLength(prefix)).toBeLessThanOrEqual(180);
    }
  });

  it('prune deletes old records of every consumer in batches, keeps newer ones, and drops a consumer left with none', async () => {
    const { inbox, prefix } = store();
    const old = [uniqueId(), uniqueId(), uniqueId()];
    for (const id of old) await inbox.run(id, 'payments', async () => undefined);
    await inbox.run(old[0]!, 'emails', async () => undefined);
    await sleep(300);
    const fresh = uniqueId();
    await inbox.run(fresh, 'payments', async () => undefined);
    expect(await inbox.prune(200, { batchSize: 1 })).toBe(4);
    expect(await inbox.run(old[1]!, 'payments', async () => 'again')).toEqual({ duplicate: false, value: 'again' });
    expect(await inbox.run(fresh, 'payments', async () => 'again')).toEqual({ duplicate: true });
    expect((await inbox.stats()).consumers.map(({ consumer, records }) => [consumer, records])).toEqual([['payments', 2]]);
    expect(await redis.smembers(`${prefix}consumers`)).toEqual(['payments']);
    await expect(inbox.prune(-1)).rejects.toThrow(ConfigError);
    await expect(inbox.prune(0, { batchSize: 0 })).rejects.toThrow("'batchSize' must be a positive integer");
  });

  it('refuses bad configuration with every problem named', () => {
    const attempt = () => new RedisInboxStore({ redis: {} as Redis, prefix: '', claimMs: 10, renewEveryMs: 50, retentionMs: 5, pollMs: 0 });
    expect(attempt).toThrow(ConfigError);
    try {
      attempt();
    } catch (error) {
      const { problems } = error as ConfigError;
      expect(problems.map((problem) => problem.match(/'(\w+)'/)?.[1])).toEqual(['redis', 'prefix', 'claimMs', 'renewEveryMs', 'retentionMs', 'pollMs']);
    }
  });

  it('an unreachable Redis fails the run with a retriable StorageError before work is called (the consumer pauses, no attempt)', async () => {
    const down = new Redis('redis://127.0.0.1:1', { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => null });
    const inbox = new RedisInboxStore({ redis: down, prefix: `courier-test:${uniqueId()}:` });
    let ran = false;
    const error = await inbox.run(uniqueId(), 'payments', async () => void (ran = true)).then(() => undefined, (caught: unknown) => caught);
    expect(error).toBeInstanceOf(StorageError);
    expect((error as StorageError).retriable).toBe(true);
    expect(ran).toBe(false);
    await expect(inbox.recordStart(uniqueId(), 'payments')).rejects.toMatchObject({ name: 'StorageError', retriable: true });
    down.disconnect();
  });

  it('close waits for runs in progress and refuses later calls', async () => {
    const { inbox } = store();
    const gate = deferred();
    const run = inbox.run(uniqueId(), 'payments', async () => (await gate.promise, 'done'));
    let closed = false;
    const closing = inbox.close().then(() => (closed = true));
    await sleep(50);
    expect(closed).toBe(false);
    gate.resolve();
    await closing;
    expect(await run).toEqual({ duplicate: false, value: 'done' });
    await expect(inbox.run(uniqueId(), 'payments', async () => undefined)).rejects.toThrow("'RedisInboxStore.run' is closed");
    await inbox.close();
  });
});
