// A process that stopped its bus must be able to end. After a lost connection the transport
// gives its client up and closes it in the background; on a connection that is wedged (open
// but silent, as behind a dead NAT or a black-holed route) the SDK's close waits its
// operation timeouts, and `close()` stops waiting for it after 2 s (see ClientSource). Measured
// before the fix: the abandoned close kept the finished process alive 117 s after `close()`
// resolved. Here a child process publishes, its link is black-holed, its client given up after
// a publish timeout; it closes the transport and has nothing left to do.
import { spawn } from 'node:child_process';
import { connect, createServer, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { skipOnRealNamespace } from './support/namespace.js';
import { standIn } from './support/standin-server.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const TSX = pathToFileURL(join(HERE, '..', '..', '..', 'packages', 'cli', 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
/** How long the child may live after `close()` resolved: process teardown, on a loaded machine. */
const EXIT_WITHIN_MS = 10_000;

/** A TCP proxy to `port` that forwards until `blackhole()`, then drops every byte both ways, sockets left open. */
async function wedgeableProxy(port: number): Promise<{ port: number; blackhole(): void; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let dropping = false;
  const server = createServer((client) => {
    const upstream = connect(port, '127.0.0.1');
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      sockets.add(from);
      from.on('data', (chunk) => void (dropping || to.destroyed || to.write(chunk)));
      from.on('close', () => to.destroy());
      from.on('error', () => undefined);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    blackhole: () => void (dropping = true),
    close: async () => {
      const closed = new Promise((resolve) => server.close(resolve));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe.skipIf(skipOnRealNamespace('the wedged link is a local proxy in front of the stand-in'))('a process whose client was given up on a wedged connection', () => {
  it(`ends within ${EXIT_WITHIN_MS / 1000} s of transport.close(), not after the SDK's operation timeouts`, async () => {
    const proxy = await wedgeableProxy((await standIn()).port);
    closers.push(() => proxy.close());
    const child = spawn(process.execPath, ['--conditions=@courier/source', '--import', TSX, join(HERE, 'support', 'close-exit-child.ts')], {
      cwd: HERE,
      env: { ...process.env, CLOSE_EXIT_PORT: String(proxy.port), CLOSE_EXIT_PREFIX: uniqueId() },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    closers.push(async () => void child.kill('SIGKILL'));
    const lines: string[] = [];
    let closedAt = 0;
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number>((resolve) => child.on('exit', () => resolve(Date.now())));
    child.stdout.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n').filter(Boolean)) {
        lines.push(line);
        if (line.startsWith('published')) {
          proxy.blackhole();
          child.kill('SIGUSR2');
        }
        if (line.startsWith('closed')) closedAt = Date.now();
      }
    });
    const bound = new Promise<'still running'>((resolve) => {
      const timer = setInterval(() => {
        if (closedAt > 0 && Date.now() - closedAt > EXIT_WITHIN_MS) {
          clearInterval(timer);
          resolve('still running');
        }
      }, 200);
      void exited.finally(() => clearInterval(timer));
    });
    const outcome = await Promise.race([exited, bound]);
    expect(lines, stderr).toContain('published true');
    // The send on the wedged link timed out and gave its client up; close() did not wait for it.
    expect(lines).toContain('second false PUBLISH_TIMEOUT');
    expect(lines.some((line) => line.startsWith('warn azure-service-bus: abandoned the close'))).toBe(true);
    expect(outcome, `the child still ran ${EXIT_WITHIN_MS} ms after close() resolved (lines: ${lines.join(' | ')})`).not.toBe('still running');
    expect((outcome as number) - closedAt).toBeLessThan(EXIT_WITHIN_MS);
  }, 120_000);
});
