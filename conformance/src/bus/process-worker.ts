// A worker process for the process-level scenarios: builds the fixtures from the module
// named in its configuration, runs a relay and a consumer, and kills itself (SIGKILL)
// or stops itself (SIGSTOP, for the stale-relay stall) at the armed fault point.
import { pathToFileURL } from 'node:url';
import type { FaultHook, FaultPoint } from '@courier/core';
import type { ProcessFixtureModule } from '../fixtures.js';
import { BUNDLED_FIXTURE } from './bundled-fixture.js';
import { crashWindowWatch, createWorkerBus, createWorld, envLogger, parkedAlready, type ScenarioTuning } from './world.js';

/** Configuration passed to a worker process in `COURIER_CONFORMANCE_WORKER` (JSON). */
export interface WorkerConfig {
  readonly module: string;
  readonly testId: string;
  readonly tuning: ScenarioTuning;
  /** `late-kill`: killed at the point once the consumer said the target's run alone outlived its crash window. */
  readonly fault: { readonly point: FaultPoint; readonly action: 'kill' | 'stall' | 'late-kill'; readonly target?: string } | null;
}

const raw = process.env['COURIER_CONFORMANCE_WORKER'];
if (!raw) {
  console.error('COURIER_CONFORMANCE_WORKER is not set: this script is started by the conformance suite');
  process.exit(2);
}
const config = JSON.parse(raw) as WorkerConfig;
// Run as a bundle (see worker-bundle.ts), the fixture module was evaluated with this script
// and left where the bundle's entry put it; importing it again would load a second copy.
const bundled = (globalThis as Record<symbol, unknown>)[BUNDLED_FIXTURE] as ProcessFixtureModule<unknown> | undefined;
const fixtureModule = bundled ?? ((await import(pathToFileURL(config.module).href)) as ProcessFixtureModule<unknown>);
const { store, transport } = await fixtureModule.createFixture({ testId: config.testId });
const world = createWorld(config.testId);
const fault = config.fault;
const windows = crashWindowWatch(envLogger());
let stalled = false;
const faults: FaultHook | undefined = fault
  ? async (point, at) => {
      if (point !== fault.point) return;
      if (fault.target !== undefined && !at.messageIds.includes(fault.target)) return;
      if (fault.action === 'stall') {
        if (stalled) return;
        stalled = true;
        process.stdout.write('stall\n');
        process.kill(process.pid, 'SIGSTOP');
        return;
      }
      if (point === 'crash-loop' && fault.action === 'kill' && fault.target !== undefined && (await parkedAlready(store.inbox, world.consumer, fault.target))) return;
      if (fault.action === 'late-kill' && fault.target !== undefined) {
        await windows.passed(fault.target, windows.seen(fault.target), config.tuning.crashWindowMs + 10_000);
      }
      process.stdout.write(`kill ${point}\n`);
      process.kill(process.pid, 'SIGKILL');
      await new Promise<never>(() => {});
    }
  : undefined;
// A completion of rows this worker never had confirmed is reported on stdout; the suite
// adds every such line to the scenario's problems.
const onViolation = (problem: string) => void process.stdout.write(`violation ${problem.replace(/\n/g, ' ')}\n`);
const bus = createWorkerBus(world, store, transport.transport, config.tuning, { ...(faults ? { faults, onViolation } : {}), logger: windows.logger });
await bus.start();
process.stdout.write('ready\n');

let stopping = false;
process.on('SIGTERM', () => {
  if (stopping) return;
  stopping = true;
  void (async () => {
    await bus.stop({ timeoutMs: 2_000 });
    await transport.close();
    await store.close();
    process.exit(0);
  })();
});
