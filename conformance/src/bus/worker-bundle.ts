// Worker processes of the process-level scenarios start many times per suite (every kill
// starts a fresh one). Through the tsx loader each start resolves and transforms every
// TypeScript module on Node's loader thread: measured on the 2-core CI machine, importing
// the MikroORM PostgreSQL fixture took 2.3 s of CPU (7–9 s wall at load 13) through tsx and
// 0.9 s (4–5 s) as one bundle. So TypeScript workers run as one esbuild bundle, written
// once per test file: the worker script and the fixture module with every source file they
// reach inlined, each installed package imported from the file it resolved to (node_modules
// code is not bundled: it is loaded as it would be, one copy per package), and
// `import.meta.url` of every inlined file kept as that file's own URL, so a module that finds
// things relative to itself behaves as under tsx.
import { createHash, randomUUID } from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, sep } from 'node:path';
import { pathToFileURL } from 'node:url';
import { build, type Plugin } from 'esbuild';
import { BUNDLED_FIXTURE } from './bundled-fixture.js';


const bundles = new Map<string, Promise<string>>();
/** Bundles live here, named by their content: test files that build the same bundle share one file. */
const BUNDLE_DIR = join(tmpdir(), 'courier-conformance-workers');
/** Bundles older than this are removed when a new one is written (test processes end without an exit hook). */
const KEEP_MS = 24 * 60 * 60 * 1000;

/**
 * One bundle of `workerScript` with `fixtureModule` (both absolute paths), resolved with the
 * package `conditions` the children would be started with; built once per process and
 * reused. Returns the bundle's path.
 */
export function workerBundle(workerScript: string, fixtureModule: string, conditions: readonly string[]): Promise<string> {
  const key = JSON.stringify([workerScript, fixtureModule, conditions]);
  let bundle = bundles.get(key);
  if (!bundle) {
    bundle = buildBundle(workerScript, fixtureModule, conditions);
    bundles.set(key, bundle);
    // A failed build is not remembered: the next scenario tries again and reports its own error.
    bundle.catch(() => bundles.delete(key));
  }
  return bundle;
}

/**
 * One bundle of the fixture module alone (an absolute path), built as a worker bundle is, for
 * a process that cannot import TypeScript itself: the parent of the process scenarios when
 * the kit runs from an installed package, outside any bundler (vitest leaves packages in
 * node_modules to Node, whose `import()` refuses `.ts`). Installed packages stay imports of
 * the files they resolved to, so the fixture shares one copy of each with the kit.
 */
export function fixtureBundle(fixtureModule: string, conditions: readonly string[]): Promise<string> {
  const key = JSON.stringify(['fixture', fixtureModule, conditions]);
  let bundle = bundles.get(key);
  if (!bundle) {
    bundle = writeBundle(`export * from ${JSON.stringify(fixtureModule)};\n`, conditions, []);
    bundles.set(key, bundle);
    bundle.catch(() => bundles.delete(key));
  }
  return bundle;
}

async function buildBundle(workerScript: string, fixtureModule: string, conditions: readonly string[]): Promise<string> {
  // Static imports run in order: the fixture module is evaluated and handed over before
  // the worker script's body looks for it.
  const entry = [
    `import * as fixture from ${JSON.stringify(fixtureModule)};`,
    `globalThis[Symbol.for(${JSON.stringify(BUNDLED_FIXTURE.description)})] = fixture;`,
  ].join('\n');
  return writeBundle(`import ${JSON.stringify('courier-bundled-fixture')};\nimport ${JSON.stringify(workerScript)};\n`, conditions, [handOver(entry)]);
}

/** Bundles `contents` (an entry of imports) with the packages-where-they-are rules, writes it under its hash, returns its path. */
async function writeBundle(contents: string, conditions: readonly string[], plugins: readonly Plugin[]): Promise<string> {
  const result = await build({
    stdin: { contents, resolveDir: process.cwd(), loader: 'js' },
    outfile: 'worker.mjs',
    write: false,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    conditions: [...conditions],
    sourcemap: 'inline',
    logLevel: 'silent',
    plugins: [...plugins, packagesWhereTheyAre(), ownImportMetaUrl()],
  });
  const code = result.outputFiles[0]!.contents;
  const file = join(BUNDLE_DIR, `${createHash('sha256').update(code).digest('hex').slice(0, 32)}.mjs`);
  await mkdir(BUNDLE_DIR, { recursive: true });
  await removeOld();
  // Written under a name of its own, then renamed: a test file starting a worker from the
  // same bundle never reads it half written.
  const partial = `${file}.${process.pid}.${randomUUID()}.partial`;
  await writeFile(partial, code);
  await rename(partial, file);
  return file;
}

async function removeOld(): Promise<void> {
  const now = Date.now();
  for (const name of await readdir(BUNDLE_DIR)) {
    const path = join(BUNDLE_DIR, name);
    const info = await stat(path).catch(() => undefined);
    if (info && now - info.mtimeMs > KEEP_MS) await rm(path, { force: true });
  }
}

/** The virtual module that imports the fixture and hands it to the worker. */
function handOver(contents: string): Plugin {
  return {
    name: 'courier-hand-over',
    setup(builder) {
      builder.onResolve({ filter: /^courier-bundled-fixture$/ }, () => ({ path: 'courier-bundled-fixture', namespace: 'courier' }));
      builder.onLoad({ filter: /.*/, namespace: 'courier' }, () => ({ contents, loader: 'js', resolveDir: process.cwd() }));
    },
  };
}

/**
 * Bare imports stay imports, of the absolute file esbuild resolved them to from the importing
 * file (pnpm gives each package only its own dependencies, so the bundle's location could not
 * resolve them). Bare imports that resolve into no node_modules (workspace packages through
 * their source condition) are bundled like relative ones.
 */
function packagesWhereTheyAre(): Plugin {
  return {
    name: 'courier-packages-where-they-are',
    setup(builder) {
      builder.onResolve({ filter: /^[^./]/ }, async (args) => {
        if (args.pluginData === 'inner') return undefined;
        const resolved = await builder.resolve(args.path, { resolveDir: args.resolveDir, kind: args.kind, importer: args.importer, pluginData: 'inner' });
        if (resolved.errors.length > 0) return { errors: resolved.errors };
        // Node built-ins come back external with their own name; keep that.
        if (resolved.external) return { path: resolved.path, external: true };
        return resolved.path.includes(`${sep}node_modules${sep}`) ? { path: resolved.path, external: true } : { path: resolved.path };
      });
    },
  };
}

/**
 * Replaces `import.meta.url` in every inlined TypeScript file with that file's own URL
 * (textually: a string literal spelling it out would change too).
 */
function ownImportMetaUrl(): Plugin {
  return {
    name: 'courier-own-import-meta-url',
    setup(builder) {
      builder.onLoad({ filter: /\.[cm]?tsx?$/ }, async (args) => {
        const source = await readFile(args.path, 'utf8');
        const contents = source.replace(/\bimport\.meta\.url\b/g, JSON.stringify(pathToFileURL(args.path).href));
        return { contents, loader: args.path.endsWith('x') ? 'tsx' : 'ts' };
      });
    },
  };
}
