// `courier dead list|show|replay|purge` against this transport: the CLI only uses
// `transport.deadLetters`, and this runs it end to end as an operator does — the `courier`
// binary as a child process (on the CLI's sources through tsx, with the workspace's source
// condition: this package does not build or depend on @courier/cli) with a courier.config.ts
// that builds a ServiceBusTransport. A consumer dead-letters two messages; the binary lists
// and shows them, replays one — which the consumer then handles exactly once — and purges
// the other. In topic mode and in queue mode (the queue's dead-letter sub-queue). Against the
// stand-in, or a real namespace when COURIER_ASB_CONNECTION_STRING is set.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Delivery } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import type { ServiceBusTransport } from '../src/index.js';
import { createServiceBusFixtureIn } from './support/fixture.js';
import { cleanupNamespace, REAL_CONNECTION_STRING } from './support/namespace.js';
import { standIn, standInConnectionString } from './support/standin-server.js';

afterAll(cleanupNamespace);

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

const HERE = dirname(fileURLToPath(import.meta.url));
const CLI_DIR = join(HERE, '..', '..', '..', 'packages', 'cli');
const CONFIG = join(HERE, 'support', 'courier.config.ts');

interface CliResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `courier <args>` (the CLI's bin.ts through tsx) to its end. */
function courier(args: readonly string[], env: Record<string, string>, timeoutMs = 90_000): Promise<CliResult> {
  const tsx = pathToFileURL(join(CLI_DIR, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const child = spawn(process.execPath, ['--conditions=@courier/source', '--import', tsx, join(CLI_DIR, 'src', 'bin.ts'), '--config', CONFIG, ...args], {
    cwd: HERE,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`courier ${args.join(' ')} did not finish in ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('courier dead over Service Bus dead-letter sub-queues', () => {
  it.each(['topics', 'queues'] as const)('lists, shows, replays (handled once) and purges dead letters through the binary (%s)', async (entities) => {
    const testId = uniqueId();
    const fixture = await createServiceBusFixtureIn({ entities }, { testId });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    const consumer = 'cli-payments';
    const env = {
      ASB_CLI_CONNECTION_STRING: REAL_CONNECTION_STRING ?? standInConnectionString((await standIn()).port),
      ASB_CLI_MANAGEMENT_PORT: REAL_CONNECTION_STRING ? '' : String((await standIn()).managementPort),
      ASB_CLI_ENTITIES: entities,
      ASB_CLI_PREFIX: (fixture.transport as ServiceBusTransport).entityOf(''),
      ASB_CLI_TOPICS: topic,
      ASB_CLI_CONSUMERS: consumer,
    };
    let refuse = true;
    const handled = new Map<string, number>();
    const worker = await fixture.connect();
    await worker.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 2 }, async (delivery: Delivery) => {
      if (refuse) return delivery.deadLetter({ code: 'HANDLER_UNRECOVERABLE', message: `refused ${delivery.envelope.payload}` });
      handled.set(delivery.envelope.messageId, (handled.get(delivery.envelope.messageId) ?? 0) + 1);
      return delivery.ack();
    });
    const first = makeEnvelope({ topic, key: null, payload: '{"n":1}' });
    const second = makeEnvelope({ topic, key: null, payload: '{"n":2}' });
    const results = await fixture.transport.publish([first, second]);
    expect(results.every((result) => result.ok)).toBe(true);
    await eventually(async () => expect((await fixture.transport.deadLetters!.list(consumer)).length).toBe(2), { timeoutMs: 30_000 });

    const listed = await courier(['dead', 'list', '--source', 'transport', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { ref: string; state: string; consumer: string; code: string; envelope: { messageId: string } }[];
    expect(items.map((item) => item.envelope.messageId).sort()).toEqual([first.messageId, second.messageId].sort());
    expect(items.every((item) => item.state === 'dead-letter' && item.consumer === consumer && item.code === 'HANDLER_UNRECOVERABLE')).toBe(true);
    const refOf = (messageId: string) => items.find((item) => item.envelope.messageId === messageId)!.ref;

    const shown = await courier(['dead', 'show', refOf(first.messageId)], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)[0]).toMatchObject({ ref: refOf(first.messageId), envelope: { messageId: first.messageId, payload: '{"n":1}' } });
    expect(JSON.parse(shown.stdout)[0].error).toContain('refused {"n":1}');

    refuse = false;
    const replayed = await courier(['dead', 'replay', refOf(first.messageId), '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('1 transport dead letter(s)');
    await eventually(() => expect(handled.get(first.messageId)).toBe(1), { timeoutMs: 30_000 });

    const purged = await courier(['dead', 'purge', refOf(second.messageId), '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(await fixture.transport.deadLetters!.list(consumer)).toEqual([]);
    const empty = await courier(['dead', 'list', '--source', 'transport', '--json'], env);
    expect(JSON.parse(empty.stdout)).toEqual([]);

    // The replayed message ran once, the purged one never: a later message proves the consumer still works.
    const sentinel = makeEnvelope({ topic, key: null, payload: '{"n":3}' });
    expect((await fixture.transport.publish([sentinel]))[0]?.ok).toBe(true);
    await eventually(() => expect(handled.get(sentinel.messageId)).toBe(1), { timeoutMs: 30_000 });
    expect(Object.fromEntries(handled)).toEqual({ [first.messageId]: 1, [sentinel.messageId]: 1 });
  }, 300_000);

  // The operator's read asks the management API whether the subscription exists (nothing
  // created): a mistyped consumer name is an error naming it, not "no dead letters", exit 0.
  it('refuses a consumer whose subscription does not exist, naming it, and creates nothing (topics)', async () => {
    const testId = uniqueId();
    const fixture = await createServiceBusFixtureIn({ entities: 'topics' }, { testId });
    closers.push(() => fixture.close());
    const topic = 'orders.placed';
    const worker = await fixture.connect();
    const subscription = await worker.subscribe({ consumer: 'cli-known', topics: [topic], ordered: false, concurrency: 1 }, async (delivery: Delivery) => delivery.ack());
    closers.push(() => subscription.close());
    const env = {
      ASB_CLI_CONNECTION_STRING: REAL_CONNECTION_STRING ?? standInConnectionString((await standIn()).port),
      ASB_CLI_MANAGEMENT_PORT: REAL_CONNECTION_STRING ? '' : String((await standIn()).managementPort),
      ASB_CLI_ENTITIES: 'topics',
      ASB_CLI_PREFIX: (fixture.transport as ServiceBusTransport).entityOf(''),
      ASB_CLI_TOPICS: topic,
      ASB_CLI_CONSUMERS: 'cli-known',
    };
    const known = await courier(['dead', 'list', '--source', 'transport', '--json'], env);
    expect(known.code, known.stderr).toBe(0);
    expect(JSON.parse(known.stdout)).toEqual([]);

    const mistyped = await courier(['dead', 'list', '--source', 'transport', '--consumer', 'cli-knwon'], env);
    expect(mistyped.code, mistyped.stdout).toBe(1);
    expect(mistyped.stderr).toContain("no such dead-letter queue on the broker for consumer 'cli-knwon'");
    const admin = fixture.transport.deadLetters!;
    expect(await admin.exists!('cli-knwon')).toBe(false);
    expect(await admin.exists!('cli-known')).toBe(true);
  }, 300_000);
});
