// Run by test/run-cases.test.ts in a vitest process of its own (vitest.config.ts beside it):
// one case of each verdict, one of them timed out by vitest while its body goes on and
// completes before the suite ends, as an abandoned conformance case does.
import { describeCases } from '../../../src/support/run-cases.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describeCases(
  'tally-fixture',
  [
    { name: 'passes', run: async () => {} },
    {
      name: 'fails',
      run: async () => {
        throw new Error('broken on purpose');
      },
    },
    { name: 'skips', run: async (controls: { skip(reason: string): never }) => controls.skip('not supported here') },
    { name: 'times out', run: () => sleep(1_500) },
    // Outlives the abandoned case above, so its body has completed before the summary prints.
    { name: 'passes slowly', run: () => sleep(900) },
  ],
  async (_context, controls) => ({ env: controls, close: async () => {} }),
  1_000,
);
