// What the courier binary prints: whole to a slow reader, no screen escapes into a pipe, and
// the exit codes of a missing config and of options every command takes.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { PACKAGE_DIR, runCli, startCli } from './support/run-cli.js';

const BYTES = 4 * 1024 * 1024;

/** Runs a script that prints BYTES of JSON then exits through `exit`, read by a reader that waits 1.5 s before it reads. */
function printThenExit(exit: 'exitAfterOutput' | 'process.exit'): Promise<{ code: number | null; received: number }> {
  const module = JSON.stringify(join(PACKAGE_DIR, 'dist', 'exit.js'));
  const ending = exit === 'process.exit' ? 'process.exit(0);' : `await (await import(${module})).exitAfterOutput(0);`;
  const script = `process.stdout.write(JSON.stringify('x'.repeat(${BYTES - 2})) + '\\n'); ${ending}`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  child.stdout.pause();
  let received = 0;
  setTimeout(() => {
    child.stdout.on('data', (chunk: Buffer) => (received += chunk.length));
    child.stdout.resume();
  }, 1_500);
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, received })));
}

describe('the binary exit', () => {
  it('hands a slow pipe everything that was printed before exiting 0', async () => {
    const result = await printThenExit('exitAfterOutput');
    expect(result).toEqual({ code: 0, received: BYTES + 1 });
  });

  it('(the cause) process.exit alone cuts what a slow pipe has not taken', async () => {
    const result = await printThenExit('process.exit');
    expect(result.code).toBe(0);
    expect(result.received).toBeLessThan(BYTES + 1);
  });
});

describe('courier output and exit codes', () => {
  const env = { CLI_TEST_DIALECT: 'sqlite', CLI_TEST_PREFIX: `out${randomBytes(4).toString('hex')}_` };

  it('exits 2 (usage) when the config file named does not exist', async () => {
    const child = spawn(process.execPath, [join(PACKAGE_DIR, 'dist', 'bin.js'), 'stats', '--config', join(PACKAGE_DIR, 'no-such-courier.config.ts')], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    expect(code, stderr).toBe(2);
    expect(stderr).toContain("no-such-courier.config.ts' does not exist");
  });

  it('accepts --json on dead show', async () => {
    const result = await runCli(['dead', 'show', '--json', 'outbox:1'], env);
    expect(result.stderr).not.toMatch(/unknown option/);
  });

  it('writes no screen escapes into a pipe with --watch', async () => {
    const child = startCli(['stats', '--watch', '--interval', '1s'], env);
    let stdout = '';
    child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    const closed = new Promise<void>((resolve) => child.on('close', () => resolve()));
    const deadline = Date.now() + 60_000;
    while (!stdout.includes('every 1s') && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
    child.kill('SIGINT');
    await closed;
    expect(stdout).toContain('every 1s');
    expect(stdout).not.toContain('\x1b');
  });
});
