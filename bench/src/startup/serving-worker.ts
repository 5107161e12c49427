// Scenario 12's separate processes: the startup worker (startup-worker.mjs) started with
// `serve: true` as a producer, relay or consumer process that stays up and answers commands
// on stdin, started the way scenario 9 starts it (built packages on plain `node`, or the
// sources through tsx when dist/ is not built).
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { WorkerLaunch } from '../scenarios/startup.js';
import { onJsonLines } from './json-lines.js';

const BENCH_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const WORKER = join(BENCH_DIR, 'src', 'startup', 'startup-worker.mjs');

/** A worker's own figures at one moment: its clock (epoch ms), CPU seconds since it started, peak RSS so far (MB). */
export interface WorkerFigures {
  readonly at: number;
  readonly cpuSeconds: number;
  readonly maxRssMb: number;
}

/** A command's answer: the figures when it was answered, and what the command itself reports. */
export interface WorkerReply extends WorkerFigures {
  /** `await`: the relay's published / the consumer's handled count; `produce`: transactions committed. */
  readonly count?: number;
  /** `start` and `produce`: the figures just before the work began. */
  readonly before?: WorkerFigures;
}

/** What the worker does between `start`/`produce` and its answer (startup-worker.mjs `serve`). */
export type WorkerCommand = { cmd: 'stats' } | { cmd: 'start' } | { cmd: 'await'; count: number } | { cmd: 'produce'; seconds: number };

interface Pending {
  readonly resolve: (reply: WorkerReply) => void;
  readonly reject: (error: Error) => void;
  readonly timer: NodeJS.Timeout;
}

/**
 * One serving worker process. Commands are answered in the order sent. If the process exits,
 * every pending command rejects naming its exit and stderr; a command not answered within its
 * timeout kills the process (SIGKILL). The worker also exits by itself when its stdin closes,
 * so even a bench process killed outright leaves none behind. Callers `kill()` (then await
 * `closed`) every worker in a `finally`.
 */
export class ServingWorker {
  readonly role: 'producer' | 'relay' | 'consumer';
  /** Resolves once the process exited and its output was read. */
  readonly closed: Promise<void>;
  readonly #child: ChildProcessWithoutNullStreams;
  readonly #pending: Pending[] = [];
  #stderr = '';
  #done = false;
  #exit: string | undefined;

  /**
   * Spawns the worker with `config` (startup-worker.mjs's JSON config; `serve` and `role` are
   * added). `built`: run the built packages on plain node, else the sources through tsx.
   */
  constructor(launch: Omit<WorkerLaunch, 'role'> & { role: ServingWorker['role'] }, config: Record<string, unknown>, built: boolean) {
    this.role = launch.role;
    const execArgv = [...(launch.nodeFlags ?? []), ...(launch.tsx || !built ? ['--conditions=@courier/source', '--import', 'tsx'] : [])];
    const workerConfig = { ...config, role: launch.role, ormLoader: launch.ormLoader ?? 'import', serve: true };
    this.#child = spawn(process.execPath, [...execArgv, WORKER, JSON.stringify(workerConfig)], {
      cwd: BENCH_DIR,
      // Only what a deployed worker would get: no inherited --import or --conditions.
      env: { ...process.env, NODE_OPTIONS: '' },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    // Writing to a worker that just died: its exit rejects what is pending.
    this.#child.stdin.on('error', () => undefined);
    onJsonLines(
      this.#child.stdout,
      (message) => {
        const parsed = message as { reply?: WorkerReply; done?: boolean };
        if (parsed.done) this.#done = true;
        if (parsed.reply === undefined) return;
        const pending = this.#pending.shift();
        if (pending === undefined) return;
        clearTimeout(pending.timer);
        pending.resolve(parsed.reply);
      },
      (line) => {
        this.#stderr = (this.#stderr + line + '\n').slice(-4_000);
      },
    );
    this.#child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      this.#stderr = (this.#stderr + chunk).slice(-4_000);
    });
    this.closed = new Promise((resolve) => {
      const ended = (why: string) => {
        this.#exit ??= why;
        for (const pending of this.#pending.splice(0)) {
          clearTimeout(pending.timer);
          pending.reject(this.#failure());
        }
        resolve();
      };
      this.#child.once('error', (error) => ended(`failed to start: ${error.message}`));
      this.#child.once('close', (code, signal) => ended(`exited with ${code ?? signal}`));
    });
  }

  /** The process id (to check with `ps` that none is left). */
  get pid(): number | undefined {
    return this.#child.pid;
  }

  /** Sends `command`; resolves with its answer, rejects if the process exits first or after `timeoutMs` (and kills it). */
  request(command: WorkerCommand, timeoutMs = 600_000): Promise<WorkerReply> {
    if (this.#exit !== undefined) return Promise.reject(this.#failure());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#exit ??= `killed: no answer to ${JSON.stringify(command)} within ${timeoutMs} ms`;
        this.#child.kill('SIGKILL');
      }, timeoutMs);
      this.#pending.push({ resolve, reject, timer });
      this.#child.stdin.write(`${JSON.stringify(command)}\n`);
    });
  }

  /** Asks the worker to stop its bus and exit; throws unless it did so cleanly within `timeoutMs` (it is killed then). */
  async stop(timeoutMs = 30_000): Promise<void> {
    if (this.#exit === undefined) {
      this.#child.stdin.end(`${JSON.stringify({ cmd: 'stop' })}\n`);
      const timer = setTimeout(() => this.kill(), timeoutMs);
      await this.closed;
      clearTimeout(timer);
    }
    if (!this.#done) throw this.#failure();
  }

  /** Kills the process if it is still running (a no-op after it exited). */
  kill(): void {
    if (this.#child.exitCode === null && this.#child.signalCode === null) this.#child.kill('SIGKILL');
  }

  #failure(): Error {
    const stderr = this.#stderr.trim();
    return new Error(`${this.role} worker (pid ${this.#child.pid}) ${this.#exit ?? 'did not stop'}${stderr ? `: ${stderr}` : ''}`);
  }
}
