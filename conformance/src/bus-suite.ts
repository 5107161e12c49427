import { FAULT_POINTS, type FaultPoint } from '@courier/core';
import { afterAll, describe, expect, it, type TestContext } from 'vitest';
import { runHaltReplayCase, runHaltScenario } from './bus/halt-scenario.js';
import { uniqueId } from './support/unique-id.js';
import { runProcessScenario, type ProcessFixtureOptions } from './bus/run-process-scenario.js';
import { runGivenUpWhileAppliedCase } from './bus/given-up-while-applied-case.js';
import { runReplayedDuplicateCase } from './bus/replay-case.js';
import { runHostileErrorHaltCase, runHostileErrorParkCase } from './bus/hostile-error-cases.js';
import { runAckAnswerLostCase, runAckNeverArrivedCase } from './bus/lost-ack-cases.js';
import { runOversizedDeadLetterCase, runSettleFailsOnceCase, type SettleFailsOnceOptions } from './bus/settle-failure-cases.js';
import { runInProcessScenario, type BusFactories, type InProcessCrashMode, type ScenarioResult } from './bus/run-scenario.js';
import { APPLIED_KILLS, LATE_KILLS, SCENARIOS, type ScenarioSpec } from './bus/scenarios.js';
import { seededRandom } from './bus/seeded-random.js';
import type { ScenarioTuning } from './bus/world.js';
import { countVerdict, formatTally, runCase, type CaseControls, type CaseTally } from './support/run-cases.js';

/** A process case starts several workers (tens of seconds each on a loaded 2-core machine), waits for each to die, then for the survivors to settle. */
const PROCESS_CASE_TIMEOUT_MS = 360_000;
/**
 * What a process case keeps back from vitest's timeout after the run's deadline (the
 * assertions and the case's bookkeeping). The run's own bounds — a worker's 120 s to start,
 * 90 s to its fault point, up to 3 or 4 workers one after another, then up to 240 s to
 * settle — add up to far more than the timeout; cut to the deadline, the run always ends
 * with its own diagnosis ("fault point … was never reached", "did not settle", with the
 * workers' output) rather than vitest's bare "Test timed out".
 */
const PROCESS_CASE_MARGIN_MS = 15_000;

/** The deadline of a process case that begins now (see {@link PROCESS_CASE_MARGIN_MS}). */
function processCaseDeadline(): number {
  return Date.now() + PROCESS_CASE_TIMEOUT_MS - PROCESS_CASE_MARGIN_MS;
}

/**
 * What an in-process case keeps back from vitest's timeout after the run's deadline (the
 * assertions). The run keeps its own reserve for its diagnosis and cleanup within that.
 */
const IN_PROCESS_CASE_MARGIN_MS = 5_000;

/** vitest's timeout of an in-process fault-point case, and of the longer ones (several crashes, random stress scenarios). */
const IN_PROCESS_CASE_TIMEOUT_MS = 90_000;
const IN_PROCESS_LONG_CASE_TIMEOUT_MS = 120_000;

/**
 * vitest's timeout of a lost-ack case: a consumer started (twice in one of them), a message
 * handled, and a redelivery that may wait for a Kafka session timeout or a lapsed lock.
 */
const LOST_ACK_CASE_TIMEOUT_MS = 120_000;

/**
 * vitest's timeout of a settle-failure case: a consumer started, two messages settled, one
 * of them after a failed settle, a pause and perhaps a lapsed lease or lock.
 */
const SETTLE_FAILURE_CASE_TIMEOUT_MS = 120_000;

/** The settle-failure cases: a kind of settle the broker fails once, on an unordered or ordered subscription (an in-place ordered retry writes nothing a broker could fail). */
const SETTLE_FAILURES: readonly SettleFailsOnceOptions[] = [
  { kind: 'ack', ordered: false },
  { kind: 'ack', ordered: true },
  { kind: 'retry', ordered: false },
  { kind: 'deadLetter', ordered: false },
  { kind: 'deadLetter', ordered: true },
];

// Case names, one definition each: `describeBus` registers its cases under them and
// `busCaseNames` lists them, so the kit README's list (checked by readme-cases.test.ts)
// cannot drift from what runs.
const inProcessCaseName = (point: FaultPoint): string => `${point}: ${SCENARIOS[point].description}`;
const haltCaseName = (action: 'retry' | 'park'): string =>
  `poison 'halt' on an ordered key: the key is held while others flow; resume '${action}' applies the rest in order, once each`;
const HALT_REPLAY_CASE = "poison 'halt' and a replayed dead letter: a replay that fails again halts its key as a replay; drained, it is applied, then what was held";
const LATE_KILLS_CASE = `crash-loop, not its fault: ${LATE_KILLS.description}`;
const APPLIED_KILLS_CASE = `killed after its commit: ${APPLIED_KILLS.description}`;
const REPLAYED_DUPLICATE_CASE = 'a replayed dead letter delivered twice runs once';
const GIVEN_UP_CASE = 'a copy given up on while another copy is applied: applied once, replays included';
const HOSTILE_PARK_CASE =
  "a handler error of ~100 KiB holding U+0000 and a lone surrogate, poison 'park': a listable dead letter with the error cut and sanitised; the key's next message is applied";
const HOSTILE_HALT_CASE = "the same handler error, poison 'halt' on an ordered key: the key is halted and listed with the error cut and sanitised, and resumable";
const ACK_ANSWER_LOST_CASE = "an ack that reached the broker but whose answer was lost: applied once, not retried, dead-lettered or settled again; the key's next message is applied";
const ACK_ANSWER_LOST_HALT_CASE = "an ack that reached the broker but whose answer was lost, ordered with poison 'halt': the key is not halted; its next message is applied";
const ACK_NEVER_ARRIVED_CASE = 'an ack that never reached the broker: the message comes back and is acknowledged as a duplicate, applied once, nothing retried or dead-lettered';
const settleFailureCaseName = (failure: SettleFailsOnceOptions): string =>
  `a${failure.kind === 'ack' ? 'n' : ''} ${failure.kind} the broker fails once${failure.ordered ? ', ordered' : ''}: the message is not lost or applied twice, and its key's next message runs`;
const OVERSIZED_DEAD_LETTER_CASE = "a dead letter too large for the broker (a payload of maxMessageBytes, a 1 MiB error): it is dead-lettered whole and listed, and its key's next message runs";
const processCaseName = (point: FaultPoint): string => `${point}: killed there`;
const LATE_KILLS_PROCESS_CASE = 'crash-loop, not its fault: killed from outside after the window';
const SCENARIO_COVERAGE_CASE = 'has a scenario for every fault point';

/**
 * Every case name `describeBus` registers, in its order, stress runs left out (`random
 * scenario #N`, as many as asked). The process-level (SIGKILL) cases are the 14 from
 * `FAULT_POINTS` on (one per fault point, then the late-kills and applied-kills cases, the
 * last named as its in-process twin); a skipped one adds ` — skipped: <reason>` to its name.
 */
export const busCaseNames: {
  readonly inProcess: readonly string[];
  readonly beside: readonly string[];
  readonly process: readonly string[];
} = {
  inProcess: [
    ...FAULT_POINTS.map(inProcessCaseName),
    haltCaseName('retry'),
    haltCaseName('park'),
    HALT_REPLAY_CASE,
    LATE_KILLS_CASE,
    APPLIED_KILLS_CASE,
  ],
  beside: [
    SCENARIO_COVERAGE_CASE,
    REPLAYED_DUPLICATE_CASE,
    GIVEN_UP_CASE,
    HOSTILE_PARK_CASE,
    HOSTILE_HALT_CASE,
    ACK_ANSWER_LOST_CASE,
    ACK_ANSWER_LOST_HALT_CASE,
    ACK_NEVER_ARRIVED_CASE,
    ...SETTLE_FAILURES.map(settleFailureCaseName),
    OVERSIZED_DEAD_LETTER_CASE,
  ],
  process: [...FAULT_POINTS.map(processCaseName), LATE_KILLS_PROCESS_CASE, APPLIED_KILLS_CASE],
};

/** The deadline of an in-process case that begins now and that vitest times out after `timeoutMs`. */
function inProcessCaseDeadline(timeoutMs: number): number {
  return Date.now() + timeoutMs - IN_PROCESS_CASE_MARGIN_MS;
}

/** Options of {@link describeBus}. */
export interface BusSuiteOptions {
  /**
   * In-process crash mode. `freeze` abandons the worker mid-operation (its open
   * transactions stay open forever), which is right for stores whose transactions hold no
   * locks (in-memory); real databases use `throw` in-process and SIGKILL in `process`.
   */
  readonly inProcess?: InProcessCrashMode;
  /** Run the process-level (SIGKILL) scenarios with this fixture module. Omit to skip them, stating why. */
  readonly process?: ProcessFixtureOptions;
  /** Why there is no process fixture (printed with the skip). */
  readonly processSkipReason?: string;
  /**
   * Whether to run the consumer-side cases beside the fault-point scenarios (replayed and
   * given-up copies, hostile handler errors, lost acks, settle failures, an oversized dead
   * letter). Default true. A suite that varies only the relay — another outbox store on a
   * database, transport and inbox that a suite of its own already runs these cases on — may
   * leave them out; they exercise the consumer and the inbox, which it does not change. The
   * fault-point scenarios (in-process, SIGKILL, stress) always run.
   */
  readonly consumerCases?: boolean;
  /** Engine tuning for every scenario. */
  readonly tuning?: Partial<ScenarioTuning>;
  /** Stress runs: random seeds, keys, batch sizes and fault points. Default from `COURIER_STRESS_RUNS` or 2; 0 runs none. */
  readonly stressRuns?: number;
}

/**
 * The late-kills scenario's window: short, so each run alone outlives it in under a
 * second; the handler itself takes milliseconds, so a kill that came within the window
 * would still be counted (the crash-loop scenario keeps the default window).
 */
const LATE_KILLS_TUNING = { crashWindowMs: 500 } as const;

function failWith(result: ScenarioResult, what: string): string {
  return `${what} (seed ${result.seed}, test ${result.testId}): ${result.problems.join('; ')}`;
}

function assertScenario(spec: ScenarioSpec, result: ScenarioResult): void {
  if (spec.action === 'late-kills') {
    // First, as a consumer that blames such kills parks the message before the last kill.
    const dead = result.observed.consumerDead.map((letter) => `${letter.envelope.messageId}: ${letter.reason.code} ${letter.reason.message}`);
    expect(dead, 'a message killed only after its crash window must not be dead-lettered').toEqual([]);
  }
  const why =
    spec.action === 'duplicate'
      ? ': the second copy never reached the consumer — a broker that drops a re-published messageId must give its fixture injectDuplicate()'
      : '';
  expect(result.faultFired, `the fault at '${spec.point}' never happened (seed ${result.seed})${why}`).toBe(true);
  expect(result.problems, failWith(result, 'invariants')).toEqual([]);
  expect(result.applied + result.deadLettered + result.halted).toBe(result.committed);
  switch (spec.action) {
    case 'poison': {
      const letter = result.observed.consumerDead.find((dead) => dead.envelope.messageId === result.target);
      expect(letter, `poison message ${result.target} must be dead-lettered`).toBeDefined();
      expect(letter?.reason.code).toBe('ATTEMPTS_EXHAUSTED');
      break;
    }
    case 'crash-loop': {
      const letter = result.observed.consumerDead.find((dead) => dead.envelope.messageId === result.target);
      expect(letter, `crash-loop message ${result.target} must be dead-lettered`).toBeDefined();
      expect(letter?.reason.code).toBe('CRASH_LOOP');
      expect(result.deadLettered).toBe(1);
      break;
    }
    case 'late-kills':
      // Killed from outside each time after its window: not poison, so handled once.
      expect(result.observed.effects.filter((id) => id === result.target)).toHaveLength(1);
      expect(result.deadLettered).toBe(0);
      break;
    case 'applied-kills': {
      // Applied by its first run: a dead letter of it would be a second end state.
      const dead = result.observed.consumerDead.map((letter) => `${letter.envelope.messageId}: ${letter.reason.code} ${letter.reason.message}`);
      expect(dead, 'a message killed only after its commit must not be dead-lettered').toEqual([]);
      expect(result.observed.effects.filter((id) => id === result.target)).toHaveLength(1);
      break;
    }
    case 'duplicate':
      expect(result.observed.effects.filter((id) => id === result.target)).toHaveLength(1);
      expect(result.deadLettered).toBe(0);
      break;
    default:
      // Crashes, stalls and outages may duplicate deliveries but must not dead-letter:
      // the relay allows one attempt, so a burned attempt would show here.
      expect(result.deadLettered, failWith(result, 'nothing may be dead-lettered')).toBe(0);
  }
}

/** Whether the in-process variant of a scenario can run on these fixtures, or why not. */
interface Features {
  readonly brokerOutage: boolean;
  readonly databaseOutage: boolean;
  readonly deadLetters: boolean;
}

/** Why a scenario cannot run on any crash mode with these fixtures, or undefined. */
function featureSkip(spec: ScenarioSpec, features: Features): string | undefined {
  if ((spec.action === 'poison' || spec.action === 'crash-loop' || spec.action === 'late-kills' || spec.action === 'applied-kills') && !features.deadLetters) {
    return 'the transport has no deadLetters (nativeDeadLetter: false), so the consumer dead letter that ends this scenario cannot be read';
  }
  return undefined;
}

function inProcessSkip(spec: ScenarioSpec, mode: InProcessCrashMode, features: Features): string | undefined {
  const skip = featureSkip(spec, features);
  if (skip) return skip;
  if ((spec.action === 'crash-loop' || spec.action === 'late-kills' || spec.action === 'applied-kills') && mode === 'throw') return 'a thrown error is a handled failure, not a crash: crash loops need freeze or SIGKILL';
  if (spec.action === 'broker-outage' && !features.brokerOutage) return 'the transport fixture has no outage() to take the broker away';
  if (spec.action === 'database-outage' && !features.databaseOutage) return 'the store fixture has no outage() to take the database away';
  return undefined;
}

/**
 * The end-to-end suite: a bus over the given store and transport, with a scenario for
 * every fault point, run in-process and (given a fixture module) as SIGKILLed child
 * processes, then a stress mode with random seeds that prints each seed.
 *
 * After every scenario the invariants hold: each committed message applied once,
 * dead-lettered, or held on a halted key; nothing rolled back is delivered; per-key
 * order of effects kept; counts reconcile.
 */
export function describeBus<Tx>(name: string, factories: BusFactories<Tx>, options: BusSuiteOptions = {}): void {
  const mode = options.inProcess ?? 'throw';
  const suite = `bus(${name})`;
  let features: Features | undefined;
  const probeFeatures = async () => {
    if (features) return features;
    const context = { testId: 'tprobe' };
    const store = await factories.store(context);
    const transport = await factories.transport(context);
    features = { brokerOutage: transport.outage !== undefined, databaseOutage: store.outage !== undefined, deadLetters: transport.transport.deadLetters !== undefined };
    await transport.close();
    await store.close();
    return features;
  };
  const tally: CaseTally = { ran: 0, failed: 0, skipped: 0 };
  // Every case counts once, by vitest's verdict, as ran (passed or failed) or skipped, as the port suites do.
  const tracked =
    (body: (skip: (reason: string) => never) => Promise<void>) =>
    (context: TestContext): Promise<void> => {
      countVerdict(context, tally);
      return runCase<CaseControls>(
        { name: '', run: (controls) => body((reason) => controls.skip(reason)) },
        async (_context, controls) => ({ env: controls, close: async () => {} }),
        '',
        (reason) => context.skip(reason),
      );
    };

  describe(suite, () => {
    afterAll(() => {
      console.log(formatTally(suite, tally));
    });

    it(SCENARIO_COVERAGE_CASE, tracked(async () => {
      const missing = FAULT_POINTS.filter((point: FaultPoint) => SCENARIOS[point]?.point !== point);
      expect(missing).toEqual([]);
    }));

    describe(`in-process (${mode})`, () => {
      for (const point of FAULT_POINTS) {
        const spec = SCENARIOS[point];
        it(inProcessCaseName(point), tracked(async (skipCase) => {
          const deadline = inProcessCaseDeadline(IN_PROCESS_CASE_TIMEOUT_MS);
          const skip = inProcessSkip(spec, mode, await probeFeatures());
          if (skip) return skipCase(skip);
          const seed = Math.floor(Math.random() * 2 ** 31);
          const result = await runInProcessScenario(factories, spec, mode, { seed, deadline, ...(options.tuning ? { tuning: options.tuning } : {}) });
          assertScenario(spec, result);
        }), IN_PROCESS_CASE_TIMEOUT_MS);
      }
      for (const action of ['retry', 'park'] as const) {
        it(haltCaseName(action), tracked(async (skipCase) => {
          const testId = uniqueId();
          const skip = await runHaltScenario(factories, action, testId);
          if (skip) return skipCase(skip);
        }), 90_000);
      }
      it(HALT_REPLAY_CASE, tracked(async (skipCase) => {
        const skip = await runHaltReplayCase(factories, uniqueId());
        if (skip) return skipCase(skip);
      }), 90_000);
      it(LATE_KILLS_CASE, tracked(async (skipCase) => {
        const deadline = inProcessCaseDeadline(IN_PROCESS_LONG_CASE_TIMEOUT_MS);
        const skip = inProcessSkip(LATE_KILLS, mode, await probeFeatures());
        if (skip) return skipCase(skip);
        const seed = Math.floor(Math.random() * 2 ** 31);
        const result = await runInProcessScenario(factories, LATE_KILLS, mode, { seed, deadline, tuning: { ...options.tuning, ...LATE_KILLS_TUNING } });
        assertScenario(LATE_KILLS, result);
      }), IN_PROCESS_LONG_CASE_TIMEOUT_MS);
      it(APPLIED_KILLS_CASE, tracked(async (skipCase) => {
        const deadline = inProcessCaseDeadline(IN_PROCESS_LONG_CASE_TIMEOUT_MS);
        const skip = inProcessSkip(APPLIED_KILLS, mode, await probeFeatures());
        if (skip) return skipCase(skip);
        const seed = Math.floor(Math.random() * 2 ** 31);
        const result = await runInProcessScenario(factories, APPLIED_KILLS, mode, { seed, deadline, ...(options.tuning ? { tuning: options.tuning } : {}) });
        assertScenario(APPLIED_KILLS, result);
      }), IN_PROCESS_LONG_CASE_TIMEOUT_MS);
    });

    // Left out as a group (not skipped one by one): the suite that owns them runs them.
    if (options.consumerCases !== false) describeConsumerCases(factories, tracked);

    describe('process-level (SIGKILL)', () => {

      for (const point of FAULT_POINTS) {
        const spec = SCENARIOS[point];
        const reason = options.process ? undefined : (options.processSkipReason ?? 'no process fixture module was given');
        if (reason !== undefined) tally.skipped += 1;
        it.skipIf(reason !== undefined)(`${processCaseName(point)}${reason ? ` — skipped: ${reason}` : ''}`, tracked(async (skipCase) => {
          const deadline = processCaseDeadline();
          const skip = featureSkip(spec, await probeFeatures());
          if (skip) return skipCase(skip);
          const seed = Math.floor(Math.random() * 2 ** 31);
          const result = await runProcessScenario<Tx>(spec, options.process!, { seed, deadline, ...(options.tuning ? { tuning: options.tuning } : {}) });
          // In process mode every point is a crash (SIGKILL or, for the stall, SIGSTOP).
          assertScenario(spec.action === 'stall' || spec.action === 'poison' || spec.action === 'crash-loop' ? spec : { ...spec, action: 'crash' }, result);
        }), PROCESS_CASE_TIMEOUT_MS);
      }
      {
        const reason = options.process ? undefined : (options.processSkipReason ?? 'no process fixture module was given');
        if (reason !== undefined) tally.skipped += 1;
        it.skipIf(reason !== undefined)(`${LATE_KILLS_PROCESS_CASE}${reason ? ` — skipped: ${reason}` : ''}`, tracked(async (skipCase) => {
          const deadline = processCaseDeadline();
          const skip = featureSkip(LATE_KILLS, await probeFeatures());
          if (skip) return skipCase(skip);
          const seed = Math.floor(Math.random() * 2 ** 31);
          const result = await runProcessScenario<Tx>(LATE_KILLS, options.process!, { seed, deadline, tuning: { ...options.tuning, ...LATE_KILLS_TUNING } });
          assertScenario(LATE_KILLS, result);
        }), PROCESS_CASE_TIMEOUT_MS);
      }
      {
        const reason = options.process ? undefined : (options.processSkipReason ?? 'no process fixture module was given');
        if (reason !== undefined) tally.skipped += 1;
        it.skipIf(reason !== undefined)(`${APPLIED_KILLS_CASE}${reason ? ` — skipped: ${reason}` : ''}`, tracked(async (skipCase) => {
          const deadline = processCaseDeadline();
          const skip = featureSkip(APPLIED_KILLS, await probeFeatures());
          if (skip) return skipCase(skip);
          const seed = Math.floor(Math.random() * 2 ** 31);
          const result = await runProcessScenario<Tx>(APPLIED_KILLS, options.process!, { seed, deadline, ...(options.tuning ? { tuning: options.tuning } : {}) });
          assertScenario(APPLIED_KILLS, result);
        }), PROCESS_CASE_TIMEOUT_MS);
      }
    });

    const runs = options.stressRuns ?? Number(process.env['COURIER_STRESS_RUNS'] ?? 2);
    // vitest fails an empty describe: with no stress runs there is none.
    if (runs > 0) describe('stress', () => {
      const fixedSeed = process.env['COURIER_STRESS_SEED'];
      for (let run = 0; run < runs; run += 1) {
        it(`random scenario #${run + 1}`, tracked(async () => {
          const deadline = inProcessCaseDeadline(IN_PROCESS_LONG_CASE_TIMEOUT_MS);
          const seed = fixedSeed !== undefined ? Number(fixedSeed) + run : Math.floor(Math.random() * 2 ** 31);
          const next = seededRandom(seed);
          const features = await probeFeatures();
          const candidates = FAULT_POINTS.filter((point) => !inProcessSkip(SCENARIOS[point], mode, features));
          const point = candidates[Math.floor(next() * candidates.length)]!;
          const spec = SCENARIOS[point];
          const tuning: Partial<ScenarioTuning> = { ...options.tuning, batchSize: 1 + Math.floor(next() * 20), concurrency: 1 + Math.floor(next() * 8) };
          const plan = { messages: 20 + Math.floor(next() * 40), keys: 1 + Math.floor(next() * 8), perTransaction: 1 + Math.floor(next() * 5) };
          console.log(`[conformance] ${suite} stress #${run + 1}: seed ${seed} point '${point}' (replay with COURIER_STRESS_SEED=${seed - run})`);
          const result = await runInProcessScenario(factories, spec, mode, { seed, deadline, tuning, plan });
          assertScenario(spec, result);
        }), IN_PROCESS_LONG_CASE_TIMEOUT_MS);
      }
    });
  });
}

/** The consumer-side cases `describeBus` runs beside its fault-point scenarios (see `BusSuiteOptions.consumerCases`). */
function describeConsumerCases<Tx>(
  factories: BusFactories<Tx>,
  tracked: (body: (skip: (reason: string) => never) => Promise<void>) => (context: TestContext) => Promise<void>,
): void {
  it(REPLAYED_DUPLICATE_CASE, tracked((skipCase) => runReplayedDuplicateCase(factories, skipCase)), 120_000);

  it(GIVEN_UP_CASE, tracked((skipCase) => runGivenUpWhileAppliedCase(factories, skipCase)), 120_000);

  it(
    HOSTILE_PARK_CASE,
    tracked((skipCase) => runHostileErrorParkCase(factories, skipCase)),
    120_000,
  );

  it(
    HOSTILE_HALT_CASE,
    tracked((skipCase) => runHostileErrorHaltCase(factories, skipCase)),
    120_000,
  );

  it(
    ACK_ANSWER_LOST_CASE,
    tracked((skipCase) => runAckAnswerLostCase(factories, skipCase, { orderedHalt: false }, inProcessCaseDeadline(LOST_ACK_CASE_TIMEOUT_MS))),
    LOST_ACK_CASE_TIMEOUT_MS,
  );

  it(
    ACK_ANSWER_LOST_HALT_CASE,
    tracked((skipCase) => runAckAnswerLostCase(factories, skipCase, { orderedHalt: true }, inProcessCaseDeadline(LOST_ACK_CASE_TIMEOUT_MS))),
    LOST_ACK_CASE_TIMEOUT_MS,
  );

  it(
    ACK_NEVER_ARRIVED_CASE,
    tracked(() => runAckNeverArrivedCase(factories, inProcessCaseDeadline(LOST_ACK_CASE_TIMEOUT_MS))),
    LOST_ACK_CASE_TIMEOUT_MS,
  );

  for (const failure of SETTLE_FAILURES) {
    it(
      settleFailureCaseName(failure),
      tracked((skipCase) => runSettleFailsOnceCase(factories, skipCase, failure, inProcessCaseDeadline(SETTLE_FAILURE_CASE_TIMEOUT_MS))),
      SETTLE_FAILURE_CASE_TIMEOUT_MS,
    );
  }

  it(
    OVERSIZED_DEAD_LETTER_CASE,
    tracked(() => runOversizedDeadLetterCase(factories, inProcessCaseDeadline(SETTLE_FAILURE_CASE_TIMEOUT_MS))),
    SETTLE_FAILURE_CASE_TIMEOUT_MS,
  );
}
