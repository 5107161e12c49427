import { describe, expect, it } from 'vitest';
import { formatTally, runCase, type CaseTally } from '../src/support/run-cases.js';

class Skipped extends Error {}
const skipTest = (reason: string): never => {
  throw new Skipped(reason);
};
const setup = async () => ({ env: undefined, close: async () => {} });

type Env = { skip(reason: string): never } | undefined;

async function outcome(run: (env: Env) => Promise<void>, tally: CaseTally, useControls = false): Promise<void> {
  await runCase<Env>(
    { name: 'case', run: (env) => run(env) },
    useControls ? async (_context, controls) => ({ env: controls, close: async () => {} }) : setup,
    't0',
    skipTest,
    tally,
  ).catch(() => undefined);
}

describe('conformance case tally', () => {
  it('counts a failed case as ran and failed, a skipped one as skipped, each once', async () => {
    const tally: CaseTally = { ran: 0, failed: 0, skipped: 0 };
    await outcome(async () => {}, tally);
    await outcome(async () => {
      throw new Error('broken');
    }, tally);
    await outcome(async (env) => env!.skip('not supported'), tally, true);
    expect(tally).toEqual({ ran: 2, failed: 1, skipped: 1 });
    expect(formatTally('transport(x)', tally)).toBe('[conformance] transport(x): 2 cases ran (1 failed), 1 skipped');
  });

  it('counts a case whose close() fails after it passed as failed, not passed', async () => {
    const tally: CaseTally = { ran: 0, failed: 0, skipped: 0 };
    await runCase(
      { name: 'case', run: async () => {} },
      async () => ({
        env: undefined,
        close: async () => {
          throw new Error('close failed');
        },
      }),
      't1',
      skipTest,
      tally,
    ).catch(() => undefined);
    expect(tally).toEqual({ ran: 1, failed: 1, skipped: 0 });
  });
});
