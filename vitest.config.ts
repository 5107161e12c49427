import { defineConfig } from 'vitest/config';

// One project per workspace package, each defined by the package's own vitest.config.ts.
export default defineConfig({
  test: {
    projects: ['packages/*/vitest.config.ts', 'plugins/*/vitest.config.ts', 'conformance/vitest.config.ts', 'examples/*/vitest.config.ts', 'e2e/vitest.config.ts'],
  },
});
