import { defineConfig } from 'vitest/config';

// The tally fixture's own run (test/run-cases.test.ts starts it): one file, no reporter noise.
export default defineConfig({
  test: { include: ['tally.fixture.ts'], reporters: ['default'], silent: false },
});
