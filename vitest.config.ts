import { defineConfig } from 'vitest/config';

// Workspace packages resolve to their TypeScript sources through the custom export
// condition, so tests never need a build first. Both resolvers need it: vite's for
// the test files, the SSR one for modules loaded at run time.
const conditions = ['@courier/source'];

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions } },
  test: {
    projects: [
      { extends: true, test: { name: 'core', include: ['packages/core/test/**/*.test.ts'] } },
      { extends: true, test: { name: 'conformance', include: ['conformance/test/**/*.test.ts'] } },
    ],
  },
});
