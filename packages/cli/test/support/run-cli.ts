// Runs the `courier` bin as a separate process, through tsx (the tests do not build),
// with workspace packages resolved to their sources like the rest of the test suite.
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const PACKAGE_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'courier.config.ts');
const BIN = join(PACKAGE_DIR, 'src', 'bin.ts');

export interface CliResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Starts `courier <args>` with the test config and `env` added. */
export function startCli(args: readonly string[], env: Record<string, string>): ChildProcess {
  return spawn(process.execPath, ['--conditions=@courier/source', '--import', 'tsx', BIN, '--config', CONFIG, ...args], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** Runs `courier <args>` to its end and returns its exit code and output. */
export function runCli(args: readonly string[], env: Record<string, string>, timeoutMs = 60_000): Promise<CliResult> {
  const child = startCli(args, env);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
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
