// Runs the `courier` bin as a separate process: the compiled `dist/bin.js` that
// build-cli.ts (the project's globalSetup) produces, on plain Node without the source
// export condition, so workspace packages resolve to their compiled `dist/` as in an
// install. The config (courier.config.ts) is still TypeScript, loaded by the CLI itself.
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const PACKAGE_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'courier.config.ts');
const BIN = join(PACKAGE_DIR, 'dist', 'bin.js');

export interface CliResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Starts `courier <args>` with the test config (or `config`) and `env` added. */
export function startCli(args: readonly string[], env: Record<string, string>, config: string = CONFIG): ChildProcess {
  return spawn(process.execPath, [BIN, '--config', config, ...args], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/** Runs `courier <args>` to its end and returns its exit code and output. */
export function runCli(args: readonly string[], env: Record<string, string>, timeoutMs = 60_000, config: string = CONFIG): Promise<CliResult> {
  const child = startCli(args, env, config);
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
