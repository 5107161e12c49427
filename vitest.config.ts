import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

// One project per workspace package, each defined by the package's own vitest.config.ts.
export default defineConfig({
  test: {
    projects: ['packages/*/vitest.config.ts', 'plugins/*/vitest.config.ts', 'conformance/vitest.config.ts', 'examples/*/vitest.config.ts', 'e2e/vitest.config.ts'],
    // Test files spend most of their time waiting on brokers, databases, leases and child
    // processes, not computing: vitest's default (cores - 1) ran one file at a time on the
    // 2-core CI machine. Three at once there: the whole suite passed in 1,356 s at load
    // 10–15 from other work, where one at a time took ~1,600–1,850 s (each test file uses
    // its own tables, queues and topics).
    maxWorkers: Math.max(3, availableParallelism() - 1),
  },
});
