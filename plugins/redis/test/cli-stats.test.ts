// `courier stats` on a Redis inbox: the CLI reads the store's stats() through a
// courier.config.ts and shows each consumer's records, dead-letter marks and replays.
import { fileURLToPath } from 'node:url';
import { runCli } from '@courier/cli';
import { uniqueId } from '@courier/conformance';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisInboxStore } from '../src/index.js';
import { connectRedis, deleteUnder } from './support/redis.js';

let redis: Redis;
const prefix = `courier-test:${uniqueId()}:`;
beforeAll(async () => {
  redis = await connectRedis();
});
afterAll(async () => {
  await deleteUnder(redis, prefix);
  redis.disconnect();
});

async function courier(args: readonly string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const saved = process.env['COURIER_REDIS_STATS_PREFIX'];
  process.env['COURIER_REDIS_STATS_PREFIX'] = prefix;
  try {
    const config = fileURLToPath(new URL('./support/courier.config.ts', import.meta.url));
    const code = await runCli([...args, '--config', config], { out: (text) => out.push(text), err: (text) => err.push(text), interactive: false, cwd: process.cwd() });
    return { code, out: out.join('\n'), err: err.join('\n') };
  } finally {
    if (saved === undefined) delete process.env['COURIER_REDIS_STATS_PREFIX'];
    else process.env['COURIER_REDIS_STATS_PREFIX'] = saved;
  }
}

describe('courier stats with RedisInboxStore', () => {
  it('shows per consumer its records, the oldest record\'s age, dead letters and replays', async () => {
    const empty = await courier(['stats', '--json']);
    expect(empty.code, empty.err).toBe(0);
    expect(JSON.parse(empty.out)).toMatchObject({ inbox: { consumers: [] } });

    const inbox = new RedisInboxStore({ redis, prefix });
    const dead = uniqueId();
    for (const id of [uniqueId(), uniqueId()]) await inbox.run(id, 'payments', async () => undefined);
    await inbox.run(dead, 'payments~dead', async () => undefined);
    await inbox.run(dead, 'payments~rerun', async () => undefined);
    await inbox.run(uniqueId(), 'emails', async () => undefined);
    await inbox.close();

    const json = await courier(['stats', '--json']);
    expect(json.code, json.err).toBe(0);
    const { inbox: stats } = JSON.parse(json.out) as { inbox: { consumers: { consumer: string; oldestRecordAgeMs: number }[] } };
    expect(stats.consumers).toMatchObject([
      { consumer: 'emails', records: 1, deadLetters: 0, replayed: 0 },
      { consumer: 'payments', records: 3, deadLetters: 1, replayed: 1 },
    ]);
    for (const row of stats.consumers) expect(row.oldestRecordAgeMs).toBeGreaterThanOrEqual(0);

    const text = await courier(['stats']);
    expect(text.code, text.err).toBe(0);
    expect(text.out).toMatch(/CONSUMER\s+RECORDS\s+OLDEST\s+DEAD LETTERS\s+REPLAYED/);
    expect(text.out).toMatch(/payments\s+3\s+\S+\s+1\s+1/);
  });
});
