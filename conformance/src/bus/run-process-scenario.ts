import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { ProcessFixtureModule, TransportFixture } from '../fixtures.js';
import type { WorkerConfig } from './process-worker.js';
import { after } from '../support/after.js';
import { uniqueId } from '../support/unique-id.js';
import { fixtureBundle, workerBundle } from './worker-bundle.js';
import { settle, type ScenarioResult, type ScenarioRunOptions } from './run-scenario.js';
import type { ScenarioSpec } from './scenarios.js';
import { cutNote, seconds, settleCutNote, WaitBudget } from './wait-budget.js';
import { commitScenarioTraffic, DEFAULT_TUNING, type ScenarioTuning } from './world.js';

/** Where the child processes get their fixtures, and how to start Node for them. */
export interface ProcessFixtureOptions {
  /** Absolute path of a module exporting `createFixture` (see {@link ProcessFixtureModule}). */
  readonly module: string;
  /**
   * Extra Node arguments for the child, e.g. `['--conditions=my-source']`. When the module
   * or the worker script is TypeScript, the tsx loader (a dependency of this package) is
   * added in front, resolved from here so the caller need not depend on it — unless the
   * worker runs bundled (below).
   */
  readonly execArgv?: readonly string[];
  /**
   * Whether a TypeScript worker runs as one bundle (default true): the worker script and
   * `module` with every source file they import built by esbuild once per test file,
   * resolved with the `--conditions` of `execArgv`; installed packages are imported from
   * where they are, as under tsx. A worker then starts in well under half of tsx's CPU time,
   * which the kill scenarios pay at every restart. `import.meta.url` keeps each file's own
   * URL; set false for a module that depends on being loaded as its own file in another way.
   */
  readonly bundle?: boolean;
}

interface Child {
  readonly process: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly output: string[];
  /** When each line of `output` came, in ms after the launch. */
  readonly outputAt: number[];
  readonly launchedAt: number;
  readonly sawLine: (line: string) => Promise<void>;
}

function tsxLoader(): string {
  return pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
}

function workerScript(): string {
  const here = import.meta.url;
  const candidate = new URL(here.endsWith('.ts') ? './process-worker.ts' : './process-worker.js', here);
  return fileURLToPath(candidate);
}

/** The package conditions named in Node arguments (`--conditions=x`, `--conditions x`, `-C x`). */
function conditionsOf(execArgv: readonly string[]): string[] {
  const conditions: string[] = [];
  execArgv.forEach((argument, index) => {
    if (argument.startsWith('--conditions=')) conditions.push(argument.slice('--conditions='.length));
    else if ((argument === '--conditions' || argument === '-C') && execArgv[index + 1] !== undefined) conditions.push(execArgv[index + 1]!);
  });
  return conditions;
}

/**
 * The fixture module, in this (the parent) process. Under vitest with the kit inlined (this
 * repository) `import()` goes through vite, which reads TypeScript. From an installed kit
 * vitest leaves the import to Node, which refuses a `.ts` module (ERR_UNKNOWN_FILE_EXTENSION,
 * where Node does not strip types itself): then it is bundled as the workers' fixture is and
 * the bundle imported, so an author's `.ts` fixture works without any vitest setting.
 */
async function importFixtureModule<Tx>(options: ProcessFixtureOptions): Promise<ProcessFixtureModule<Tx>> {
  try {
    return (await import(pathToFileURL(options.module).href)) as ProcessFixtureModule<Tx>;
  } catch (error) {
    if ((error as { code?: unknown }).code !== 'ERR_UNKNOWN_FILE_EXTENSION') throw error;
    const bundle = await fixtureBundle(options.module, conditionsOf(options.execArgv ?? []));
    return (await import(pathToFileURL(bundle).href)) as ProcessFixtureModule<Tx>;
  }
}

/** How to start a worker: the script to run and the Node arguments in front of it. */
async function workerLaunch(options: ProcessFixtureOptions): Promise<{ script: string; execArgv: string[] }> {
  const script = workerScript();
  const execArgv = [...(options.execArgv ?? [])];
  const typescript = options.module.endsWith('.ts') || script.endsWith('.ts');
  if (!typescript) return { script, execArgv };
  if (options.bundle === false) return { script, execArgv: ['--import', tsxLoader(), ...execArgv] };
  return { script: await workerBundle(script, options.module, conditionsOf(execArgv)), execArgv: ['--enable-source-maps', ...execArgv] };
}

function startChild(launch: { script: string; execArgv: string[] }, config: WorkerConfig, transport: TransportFixture): Child {
  const { script, execArgv } = launch;
  const child = spawn(process.execPath, [...execArgv, script], {
    env: { ...process.env, ...transport.workerEnv?.(), COURIER_CONFORMANCE_WORKER: JSON.stringify(config) },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  transport.hostWorker?.(child);
  const launchedAt = Date.now();
  const output: string[] = [];
  const outputAt: number[] = [];
  const waiters: { line: string; resolve: () => void }[] = [];
  let buffer = '';
  const onData = (chunk: Buffer) => {
    buffer += chunk.toString('utf8');
    let newline = buffer.indexOf('\n');
    while (newline >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      output.push(line);
      outputAt.push(Date.now() - launchedAt);
      if (line === 'ready' && process.env['COURIER_CONFORMANCE_LOG']) process.stderr.write(`[worker ${child.pid}] reported ready ${((Date.now() - launchedAt) / 1000).toFixed(1)} s after its launch\n`);
      for (const waiter of [...waiters]) {
        if (line.startsWith(waiter.line)) {
          waiters.splice(waiters.indexOf(waiter), 1);
          waiter.resolve();
        }
      }
      newline = buffer.indexOf('\n');
    }
  };
  child.stdout?.on('data', onData);
  if (process.env['COURIER_CONFORMANCE_LOG']) {
    // Worker logs, prefixed by pid, when a scenario needs explaining.
    const echo = (chunk: Buffer) => process.stderr.write(`[worker ${child.pid}] ${chunk.toString('utf8')}`);
    child.stdout?.on('data', echo);
    child.stderr?.on('data', echo);
  }
  child.stderr?.on('data', (chunk: Buffer) => {
    output.push(`stderr: ${chunk.toString('utf8').trimEnd()}`);
    outputAt.push(Date.now() - launchedAt);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.on('exit', (code, signal) => resolve({ code, signal }));
  });
  return {
    process: child,
    exited,
    output,
    outputAt,
    launchedAt,
    sawLine: (line) =>
      output.some((seen) => seen.startsWith(line)) ? Promise.resolve() : new Promise<void>((resolve) => waiters.push({ line, resolve })),
  };
}

async function stopChild(child: Child): Promise<void> {
  if (child.process.exitCode !== null || child.process.signalCode !== null) return;
  child.process.kill('SIGCONT');
  child.process.kill('SIGTERM');
  const result = await Promise.race([child.exited, new Promise<null>((resolve) => setTimeout(() => resolve(null), 5_000))]);
  if (result === null) {
    child.process.kill('SIGKILL');
    await child.exited;
  }
}

/**
 * How long a worker may take to start (report `ready`): a start-up on a loaded 2-core
 * machine takes tens of seconds (measured at load ~20: 30–60 s from launch to ready).
 */
const START_MS = 120_000;
/**
 * How long a started worker may take to reach its fault point, counted from its `ready`:
 * it may wait out a dead predecessor's leases and handle the target's key up to it first.
 * Counted from the launch instead, a slow start left too little of it.
 */
const REACH_FAULT_MS = 90_000;

/**
 * What is kept back from a run's deadline for what follows its last wait: the diagnosis of
 * a run that did not settle (each fixture's `locate` may take up to 15 s), stopping the
 * workers (up to 5 s) and closing the fixtures.
 */
const VERDICT_RESERVE_MS = 30_000;

/**
 * Waits for `child` to report `ready` (or `line`, or to exit, which may come first: a
 * fault point can be reached before `ready` is written), at most {@link START_MS}, then
 * for `line` or its exit, at most {@link REACH_FAULT_MS} more; each bound cut to what is
 * left of `budget`. Resolves with what came and, when nothing did, how long it waited and
 * whether the budget cut that wait.
 */
async function startedThen(
  child: Child,
  line: string | undefined,
  budget: WaitBudget,
): Promise<{ outcome: 'line' } | { outcome: 'exited' } | { outcome: 'no start' | 'timeout'; waitedMs: number; cut: boolean }> {
  const seen = line === undefined ? new Promise<never>(() => {}) : child.sawLine(line).then(() => ({ outcome: 'line' as const }));
  const exited = child.exited.then(() => ({ outcome: 'exited' as const }));
  const start = budget.wait(START_MS);
  const started = await Promise.race([
    child.sawLine('ready').then(() => ({ outcome: 'ready' as const })),
    seen,
    exited,
    after(start.ms, { outcome: 'no start' as const, waitedMs: start.ms, cut: start.cut }),
  ]);
  if (started.outcome !== 'ready') return started;
  const reach = budget.wait(REACH_FAULT_MS);
  return Promise.race([seen, exited, after(reach.ms, { outcome: 'timeout' as const, waitedMs: reach.ms, cut: reach.cut })]);
}
/**
 * How long the survivors may go without settling one more message before the run is
 * judged: it covers a worker's start on a loaded machine (tens of seconds) and any lease
 * or retry delay a crash leaves behind. Every message that settles restarts the clock, so
 * a slow but moving machine is waited for, up to {@link SETTLE_MAX_MS}; a message that
 * never settles still fails the run, named with where it is.
 */
const SETTLE_IDLE_MS = 120_000;
/** The longest the survivors may take to settle everything, progress or not (within the case's own timeout). */
const SETTLE_MAX_MS = 240_000;
/**
 * Armed workers started after the `maxCrashes` counted deaths, while each dies at the point.
 * Each death can leave one more copy behind (a relay killed between publishing the target's
 * row and marking it publishes it again from its successor), and such a copy's death is not
 * counted, so the copies are not bounded by `maxCrashes`. Three were not enough: on SQS under
 * load all three extras died at the point, nobody was left to relay, and the run stalled with
 * rows pending and no lease. The loop stops as soon as a worker lives or the run settles, so a
 * larger bound costs a passing run nothing.
 */
const EXTRA_CRASH_LOOP_WORKERS = 10;

/**
 * Runs one scenario with real processes: the parent commits the traffic through its own
 * fixture, a child worker is SIGKILLed at the fault point (or SIGSTOPped past its lease
 * for the stale-relay stall), fresh children take over, and the invariants are checked
 * against what survived in the database and broker.
 */
export async function runProcessScenario<Tx>(
  spec: ScenarioSpec,
  fixtureOptions: ProcessFixtureOptions,
  options: ScenarioRunOptions,
): Promise<ScenarioResult> {
  if (!existsSync(fixtureOptions.module)) throw new Error(`process fixture module '${fixtureOptions.module}' does not exist`);
  const testId = uniqueId();
  const fixtureModule = await importFixtureModule<Tx>(fixtureOptions);
  const { store, transport } = await fixtureModule.createFixture({ testId });
  const children: Child[] = [];
  const tuning: ScenarioTuning = { ...DEFAULT_TUNING, ...options.tuning };
  const budget = new WaitBudget(options.deadline, VERDICT_RESERVE_MS);
  let settled = false;
  try {
    const { world, ledger, target } = await commitScenarioTraffic(testId, spec.action, store, transport.transport, options.seed, options.plan);
    const worker = await workerLaunch(fixtureOptions);
    const launch = (fault: WorkerConfig['fault']): Child => {
      const child = startChild(worker, { module: fixtureOptions.module, testId, tuning, fault }, transport);
      children.push(child);
      return child;
    };
    // Each line with its time after the worker's launch: a start that took most of the wait shows.
    const describeChildren = () =>
      children
        .map((child, index) => {
          const from = Math.max(0, child.output.length - 6);
          const lines = child.output.slice(from).map((line, at) => `+${((child.outputAt[from + at] ?? 0) / 1000).toFixed(1)}s ${line}`);
          return `worker ${index} (launched ${((Date.now() - child.launchedAt) / 1000).toFixed(1)} s ago): ${lines.join(' | ')}`;
        })
        .join('\n');
    const expectKilled = async (child: Child) => {
      const started = await startedThen(child, undefined, budget);
      if (started.outcome === 'no start') throw new Error(`a worker did not start (report ready) within ${seconds(started.waitedMs)}${cutNote(started.cut)}\n${describeChildren()}`);
      if (started.outcome === 'timeout') {
        throw new Error(`fault point '${spec.point}' was never reached in ${seconds(started.waitedMs)} after the worker reported ready${cutNote(started.cut)}\n${describeChildren()}`);
      }
      const result = await child.exited;
      if (result.signal !== 'SIGKILL') throw new Error(`worker exited with ${result.code ?? result.signal} instead of being killed\n${describeChildren()}`);
    };

    if (spec.action === 'stall') {
      // The stale worker goes first so that it, not its successor, claims the backlog;
      // the successor starts once it has stalled and takes its batch over.
      const stale = launch({ point: spec.point, action: 'stall' });
      const started = await startedThen(stale, 'stall', budget);
      if (started.outcome !== 'line') {
        const what =
          started.outcome === 'exited'
            ? 'exited'
            : started.outcome === 'no start'
              ? `did not start within ${seconds(started.waitedMs)}${cutNote(started.cut)}`
              : `did not stall within ${seconds(started.waitedMs)} after it reported ready${cutNote(started.cut)}`;
        throw new Error(`the stale worker ${what}\n${describeChildren()}`);
      }
      launch(null);
      await new Promise((resolve) => setTimeout(resolve, tuning.leaseMs * 1.6));
      stale.process.kill('SIGCONT');
    } else if (spec.action === 'crash-loop') {
      // Every worker that starts the target dies, until the inbox's start count marks it poison.
      for (let round = 0; round < tuning.maxCrashes; round += 1) {
        await expectKilled(launch({ point: spec.point, action: 'kill', target: target! }));
      }
      // A copy the relay published again (its process died before marking the row) comes
      // as a first delivery: it runs beside others, and its death is not counted. So more
      // than `maxCrashes` workers may die before one parks the message; keep starting
      // armed workers while they die at the point (bounded by the copies there can be).
      void (async () => {
        for (let extra = 0; extra < EXTRA_CRASH_LOOP_WORKERS && !settled; extra += 1) {
          const child = launch({ point: spec.point, action: 'kill', target: target! });
          const exit = await child.exited;
          // Only the fault hook SIGKILLs a worker before the run settles (its `kill` line may
          // not reach the pipe before the signal does, so the signal is what counts).
          if (settled || exit.signal !== 'SIGKILL') return;
        }
      })();
    } else if (spec.action === 'late-kills') {
      // Killed at once with the message in hand, then `maxCrashes` times more, each after
      // its run alone outlived the crash window; then a worker is left to handle it.
      await expectKilled(launch({ point: spec.point, action: 'kill', target: target! }));
      for (let round = 0; round < tuning.maxCrashes; round += 1) {
        await expectKilled(launch({ point: spec.point, action: 'late-kill', target: target! }));
      }
      launch(null);
    } else if (spec.action === 'applied-kills') {
      // Killed after the target's commit, then again on its redeliveries while they reach
      // the point, `maxCrashes` kills in all; then an unarmed worker. A redelivery that
      // (rightly) never reaches the point again leaves its worker alive to finish the run.
      await expectKilled(launch({ point: spec.point, action: 'kill', target: target! }));
      void (async () => {
        for (let kills = 1; kills < tuning.maxCrashes && !settled; kills += 1) {
          const child = launch({ point: spec.point, action: 'kill', target: target! });
          const exit = await child.exited;
          // Only the fault hook SIGKILLs a worker before the run settles (its `kill` line may
          // not reach the pipe before the signal does, so the signal is what counts).
          if (settled || exit.signal !== 'SIGKILL') return;
        }
        if (!settled) launch(null);
      })();
    } else {
      await expectKilled(launch({ point: spec.point, action: 'kill', ...(target !== undefined ? { target } : {}) }));
      launch(null);
    }

    const idle = budget.wait(options.timeoutMs ?? SETTLE_IDLE_MS);
    const most = budget.wait(Math.max(options.timeoutMs ?? 0, SETTLE_MAX_MS));
    const { report, observed } = await settle(world, ledger, store, transport.transport, tuning.ordered, idle.ms, { transport, maxMs: most.ms })
      .catch((error: unknown) => {
        throw new Error(`${String(error)}${settleCutNote('the survivors were', most)}\n${describeChildren()}`);
      })
      .finally(() => {
        settled = true;
      });
    // Completions a worker saw touch rows it never had confirmed (see createWorkerBus).
    const violations = children.flatMap((child) => child.output.filter((line) => line.startsWith('violation ')).map((line) => line.slice('violation '.length)));
    const problems = [...report.problems, ...violations];
    return { ...report, problems, seed: options.seed, testId, observed, target, workersStarted: children.length, relayPauses: 0, faultFired: true };
  } finally {
    await Promise.all(children.map((child) => stopChild(child)));
    await transport.close().catch(() => undefined);
    await store.close().catch(() => undefined);
  }
}
