// A consumer process SIGKILLed mid-handler: while it lives its claim is renewed past
// claimMs and a redelivery waits; once it is killed the claim expires and the redelivery
// runs the handler exactly once more; later copies are duplicates.
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { uniqueId } from '@courier/conformance';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisInboxStore } from '../src/index.js';
import { connectRedis, deleteUnder } from './support/redis.js';

const CLAIM_MS = 1_000;
let redis: Redis;
const prefix = `courier-test:${uniqueId()}:`;
const children: ChildProcess[] = [];

beforeAll(async () => {
  redis = await connectRedis();
});
afterAll(async () => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await deleteUnder(redis, prefix);
  redis.disconnect();
});

function startWorker(config: Record<string, unknown>): { child: ChildProcess; started: Promise<void> } {
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
  const script = fileURLToPath(new URL('./support/kill-worker.ts', import.meta.url));
  const child = spawn(process.execPath, ['--conditions=@courier/source', '--import', tsx, script], {
    env: { ...process.env, COURIER_REDIS_KILL_WORKER: JSON.stringify(config) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  const started = new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk.toString('utf8');
      if (stdout.includes('STARTED\n')) resolve();
    });
    child.on('exit', (code, signal) => reject(new Error(`worker exited (${code ?? signal}) before its handler started: ${stdout}\n${stderr}`)));
  });
  return { child, started };
}

describe('RedisInboxStore: a consumer process SIGKILLed mid-handler', () => {
  it('the redelivery waits while the worker lives, then runs the handler exactly once more after the kill', async () => {
    const messageId = uniqueId();
    const consumer = 'payments';
    const effects = `${prefix}effects`;
    const { child, started } = startWorker({ prefix, messageId, consumer, claimMs: CLAIM_MS, effects });
    await started;
    const inbox = new RedisInboxStore({ redis, prefix, claimMs: CLAIM_MS });
    let redeliveryRan = false;
    const redelivery = inbox.run(messageId, consumer, async () => {
      redeliveryRan = true;
      await redis.rpush(effects, 'redelivery');
      return 'ran';
    });
    // Longer than a claim: only the live worker's renewals keep the redelivery out.
    await sleep(CLAIM_MS * 2);
    expect(redeliveryRan).toBe(false);
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    const killedAt = Date.now();
    expect(await redelivery).toEqual({ duplicate: false, value: 'ran' });
    // Bounded by the claim the worker last renewed, plus polling (generous for a loaded machine).
    expect(Date.now() - killedAt).toBeLessThan(CLAIM_MS + 5_000);
    expect(await inbox.run(messageId, consumer, async () => 'again')).toEqual({ duplicate: true });
    const ran = await redis.lrange(effects, 0, -1);
    expect(ran).toEqual([`worker-${child.pid}`, 'redelivery']);
    await inbox.close();
  });
});
