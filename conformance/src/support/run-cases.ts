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
 * Runs one case against a fresh environment and records its outcome in `tally` exactly
 * once: skipped (it, or its setup, called `skip`), failed (setup, the case or `close`
 * threw), or passed. Rethrows what the case threw, so the test runner sees it too.
 */
export async function runCase<Env>(
  testCase: SuiteCase<Env>,
  setup: CaseSetup<Env>,
  testId: string,
  skipTest: (reason: string) => never,
  tally: CaseTally,
): Promise<void> {
  let skipped = false;
  let outcome: 'passed' | 'failed' | 'skipped' = 'failed';
  const controls: CaseControls = {
    testId,
    skip: (reason: string): never => {
      skipped = true;
      return skipTest(reason);
    },
  };
  try {
    const { env, close } = await setup({ testId }, controls);
    try {
      await testCase.run(env);
    } finally {
      await close();
    }
    outcome = 'passed';
  } catch (error) {
    // A skip is thrown by the runner's skip(); a failing close() after a skip is still a failure.
    outcome = skipped ? 'skipped' : 'failed';
    throw error;
  } finally {
    if (outcome === 'skipped') tally.skipped += 1;
    else {
      tally.ran += 1;
      if (outcome === 'failed') tally.failed += 1;
    }
  }
}

/** The summary line a suite prints after its cases: `<label>: N cases ran (F failed), M skipped`. */
export function formatTally(label: string, tally: CaseTally): string {
  return `[conformance] ${label}: ${tally.ran} cases ran (${tally.failed} failed), ${tally.skipped} skipped`;
}

/**
 * Registers one vitest `describe` running `cases`, each against a fresh environment made
 * by `setup` from a unique test id and closed after it, and logs how many ran, failed
 * and were skipped (a failed case counts as ran and failed, never as skipped).
 */
export function describeCases<Env>(label: string, cases: readonly SuiteCase<Env>[], setup: CaseSetup<Env>): void {
  describe(label, () => {
    const tally: CaseTally = { ran: 0, failed: 0, skipped: 0 };
    afterAll(() => {
      console.log(formatTally(label, tally));
    });
    for (const testCase of cases) {
      it(testCase.name, (context) => runCase(testCase, setup, uniqueId(), (reason) => context.skip(reason), tally));
    }
  });
}
