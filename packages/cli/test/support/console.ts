// Starts `courier console` as a child process (the compiled binary, as an operator runs it)
// and hands back its address once it says it is serving; `stop()` ends it with SIGTERM.
import type { ChildProcess } from 'node:child_process';
import { startCli } from './run-cli.js';

export interface RunningConsole {
  readonly url: string;
  readonly child: ChildProcess;
  /** Everything it printed on stdout so far: the audit lines. */
  stdout(): string;
  stderr(): string;
  stop(): Promise<number | null>;
}

export async function startConsole(args: readonly string[], env: Record<string, string>, config?: string): Promise<RunningConsole> {
  const child = config !== undefined ? startCli(['console', '--port', '0', ...args], env, config) : startCli(['console', '--port', '0', ...args], env);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`courier console did not start within 120 s; stderr:\n${stderr}`)), 120_000);
    const onData = (): void => {
      const match = /serving (http:\/\/\S+?\/)/.exec(stderr);
      if (match) {
        clearTimeout(timer);
        child.stderr!.off('data', onData);
        resolve(match[1]!);
      }
    };
    child.stderr!.on('data', onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`courier console exited (${code}) before serving; stderr:\n${stderr}`));
    });
  });
  return {
    url,
    child,
    stdout: () => stdout,
    stderr: () => stderr,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
}
