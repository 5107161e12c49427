import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { BusCounters } from '@courier/core';
import type { RunnerMessage, WorkerConfig, WorkerMessage } from './distributed-config.js';
import { LAYER_NAMES, type WorkerRole } from './options.js';
import { addCounters, serviceCounters } from './run-result.js';
import type { ServiceCounters } from './reconciliation.js';

interface Running {
  readonly role: WorkerRole;
  readonly incarnation: number;
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
  /** Set when we killed or stopped it on purpose. */
  expected: boolean;
  /** When it reported that its bus runs. */
  readyAt: number | null;
}

const MAIN = fileURLToPath(new URL('./main.ts', import.meta.url));
const EXAMPLE_DIR = fileURLToPath(new URL('..', import.meta.url));

/**
 * The workers' Node flags: the runner's own when it runs the example's `start` script (tsx
 * and the source export condition carry over); otherwise — a runner inside a test runner,
 * whose flags are its own — the two the TypeScript entry needs.
 */
const WORKER_FLAGS: readonly string[] = process.execArgv.some((flag) => flag === 'tsx' || /^--(import|loader)=tsx$/.test(flag))
  ? process.execArgv
  : ['--conditions=@courier/source', '--import', 'tsx'];

/**
 * The worker processes of a distributed run: one per role, started as child processes of
 * the runner (Node flags: see WORKER_FLAGS), killed and restarted by the chaos monkey,
 * stopped gracefully at the end. Keeps the last counters each process lifetime reported.
 */
export class WorkerPool {
  readonly #config: Omit<WorkerConfig, 'incarnation'>;
  readonly #write: (line: string) => void;
  readonly #running = new Map<WorkerRole, Running>();
  readonly #incarnations: Record<WorkerRole, number> = { orders: 0, payments: 0 };
  readonly #counters = new Map<string, BusCounters>();
  #unexpectedExits = 0;
  #closing = false;
  /** True once an orders process reported that every order is placed. */
  allPlaced = false;

  constructor(config: Omit<WorkerConfig, 'incarnation'>, write: (line: string) => void) {
    this.#config = config;
    this.#write = write;
  }

  /** Processes that exited without being killed or stopped by us. */
  get unexpectedExits(): number {
    return this.#unexpectedExits;
  }

  /** `orders#2 payments#1`: the current process of each role. */
  describe(): string {
    return (['orders', 'payments'] as const).map((role) => `${role}#${this.#incarnations[role]}${this.#running.has(role) ? '' : ' (down)'}`).join(' ');
  }

  /** Starts a process for `role` (a new incarnation). */
  start(role: WorkerRole): void {
    if (this.#closing || this.#running.has(role)) return;
    const incarnation = ++this.#incarnations[role];
    const config: WorkerConfig = { ...this.#config, incarnation };
    const child = fork(MAIN, ['--worker', role, '--worker-config', JSON.stringify(config)], {
      execArgv: [...WORKER_FLAGS],
      // The example's own directory, where `--import tsx` resolves (a test runner's is the repository's).
      cwd: EXAMPLE_DIR,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const key = `${role}#${incarnation}`;
    const forkedAt = Date.now();
    child.on('message', (message: WorkerMessage) => {
      if (message.kind === 'progress' || message.kind === 'stopped') this.#counters.set(key, message.counters);
      if (message.kind === 'placed') this.allPlaced = true;
      if (message.kind === 'stopped' && message.logTail) {
        const { slot, logged, swept } = message.logTail;
        this.#write(`worker ${key} log-tail relay (slot ${slot}): claimed ${logged} rows from the log, ${swept} by its sweep`);
      }
      if (message.kind === 'ready') {
        running.readyAt = Date.now();
        this.#write(
          `worker ${key} ready (${LAYER_NAMES[message.dataLayer]}, pid ${String(child.pid)}, ${((running.readyAt - forkedAt) / 1000).toFixed(1)}s to start${message.metricsUrl ? `, metrics ${message.metricsUrl}` : ''})`,
        );
      }
    });
    const running: Running = {
      role,
      incarnation,
      child,
      expected: false,
      readyAt: null,
      exited: new Promise<void>((resolve) => {
        child.once('exit', (code, signal) => {
          if (this.#running.get(role) === running) this.#running.delete(role);
          if (!running.expected) {
            this.#unexpectedExits += 1;
            this.#write(`worker ${key} exited on its own (code ${String(code)}, signal ${String(signal)}); restarting it`);
            setTimeout(() => this.start(role), 500);
          }
          resolve();
        });
      }),
    };
    this.#running.set(role, running);
  }

  /** Milliseconds since the current process of `role` reported ready, or null while it starts (or none runs). */
  readyFor(role: WorkerRole): number | null {
    const readyAt = this.#running.get(role)?.readyAt ?? null;
    return readyAt === null ? null : Date.now() - readyAt;
  }

  /** SIGKILLs the current process of `role`, as a crash would; returns its name, or null if none runs. */
  async kill(role: WorkerRole): Promise<string | null> {
    const running = this.#running.get(role);
    if (!running) return null;
    running.expected = true;
    running.child.kill('SIGKILL');
    await running.exited;
    return `${role}#${running.incarnation} (pid ${String(running.child.pid)})`;
  }

  /** Asks every process to drain and exit; SIGKILLs those that have not exited after `timeoutMs`. */
  async stopAll(timeoutMs = 20_000): Promise<void> {
    this.#closing = true;
    const all = [...this.#running.values()];
    for (const running of all) {
      running.expected = true;
      if (running.child.connected) running.child.send({ kind: 'stop' } satisfies RunnerMessage);
      else running.child.kill('SIGKILL');
    }
    const timer = setTimeout(() => {
      for (const running of all) {
        if (running.child.exitCode === null && running.child.signalCode === null) {
          this.#write(`worker ${running.role}#${running.incarnation} did not stop within ${timeoutMs / 1000}s; killing it`);
          running.child.kill('SIGKILL');
        }
      }
    }, timeoutMs);
    await Promise.all(all.map((running) => running.exited));
    clearTimeout(timer);
  }

  /** Counters of every process lifetime of `role`, summed (a killed one counts up to its last report). */
  counters(role: WorkerRole): ServiceCounters {
    return addCounters([...this.#counters].filter(([key]) => key.startsWith(`${role}#`)).map(([, counters]) => serviceCounters(counters)));
  }
}
