// 9. Time to ready: how long a relay-only and a consumer-only worker process (MikroORM on
// PostgreSQL + RabbitMQ, as users write them) take from spawn() to doing their job, phase
// by phase, against a bare node process that loads the same drivers and connects.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { URLS } from '../services.js';
import { onJsonLines } from '../startup/json-lines.js';
import { BenchBroker, openDb, OrderPlaced, seedBacklog, TOPIC } from '../setup.js';
import { median, type Scenario } from './context.js';

const BENCH_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const WORKER = join(BENCH_DIR, 'src', 'startup', 'startup-worker.mjs');
const CONSUMER = 'bench-startup';

/** What the child starts as; `tsx` runs the workspace sources through tsx, the others the built packages. */
type Mode = 'bare' | 'relay' | 'consumer' | 'consumer, MikroORM loaded with require' | 'consumer via tsx (sources)';

/** Milliseconds from spawn() to each mark the child printed, in order (and a draining relay's `drain.*` figures). */
export type Marks = ReadonlyMap<string, number>;

/** The built entry points plain `node` resolves @courier/* to. */
export function builtPackages(): boolean {
  return ['packages/core', 'plugins/mikro-orm', 'plugins/rabbitmq'].every((folder) => existsSync(join(BENCH_DIR, '..', folder, 'dist', 'index.js')));
}

/** How to start one worker process. */
export interface WorkerLaunch {
  readonly role: 'bare' | 'relay' | 'consumer';
  /** How the worker loads MikroORM (CommonJS): an ESM `import` (what most users write) or `require`. */
  readonly ormLoader?: 'import' | 'require';
  /** Run the workspace sources through tsx instead of the built packages. */
  readonly tsx?: boolean;
  /** Another build of @courier/mikro-orm to load (a path), for before/after comparisons. */
  readonly plugin?: string;
  /** Flags for `node` itself (e.g. V8 heap sizes), as a deployment would set them. */
  readonly nodeFlags?: readonly string[];
}

const LAUNCHES: Readonly<Record<Mode, WorkerLaunch>> = {
  bare: { role: 'bare' },
  relay: { role: 'relay' },
  consumer: { role: 'consumer' },
  'consumer, MikroORM loaded with require': { role: 'consumer', ormLoader: 'require' },
  'consumer via tsx (sources)': { role: 'consumer', tsx: true },
};

/**
 * The settings every startup worker takes (databases, its tables under `prefix`, the
 * broker's prefix, the message), with a mode's own ones in `extra`: one place, so the
 * relay-only drain, the start-up runs and the pipeline's workers cannot drift apart.
 */
export function workerConfig(prefix: string, brokerPrefix: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { pgUrl: URLS.postgresql, rabbitMqUrl: URLS.rabbitmq, tablePrefix: `${prefix}_`, ordersTable: `${prefix}_orders`, prefix: brokerPrefix, type: OrderPlaced.type, topic: TOPIC, ...extra };
}

/**
 * Spawns one worker and collects its marks (ms since spawn); rejects if it fails or takes
 * over `timeoutMs`. Without built packages every launch runs the sources through tsx.
 */
export function startWorker(launch: WorkerLaunch, config: Record<string, unknown>, built: boolean, timeoutMs = 120_000): Promise<Marks> {
  const execArgv = [...(launch.nodeFlags ?? []), ...(launch.tsx || !built ? ['--conditions=@courier/source', '--import', 'tsx'] : [])];
  const { role, ormLoader = 'import', plugin } = launch;
  const mode = `${role}${launch.tsx ? ' (tsx)' : ''}`;
  return new Promise((resolve, reject) => {
    const spawnedAt = performance.timeOrigin + performance.now();
    const child = spawn(process.execPath, [...execArgv, WORKER, JSON.stringify({ ...config, role, ormLoader, ...(plugin !== undefined ? { plugin } : {}) })], {
      cwd: BENCH_DIR,
      // Only what a worker of the example would get: no inherited --import or --conditions.
      env: { ...process.env, NODE_OPTIONS: '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const marks = new Map<string, number>();
    let done = false;
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    onJsonLines(
      child.stdout,
      (message) => {
        const parsed = message as { mark?: string; at?: number; done?: boolean; drain?: Record<string, number> };
        if (parsed.mark !== undefined && parsed.at !== undefined) marks.set(parsed.mark, parsed.at - spawnedAt);
        // A draining relay's figures (not times since spawn): `drain.seconds`, `drain.cpuSeconds`, `drain.maxRssMb`.
        for (const [name, value] of Object.entries(parsed.drain ?? {})) marks.set(`drain.${name}`, value);
        if (parsed.done) done = true;
      },
      (line) => {
        stderr += `${line}\n`;
      },
    );
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    child.once('error', reject);
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0 && done) resolve(marks);
      else reject(new Error(`${mode} worker exited with ${code ?? signal}${stderr ? `: ${stderr.trim().slice(-2_000)}` : ''}`));
    });
  });
}

/** The phases reported per role: [label, mark that ends it, mark that starts it]. */
const PHASES: readonly (readonly [string, string, string | null])[] = [
  ['node start (spawn → node bootstrapped)', 'node bootstrapped', null],
  ['entry script loaded (and --import preloads)', 'main', 'node bootstrapped'],
  ['import @courier/core', 'imported @courier/core', 'main'],
  ['import @mikro-orm/postgresql', 'imported @mikro-orm/postgresql', 'imported @courier/core'],
  ['import @courier/mikro-orm', 'imported @courier/mikro-orm', 'imported @mikro-orm/postgresql'],
  ['import @courier/rabbitmq (+ amqplib)', 'imported @courier/rabbitmq', 'imported @courier/mikro-orm'],
  ['MikroORM.init', 'MikroORM.init', 'imported @courier/rabbitmq'],
  ['stores, transport, bus', 'bus created', 'MikroORM.init'],
  ['bus.start()', 'bus.start', 'bus created'],
  ['first claim', 'first claim', 'bus.start'],
  ['first message published (connect, publish, confirm, complete)', 'first message published', 'first claim'],
];

/** Median duration of each phase over `runs` (phases a mode does not have are left out). */
export function phaseMedians(runs: readonly Marks[]): { label: string; ms: number }[] {
  const result: { label: string; ms: number }[] = [];
  for (const [label, end, begin] of PHASES) {
    if (!runs.every((marks) => marks.has(end) && (begin === null || marks.has(begin)))) continue;
    result.push({ label, ms: median(runs.map((marks) => marks.get(end)! - (begin === null ? 0 : marks.get(begin)!))) });
  }
  return result;
}

export const startupScenario: Scenario = {
  id: 9,
  name: 'time to ready: relay and consumer processes',
  services: ['postgresql', 'rabbitmq'],
  async run({ quick, prefix, report }) {
    const built = builtPackages();
    const rounds = quick ? 1 : 7;
    const modes: readonly Mode[] = quick
      ? ['bare', 'relay', 'consumer']
      : ['bare', 'relay', 'consumer', 'consumer, MikroORM loaded with require', 'consumer via tsx (sources)'];
    const db = await openDb('postgresql', { prefix, wakeups: false });
    const broker = new BenchBroker(prefix);
    try {
      // A rollout restarts workers onto existing tables and queues: create them first (the
      // relay's message needs a bound queue, or it is unroutable).
      await broker.declareSink();
      broker.track(CONSUMER);
      const transport = broker.transport();
      await transport.provision({ consumer: CONSUMER, topics: [TOPIC], ordered: false });
      await transport.close();
      const config = workerConfig(prefix, broker.prefix, { consumer: CONSUMER });
      const runs = new Map<Mode, Marks[]>(modes.map((mode) => [mode, []]));
      let seeded = 0;
      // Round 0 warms the file cache and the broker's connections; it is not counted (nor run
      // in quick mode, CI's smoke test, which keeps to a few seconds).
      for (let round = quick ? 1 : 0; round <= rounds; round += 1) {
        for (const mode of modes) {
          // The relay starts with one pending row, as after a rollout with work waiting.
          if (mode === 'relay') await seedBacklog(db, 1, { from: (seeded += 1) });
          const marks = await startWorker(LAUNCHES[mode], config, built);
          if (round > 0) runs.get(mode)!.push(marks);
        }
      }
      const ready = (mode: Mode) => median(runs.get(mode)!.map((marks) => marks.get('ready')!));
      const bareLabel = 'bare node: import pg + amqplib, connect both, SELECT 1, confirm channel';
      report.measure(bareLabel, ready('bare'), 'ms to ready');
      for (const mode of modes.filter((each) => each !== 'bare')) {
        const what = mode === 'relay' ? 'relay process: spawn → first message published' : `${mode} process: spawn → bus.start() resolved`;
        report.measure(what, ready(mode), 'ms to ready', { vs: bareLabel });
      }
      for (const mode of modes.filter((each) => each === 'relay' || each === 'consumer')) {
        const phases = phaseMedians(runs.get(mode)!);
        report.note(`${mode} phases (medians, ms): ${phases.map((phase) => `${phase.label} ${Math.round(phase.ms)}`).join(' · ')}`);
        console.log(`    ${mode} phases (medians, ms):\n${phases.map((phase) => `      ${String(Math.round(phase.ms)).padStart(6)}  ${phase.label}`).join('\n')}`);
      }
      report.note(
        `${quick ? 'one start per process kind (quick mode)' : `medians of ${rounds} starts per process kind, interleaved, after one uncounted round`}; ratios are × the bare process's time (lower is better). ` +
          (built
            ? `Plain \`node\` on the built packages (dist/, \`pnpm build\`), as users run them; the tsx line runs the workspace sources through tsx.`
            : `dist/ is not built, so every line ran the sources through tsx: run \`pnpm build\` for the numbers users see.`),
      );
    } finally {
      await broker.close();
      await db.close();
    }
  },
};
