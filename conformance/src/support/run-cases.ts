import { afterAll, describe, it } from 'vitest';
import type { FixtureContext } from '../fixtures.js';
import { uniqueId } from './unique-id.js';

/** What every case receives besides its port-specific environment. */
export interface CaseControls {
  /** This case's unique id; names of topics, consumers and keys derive from it. */
  readonly testId: string;
  /** Skips the case, stating why (every skip must say why). */
  skip(reason: string): never;
}

/** One named conformance case over an environment `Env`. */
export interface SuiteCase<Env> {
  readonly name: string;
  run(env: Env): Promise<void>;
}

/** How a suite's cases ended: `ran` counts passed and failed cases alike. */
export interface CaseTally {
  ran: number;
  failed: number;
  skipped: number;
}

/** Builds an environment for one case from its test id; `close` is awaited after the case. */
export type CaseSetup<Env> = (context: FixtureContext, controls: CaseControls) => Promise<{ readonly env: Env; close(): Promise<void> }>;

/**
 * Runs one case against a fresh environment: setup, the case, then `close` (awaited even
 * when the case threw). Rethrows what any of them threw, so the test runner sees it; a
 * failing `close()` fails a case that passed. `skipTest` is the runner's skip, which the
 * case (or its setup) reaches through `controls.skip`.
 */
export async function runCase<Env>(testCase: SuiteCase<Env>, setup: CaseSetup<Env>, testId: string, skipTest: (reason: string) => never): Promise<void> {
  const controls: CaseControls = { testId, skip: (reason: string): never => skipTest(reason) };
  const { env, close } = await setup({ testId }, controls);
  try {
    await testCase.run(env);
  } finally {
    await close();
  }
}

/** The part of vitest's test context {@link countVerdict} needs. */
export interface VerdictSource {
  onTestFinished(handler: (context: { readonly task: { readonly result?: { readonly state?: string } | undefined } }) => void): void;
}

/**
 * Records the runner's own verdict on the current test in `tally`, once, when the test
 * has finished: passed and failed count as ran (failed also as failed), a skip as skipped.
 * The verdict is vitest's, not the case's: a case vitest timed out is failed even if its
 * abandoned body later completes, so the summary line can never certify a failure.
 */
export function countVerdict(context: VerdictSource, tally: CaseTally): void {
  context.onTestFinished(({ task }) => {
    const state = task.result?.state;
    if (state === 'skip' || state === 'todo') tally.skipped += 1;
    else {
      tally.ran += 1;
      if (state !== 'pass') tally.failed += 1;
    }
  });
}

/**
 * vitest's timeout of one port-suite case whose single waits are bounded by `waitMs`: a case
 * may wait several times in a row (a kill, then the redelivery, then the next message), so
 * it gets six of them, and never less than a minute — vitest's own 5 s default timed out
 * most transport cases on a loaded machine before the case's bounded waits could say why.
 */
export function caseTimeoutMs(waitMs: number): number {
  return Math.max(60_000, 6 * waitMs);
}

/** The summary line a suite prints after its cases: `<label>: N cases ran (F failed), M skipped`. */
export function formatTally(label: string, tally: CaseTally): string {
  return `[conformance] ${label}: ${tally.ran} cases ran (${tally.failed} failed), ${tally.skipped} skipped`;
}

/**
 * Registers one vitest `describe` running `cases`, each against a fresh environment made
 * by `setup` from a unique test id and closed after it, and logs how many ran, failed
 * and were skipped, as vitest judged them (a timed-out case is failed; a failed case counts
 * as ran and failed, never as skipped). `timeoutMs` is each case's vitest timeout (absent:
 * the project's `testTimeout`).
 */
export function describeCases<Env>(label: string, cases: readonly SuiteCase<Env>[], setup: CaseSetup<Env>, timeoutMs?: number): void {
  describe(label, () => {
    const tally: CaseTally = { ran: 0, failed: 0, skipped: 0 };
    afterAll(() => {
      console.log(formatTally(label, tally));
    });
    for (const testCase of cases) {
      it(
        testCase.name,
        (context) => {
          countVerdict(context, tally);
          return runCase(testCase, setup, uniqueId(), (reason) => context.skip(reason));
        },
        timeoutMs,
      );
    }
  });
}
