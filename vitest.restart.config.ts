import { defineConfig } from 'vitest/config';
import { sourceConditions } from './vitest.shared.js';

// Scenarios that stop and start a server (PostgreSQL, RabbitMQ) cannot share the
// machine with other tests: they run here, one file at a time, after everything else.
export default defineConfig({
  resolve: { conditions: sourceConditions },
  ssr: { resolve: { conditions: sourceConditions } },
  test: {
    name: 'restart',
    include: ['{packages,plugins,conformance,examples}/*/test/restart/**/*.test.ts', 'conformance/test/restart/**/*.test.ts', 'e2e/test/restart/**/*.test.ts'],
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 120_000,
    passWithNoTests: true,
  },
});
