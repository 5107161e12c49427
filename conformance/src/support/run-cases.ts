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

/**
 * Registers one vitest `describe` running `cases`, each against a fresh environment made
 * by `setup` from a unique test id and closed after it, and logs how many ran.
 */
export function describeCases<Env>(
  label: string,
  cases: readonly SuiteCase<Env>[],
  setup: (context: FixtureContext, controls: CaseControls) => Promise<{ readonly env: Env; close(): Promise<void> }>,
): void {
  describe(label, () => {
    const tally = { ran: 0, skipped: 0 };
    afterAll(() => {
      console.log(`[conformance] ${label}: ${tally.ran} cases ran, ${tally.skipped} skipped`);
    });
    for (const testCase of cases) {
      it(testCase.name, async (context) => {
        const testId = uniqueId();
        const controls: CaseControls = {
          testId,
          skip: (reason: string): never => {
            tally.skipped += 1;
            return context.skip(reason);
          },
        };
        const { env, close } = await setup({ testId }, controls);
        try {
          await testCase.run(env);
          tally.ran += 1;
        } finally {
          await close();
        }
      });
    }
  });
}
