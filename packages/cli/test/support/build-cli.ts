// Vitest globalSetup of the CLI tests: compiles the `courier` binary and the workspace
// packages it and the test configs load (core, cli, sql-engine, mikro-orm, pg, pg-logical, rabbitmq) to JavaScript in
// each package's `dist/`, once per test run, so every child process starts plain Node on
// compiled code, as an installed `courier` does, instead of compiling the sources through
// tsx at each start (seconds of CPU per run on this machine). Only the config stays
// TypeScript, loaded by the CLI's own `tsImport`, as a user's `courier.config.ts` is.
//
// esbuild transpiles file by file (no bundle, no type check: `pnpm typecheck` does that),
// so the layout and module graph are those of `tsc -p tsconfig.build.json`: one copy of
// `@courier/core` on disk for the CLI and the stores the config builds. (Not one module
// instance: tsx's `tsImport` loads the config's imports under a namespace of their own, so
// the CLI reads their errors by shape: src/diagnose.ts; core's own error classes match across
// copies by `instanceof`, errors.ts.) It rebuilds every time: a dist/ left from an older source
// would test old code. The console's front end is built by Vite into dist/console/ as `pnpm build` does.
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { build } from 'esbuild';
import { build as buildConsole } from 'vite';
import { PACKAGE_DIR } from './run-cli.js';

const ROOT = join(PACKAGE_DIR, '..', '..');
/** Every workspace package a child process loads: the CLI, what it imports, and what the test configs import (the MikroORM and node-postgres stores sit on @courier/sql-engine). */
const PACKAGES = ['packages/core', 'packages/cli', 'packages/sql-engine', 'plugins/mikro-orm', 'plugins/pg', 'plugins/pg-logical', 'plugins/rabbitmq'];

function sources(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile() && entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts'))
    .map((entry) => join(entry.parentPath, entry.name));
}

export default async function buildCli(): Promise<void> {
  const started = performance.now();
  await Promise.all(
    PACKAGES.map((dir) => {
      const src = join(ROOT, dir, 'src');
      return build({
        entryPoints: sources(src),
        outdir: join(ROOT, dir, 'dist'),
        outbase: src,
        format: 'esm',
        platform: 'node',
        target: 'node20',
        bundle: false,
        tsconfig: join(ROOT, dir, 'tsconfig.build.json'),
        logLevel: 'error',
      });
    }),
  );
  // The console's front end, as `pnpm build` bundles it into dist/console/ (about a second).
  await buildConsole({ configFile: join(PACKAGE_DIR, 'console', 'vite.config.mjs'), logLevel: 'error' });
  console.log(`[cli tests] compiled ${PACKAGES.join(', ')} to dist/ in ${Math.round(performance.now() - started)} ms`);
}
