// A relay process SIGKILLed while it holds a claimed batch (its broker's confirms hang):
// with lease renewals the lease is short, so another relay publishes the keys it held
// about one lease later, in per-key order. Before the kill, the live relay keeps its batch
// for longer than the lease (it renews). Prints the measured hand-over time.
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { eventually } from '@courier/conformance';
import { createBus, InMemoryBroker, type Envelope, type Transport } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const KEYS = 20;
const PER_KEY = 10;
const POLL_MS = 100;
/** The relay's default lease over a store that renews leases (`RelayConfig.leaseMs`); both relays use it. */
const LEASE_MS = 5_000;

const open: { close(): Promise<void> }[] = [];
const children: ChildProcess[] = [];
afterEach(async () => {
  for (const child of children.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  for (const item of open.splice(0).reverse()) await item.close();
});

function startRelayProcess(config: { testId: string }, heldCount: number): { child: ChildProcess; held: Promise<string[]> } {
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
  const script = fileURLToPath(new URL('./support/lease-relay-worker.ts', import.meta.url));
  const child = spawn(process.execPath, ['--conditions=@courier/source', '--import', tsx, script], {
    env: { ...process.env, COURIER_LEASE_WORKER: JSON.stringify(config) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  // The relay runs several claim loops at once, so its first claims may split the due rows
  // between them: every loop's batch hangs in the transport, and the relay holds the union.
  const held = new Promise<string[]>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      stdout += chunk.toString('utf8');
      const ids = stdout
        .split('\n')
        .slice(0, -1) // complete lines only
        .filter((candidate) => candidate.startsWith('HELD '))
        .flatMap((line) => JSON.parse(line.slice('HELD '.length)) as string[]);
      if (ids.length >= heldCount) resolve(ids);
    });
    child.on('exit', (code, signal) => reject(new Error(`relay process exited (${code ?? signal}) before holding a batch: ${stdout}\n${stderr}`)));
  });
  return { child, held };
}

describe('a SIGKILLed relay process hands its keys over after one short lease', () => {
  it('another relay publishes the keys the killed relay held within lease + poll interval (+ slack), in per-key order', async () => {
    const id = testId();
    const f: MikroOrmFixture = await createMikroOrmFixture('postgresql', { testId: id });
    open.push(f);
    const topic = `${id}.lease`;
    const committed: Envelope[] = [];
    for (let round = 0; round < PER_KEY; round += 1) {
      const batch = Array.from({ length: KEYS }, (_, key) => envelope(topic, `k${key}`, { payload: JSON.stringify({ n: round }) }));
      await f.transaction(async (tx) => f.outbox.append(tx, batch.map((item) => ({ envelope: item }))));
      committed.push(...batch);
    }

    const relay = startRelayProcess({ testId: id }, KEYS);
    const held = await relay.held;
    expect(held).toHaveLength(KEYS);
    // Alive, the relay keeps its batch past several leases: it renews them.
    const heldSince = Date.now();
    while (Date.now() - heldSince < LEASE_MS * 2) {
      expect((await f.outbox.stats()).inFlight, 'a live relay lost its batch before it was killed').toBe(KEYS);
      await new Promise((resolve) => setTimeout(resolve, 500));
    }

    relay.child.kill('SIGKILL');
    const killedAt = Date.now();
    const broker = new InMemoryBroker();
    open.push(broker);
    const connection = broker.connect();
    const published: { envelope: Envelope; at: number }[] = [];
    const recording: Transport = {
      capabilities: connection.capabilities,
      async publish(messages, options) {
        const results = await connection.publish(messages, options);
        const at = Date.now();
        results.forEach((result, index) => {
          if (result.ok) published.push({ envelope: messages[index]!, at });
        });
        return results;
      },
      subscribe: (endpoint, handler) => connection.subscribe(endpoint, handler),
      close: () => connection.close(),
    };
    const bus = createBus({ outbox: f.outbox, transport: recording, relay: { pollIntervalMs: POLL_MS } });
    open.push({ close: () => bus.stop({ timeoutMs: 5_000 }) });
    await bus.start({ consumers: false });

    const bound = LEASE_MS + POLL_MS + 10_000;
    await eventually(() => expect(published.filter((item) => held.includes(item.envelope.messageId))).toHaveLength(KEYS), { timeoutMs: bound, intervalMs: 50 });
    const handedOverMs = Math.max(...published.filter((item) => held.includes(item.envelope.messageId)).map((item) => item.at)) - killedAt;
    console.log(`[relay-lease-kill] ${KEYS} held keys published by another relay ${handedOverMs} ms after SIGKILL (lease ${LEASE_MS} ms, poll ${POLL_MS} ms)`);
    expect(handedOverMs).toBeLessThan(bound);

    await eventually(() => expect(new Set(published.map((item) => item.envelope.messageId)).size).toBe(committed.length), { timeoutMs: 30_000 });
    // Per-key order: each key's messages were published in commit order.
    for (let key = 0; key < KEYS; key += 1) {
      const order = published.filter((item) => item.envelope.key === `k${key}`).map((item) => (JSON.parse(item.envelope.payload) as { n: number }).n);
      expect(order, `key k${key}`).toEqual(Array.from({ length: PER_KEY }, (_, n) => n));
    }
  }, 90_000);
});
