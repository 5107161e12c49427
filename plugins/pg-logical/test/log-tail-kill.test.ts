// A log-tailing relay process SIGKILLed between publish and confirm: the broker has the
// messages, the outbox and the slot know nothing of it. Nothing may be lost: the slot was
// not acknowledged past any of the rows, and the next relay publishes every one of them.
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createBus, noopLogger } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { readSlotStats } from '../src/index.js';
import { createLogTailFixture, eventually, Ping, RecordingTransport, type LogTailFixture } from './support/fixture.js';

const LEASE_MS = 1_500;
const ROWS = 12;
const KEYS = 3;
const open: LogTailFixture[] = [];
const children: ChildProcess[] = [];
afterEach(async () => {
  for (const child of children.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  for (const item of open.splice(0)) await item.close();
});

function startWorker(id: string): { child: ChildProcess; streaming: Promise<void>; sent: (count: number) => Promise<string[]> } {
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
  const script = fileURLToPath(new URL('./support/log-tail-worker.ts', import.meta.url));
  const child = spawn(process.execPath, ['--conditions=@courier/source', '--import', tsx, script], {
    env: { ...process.env, COURIER_LOG_TAIL_WORKER: JSON.stringify({ id, leaseMs: LEASE_MS }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
  const exited = new Promise<never>((_, reject) => child.on('exit', (code, signal) => reject(new Error(`worker exited (${code ?? signal}): ${stdout}\n${stderr}`))));
  exited.catch(() => undefined);
  const lines = () => stdout.split('\n').slice(0, -1);
  const waitFor = <T>(test: () => T | undefined): Promise<T> =>
    Promise.race([
      exited,
      (async () => {
        for (;;) {
          const value = test();
          if (value !== undefined) return value;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      })(),
    ]);
  return {
    child,
    streaming: waitFor(() => (lines().includes('STREAMING') ? (true as const) : undefined)).then(() => undefined),
    sent: (count) =>
      waitFor(() => {
        const ids = lines()
          .filter((line) => line.startsWith('SENT '))
          .flatMap((line) => JSON.parse(line.slice('SENT '.length)) as string[]);
        return ids.length >= count ? ids : undefined;
      }),
  };
}

describe('log-tailing relay SIGKILLed between publish and confirm', () => {
  it('leaves the slot unacknowledged past the rows and the next relay publishes every one (duplicates allowed, loss never)', async () => {
    const f = await createLogTailFixture();
    open.push(f);
    await f.admin.query(`CREATE TABLE "${f.id}_sent" (message_id text NOT NULL)`);
    const worker = startWorker(f.id);
    await worker.streaming;
    const producer = createBus({ outbox: f.polling(), transport: new RecordingTransport(), logger: noopLogger });
    await f.transaction(async (em) => {
      for (let i = 0; i < ROWS; i++) producer.outbox(em).publish(Ping, { i }, { key: `k${i % KEYS}` });
    });
    // One head per key is in the broker's hands, unconfirmed.
    const sent = await worker.sent(KEYS);
    worker.child.kill('SIGKILL');
    await eventually(async () => expect((await readSlotStats(f.admin, f.id))?.active).toBe(false));
    // Every insert is still in the slot: nothing was acknowledged past an unconfirmed row.
    const left = await f.admin.query<{ n: string }>(
      `SELECT count(*)::text AS n FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2) WHERE substr(data, 1, 1) = 'I'::bytea`,
      [f.id, `${f.id}_pub`],
    );
    expect(Number(left.rows[0]!.n)).toBe(ROWS);
    const transport = new RecordingTransport();
    const store = f.logTail({ sweepIntervalMs: 300 });
    const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 100 } });
    await bus.start({ relay: true, consumers: false });
    await eventually(() => expect(transport.published).toHaveLength(ROWS));
    await eventually(async () => expect((await f.inner.stats()).pending).toBe(0));
    const ids = transport.published.map((e) => e.messageId);
    expect(new Set(ids).size).toBe(ROWS);
    // The rows the killed relay had sent are sent again (at least once).
    for (const id of sent) expect(ids).toContain(id);
    for (let k = 0; k < KEYS; k++) {
      const order = transport.published.filter((e) => e.key === `k${k}`).map((e) => (JSON.parse(e.payload) as { i: number }).i);
      expect(order).toEqual([...order].sort((a, b) => a - b));
    }
    // The new reader acknowledges past them once they are settled.
    await eventually(async () => expect((await store.slotStats())?.unacknowledgedAgeMs).toBe(0));
    await bus.stop();
  });
});
