// Runs @courier/mikro-orm's own test files (plugins/mikro-orm/test) with MikroORM 7.2.1,
// which this private package installs, where the plugin's package pins 6.6.16 for its own
// tests. Not named vitest.config.ts: the root config's project glob would otherwise add it
// to `pnpm test`, which runs the plugin on 6; CI runs it as a step of its own
// (`pnpm --filter @courier/mikro-orm-7-tests test`).
//
// Two resolvers load MikroORM: vite's, for the files vitest transforms (the plugin's sources
// and tests), redirected by the plugin below; and Node's, for what those files load with
// `createRequire` and for the processes tests start, redirected by resolve-mikro-orm-7.mjs.
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { defineConfig, type Plugin } from 'vitest/config';
import { sourceConditions } from '../../vitest.shared.js';

const here = fileURLToPath(new URL('.', import.meta.url));
const requireHere = createRequire(`${here}package.json`);
const hooks = new URL('./resolve-mikro-orm-7.mjs', import.meta.url).href;
process.env['NODE_OPTIONS'] = `${process.env['NODE_OPTIONS'] ?? ''} --import ${hooks}`.trim();

const mikroOrm7: Plugin = {
  name: 'courier-mikro-orm-7',
  enforce: 'pre',
  resolveId(source) {
    return source.startsWith('@mikro-orm/') ? requireHere.resolve(source) : undefined;
  },
};

/**
 * The test files that CI runs on MikroORM 7: @courier/mikro-orm's conformance kit on
 * PostgreSQL, MariaDB (both drivers) and SQLite and its unit-of-work tests (nested
 * transactions, savepoints, the misuse checks) on all four; @courier/sql-transport's
 * conformance on the three databases. `COURIER_MIKRO_ORM_7_ALL=1` runs every test file of both.
 */
const ESSENTIAL: Record<'mikro-orm' | 'sql-transport', string[]> = {
  'mikro-orm': [
    'test/conformance-postgres.test.ts',
    'test/conformance-mariadb.test.ts',
    'test/conformance-mysql-driver.test.ts',
    'test/conformance-sqlite.test.ts',
    'test/unit-of-work.test.ts',
  ],
  'sql-transport': ['test/fixture-bounds.test.ts', 'test/conformance-postgresql.test.ts', 'test/conformance-mariadb.test.ts', 'test/conformance-sqlite.test.ts'],
};

function project(plugin: keyof typeof ESSENTIAL) {
  return {
    root: fileURLToPath(new URL(`../${plugin}/`, import.meta.url)),
    plugins: [mikroOrm7],
    resolve: { conditions: sourceConditions },
    ssr: { resolve: { conditions: sourceConditions } },
    test: {
      name: `${plugin} on MikroORM 7`,
      include: process.env['COURIER_MIKRO_ORM_7_ALL'] === '1' ? ['test/**/*.test.ts'] : ESSENTIAL[plugin],
      exclude: ['test/restart/**', '**/node_modules/**'],
      testTimeout: 30_000,
      hookTimeout: 60_000,
    },
  };
}

export default defineConfig({
  test: { projects: [project('mikro-orm'), project('sql-transport')] },
});
