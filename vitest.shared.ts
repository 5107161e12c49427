import { defineProject, type UserWorkspaceConfig } from 'vitest/config';

// Workspace packages resolve to their TypeScript sources through this custom export
// condition, so tests never need a build first. Both resolvers need it: vite's for the
// test files, the SSR one for modules loaded at run time.
export const sourceConditions = ['@courier/source'];

/**
 * The project config every package's `vitest.config.ts` uses: its tests in `test/`,
 * except `test/restart/`, which restarts servers and runs serially, last, from
 * `vitest.restart.config.ts`.
 */
export function courierProject(name: string, test: UserWorkspaceConfig['test'] = {}): UserWorkspaceConfig {
  return defineProject({
    resolve: { conditions: sourceConditions },
    ssr: { resolve: { conditions: sourceConditions } },
    test: {
      name,
      include: ['test/**/*.test.ts'],
      exclude: ['test/restart/**', '**/node_modules/**'],
      testTimeout: 30_000,
      hookTimeout: 60_000,
      ...test,
    },
  });
}
