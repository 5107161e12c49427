// Packaging smoke test: what users install must work outside this workspace.
//
// Run after `pnpm build`. For every publishable package (packages/*, plugins/*,
// conformance; private ones are skipped) it `pnpm pack`s a tarball, installs all the
// tarballs with npm into a scratch project in the system temp folder (outside the
// workspace, so nothing resolves to the sources) together with the packages' peer
// dependencies, and then checks, per package:
//   - the tarball's package.json has no `workspace:` range left;
//   - `import` of the package root resolves (through `exports`) to a file in the package
//     and loads, and the module has at least one export;
//   - every value export named in the package's src/index.ts is present at run time;
//   - the `types` file of the root export exists, and a TypeScript file importing every
//     package type-checks (NodeNext resolution, declarations checked);
//   - the conformance kit runs one SIGKILL scenario there, from a TypeScript fixture module,
//     with no vitest setting (as a plugin author outside this repository would run it);
// and runs scripts/pack-smoke-round-trip.mjs there: a publish → relay → consume round
// trip through @courier/core, @courier/mikro-orm (outbox, inbox, migration classes run by
// MikroORM's migrator) and @courier/sql-transport on one SQLite file.
//
// `--mikro-orm 7` installs MikroORM 7 (MIKRO_ORM_7 below; it needs Node 22.17+) instead of
// the MikroORM 6 the workspace tests with, inside the plugins' peer range (`>=6.6.16 <8`):
// npm refuses the install if a packed package's range leaves 7 out. The plugins' own tests
// run on 7 from plugins/mikro-orm-7 (README "Supported platforms").
// Exits non-zero and says what failed. COURIER_SMOKE_KEEP=1 keeps the scratch folder.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
// MikroORM 7 releases are not all served at one version, and each driver pins its core
// exactly: 7.2.1 is the newest version every package the plugins use is served at.
const MIKRO_ORM_7 = '7.2.1';
const args = process.argv.slice(2);
const mikroOrmFlag = args.indexOf('--mikro-orm');
const mikroOrmMajor = mikroOrmFlag === -1 ? undefined : args[mikroOrmFlag + 1];
if (mikroOrmMajor !== undefined && mikroOrmMajor !== '6' && mikroOrmMajor !== '7') {
  console.error(`pack-smoke: --mikro-orm takes 6 or 7, got '${mikroOrmMajor ?? ''}'`);
  process.exit(2);
}
const failures = [];
const fail = (message) => {
  failures.push(message);
  console.error(`  FAIL ${message}`);
};
const run = (command, args, cwd) => execFileSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
const readJson = (file) => JSON.parse(readFileSync(file, 'utf8'));

/** Value (non-type) export names declared in a package's src/index.ts. */
function declaredValueExports(indexFile) {
  const source = readFileSync(indexFile, 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/\/\/.*$/gm, '');
  const names = new Set();
  for (const match of source.matchAll(/export\s+(type\s+)?\{([^}]*)\}/g)) {
    if (match[1]) continue;
    for (const part of match[2].split(',')) {
      const entry = part.trim();
      if (entry === '' || entry.startsWith('type ')) continue;
      const alias = entry.split(/\s+as\s+/);
      names.add((alias[1] ?? alias[0]).trim());
    }
  }
  for (const match of source.matchAll(/export\s+(?:declare\s+)?(?:async\s+)?(?:function\*?|const|let|var|class|abstract\s+class)\s+([A-Za-z_$][\w$]*)/g)) {
    names.add(match[1]);
  }
  if (/export\s+default\b/.test(source)) names.add('default');
  if (/export\s+\*/.test(source)) fail(`${relative(root, indexFile)} uses \`export *\`: exports must be explicit (STYLE.md)`);
  return [...names];
}

/** The `types` target of an exports entry for `import` (string, or nested conditions). */
function typesTarget(entry) {
  if (entry === null || typeof entry !== 'object') return undefined;
  if (typeof entry.types === 'string') return entry.types;
  for (const key of ['import', 'default', 'node']) {
    const nested = typesTarget(entry[key]);
    if (nested) return nested;
  }
  return undefined;
}

// ------------------------------------------------------------------ the packages
const candidates = ['packages', 'plugins']
  .flatMap((group) => (existsSync(join(root, group)) ? readdirSync(join(root, group)).map((name) => join(root, group, name)) : []))
  .concat(join(root, 'conformance'))
  .filter((dir) => existsSync(join(dir, 'package.json')));
const packages = [];
for (const dir of candidates) {
  const manifest = readJson(join(dir, 'package.json'));
  if (manifest.private) {
    console.log(`skip ${manifest.name}: private`);
    continue;
  }
  if (!existsSync(join(dir, 'src', 'index.ts'))) {
    console.log(`SKIP ${manifest.name}: ${relative(root, dir)}/src/index.ts does not exist yet, so the package has no entry point to check`);
    continue;
  }
  if (!existsSync(join(dir, 'dist'))) {
    fail(`${manifest.name}: no dist/ in ${relative(root, dir)}; run \`pnpm build\` first`);
    continue;
  }
  packages.push({ dir, manifest, expected: declaredValueExports(join(dir, 'src', 'index.ts')) });
}
if (packages.length === 0) fail('no publishable package found');

const scratch = mkdtempSync(join(tmpdir(), 'courier-pack-smoke-'));
const tarballs = join(scratch, 'tarballs');
const app = join(scratch, 'app');
mkdirSync(tarballs);
mkdirSync(app);
console.log(`scratch project: ${scratch}`);

try {
  // ---------------------------------------------------------------- pack
  const dependencies = {};
  const peers = {};
  for (const pkg of packages) {
    const before = new Set(readdirSync(tarballs));
    run('pnpm', ['pack', '--pack-destination', tarballs], pkg.dir);
    const created = readdirSync(tarballs).filter((file) => file.endsWith('.tgz') && !before.has(file));
    if (created.length !== 1) {
      fail(`${pkg.manifest.name}: pnpm pack produced ${created.length} tarballs`);
      continue;
    }
    pkg.tarball = join(tarballs, created[0]);
    const packed = JSON.parse(run('tar', ['-xzOf', pkg.tarball, 'package/package.json'], scratch));
    for (const field of ['dependencies', 'peerDependencies', 'optionalDependencies']) {
      for (const [name, range] of Object.entries(packed[field] ?? {})) {
        if (String(range).startsWith('workspace:')) fail(`${pkg.manifest.name}: ${field}.${name} is still "${range}" in the tarball`);
      }
    }
    const files = run('tar', ['-tzf', pkg.tarball], scratch).split('\n');
    if (!files.some((file) => file.startsWith('package/dist/'))) fail(`${pkg.manifest.name}: the tarball has no dist/`);
    console.log(`packed ${pkg.manifest.name}: ${created[0]} (${files.filter(Boolean).length} files)`);
    dependencies[pkg.manifest.name] = `file:${relative(app, pkg.tarball)}`;
    // Peers at the version the repository pins for its own tests, else the declared range
    // (MikroORM at MIKRO_ORM_7 with --mikro-orm 7).
    for (const [name, range] of Object.entries(packed.peerDependencies ?? {})) {
      if (name.startsWith('@courier/') || peers[name]) continue;
      peers[name] = mikroOrmMajor === '7' && name.startsWith('@mikro-orm/') ? MIKRO_ORM_7 : (pkg.manifest.devDependencies?.[name] ?? range);
    }
  }
  Object.assign(dependencies, peers);
  for (const [name, version] of Object.entries(peers)) {
    if (name.startsWith('@mikro-orm/') && mikroOrmMajor === '7' && version !== MIKRO_ORM_7) fail(`${name} would install at ${version}, not ${MIKRO_ORM_7}`);
  }

  // ---------------------------------------------------------------- install
  // TypeORM 1.1.3 declares an optional peer `ioredis@^5` (its query cache), and npm refuses
  // the install when the project has ioredis 6 (which @courier/redis and
  // @courier/redis-streams need), optional or not. A user with both does what this does: an
  // npm `overrides` entry letting TypeORM see the project's ioredis (plugins/typeorm/README.md).
  const overrides = dependencies['typeorm'] && dependencies['ioredis'] ? { typeorm: { ioredis: '$ioredis' } } : undefined;
  writeFileSync(
    join(app, 'package.json'),
    `${JSON.stringify({ name: 'courier-pack-smoke', private: true, type: 'module', dependencies, ...(overrides ? { overrides } : {}) }, null, 2)}\n`,
  );
  console.log(`npm install in the scratch project: ${Object.keys(dependencies).join(', ')}`);
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', '--prefer-offline'], { cwd: app, stdio: ['ignore', 'inherit', 'inherit'] });

  // ---------------------------------------------------------------- run-time checks
  const checked = packages.filter((pkg) => pkg.tarball);
  const checks = checked.map((pkg) => ({ name: pkg.manifest.name, expected: pkg.expected }));
  writeFileSync(
    join(app, 'check.mjs'),
    `import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
const checks = ${JSON.stringify(checks, null, 2)};
const problems = [];
const typesTarget = ${typesTarget.toString()};
for (const { name, expected } of checks) {
  const home = join(process.cwd(), 'node_modules', ...name.split('/'));
  let resolved;
  try {
    resolved = fileURLToPath(import.meta.resolve(name));
  } catch (error) {
    problems.push(name + ': import of the root does not resolve: ' + error.message);
    continue;
  }
  if (!resolved.startsWith(home + sep) || !existsSync(resolved)) problems.push(name + ': root resolves to ' + resolved + ', not a file of the installed package');
  let mod;
  try {
    mod = await import(name);
  } catch (error) {
    problems.push(name + ': import failed: ' + (error && error.stack || error));
    continue;
  }
  const names = Object.keys(mod);
  if (names.length === 0) problems.push(name + ': the module has no exports');
  const missing = expected.filter((key) => !(key in mod) || mod[key] === undefined);
  if (missing.length > 0) problems.push(name + ': src/index.ts exports but the built module lacks: ' + missing.join(', '));
  const manifest = JSON.parse(readFileSync(join(home, 'package.json'), 'utf8'));
  const types = typesTarget(manifest.exports?.['.']) ?? manifest.types;
  if (!types) problems.push(name + ': exports["."] names no types file');
  else if (!existsSync(join(home, types))) problems.push(name + ': types file ' + types + ' is missing from the package');
  console.log('ok ' + name + ': ' + names.length + ' exports (' + expected.length + ' declared in src/index.ts), types ' + types);
}
if (problems.length > 0) {
  for (const problem of problems) console.error('  FAIL ' + problem);
  process.exit(1);
}
`,
  );
  try {
    execFileSync('node', ['check.mjs'], { cwd: app, stdio: ['ignore', 'inherit', 'inherit'] });
  } catch {
    fail('run-time import checks failed (see above)');
  }

  // ---------------------------------------------------------------- type-level check
  writeFileSync(
    join(app, 'check.ts'),
    checked.map((pkg, index) => `import * as package${index} from '${pkg.manifest.name}';\nexport type Package${index} = typeof package${index};\n`).join(''),
  );
  writeFileSync(
    join(app, 'tsconfig.json'),
    `${JSON.stringify(
      {
        compilerOptions: {
          target: 'ES2022',
          lib: ['ES2023'],
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          skipLibCheck: false,
          types: ['node'],
          typeRoots: [join(root, 'node_modules', '@types')],
        },
        files: ['check.ts'],
      },
      null,
      2,
    )}\n`,
  );
  let output = '';
  try {
    output = execFileSync(join(root, 'node_modules', '.bin', 'tsc'), ['-p', 'tsconfig.json'], { cwd: app, encoding: 'utf8' });
  } catch (error) {
    output = `${error.stdout ?? ''}${error.stderr ?? ''}`;
  }
  // Only our declarations and our import count; a peer's own .d.ts quirks are not ours.
  const ours = output.split('\n').filter((line) => /^(check\.ts|node_modules\/@courier\/)/.test(line));
  const others = output.split('\n').filter((line) => /error TS/.test(line) && !ours.includes(line));
  if (others.length > 0) console.log(`(ignored ${others.length} type errors inside third-party declarations)`);
  if (ours.length > 0) {
    for (const line of ours) console.error(`  ${line}`);
    fail('the packed declarations do not type-check from a consumer project');
  } else {
    console.log(`ok types: a consumer importing ${checked.length} packages type-checks`);
  }

  // ---------------------------------------------------------------- round trip
  const roundTripNeeds = ['@courier/core', '@courier/mikro-orm', '@courier/sql-transport', '@mikro-orm/libsql', '@mikro-orm/migrations'];
  const absent = roundTripNeeds.filter((name) => !existsSync(join(app, 'node_modules', ...name.split('/'), 'package.json')));
  if (absent.length > 0) {
    fail(`round trip: ${absent.join(', ')} not installed in the scratch project`);
  } else {
    writeFileSync(join(app, 'round-trip.mjs'), readFileSync(join(root, 'scripts', 'pack-smoke-round-trip.mjs')));
    try {
      execFileSync('node', ['round-trip.mjs'], { cwd: app, stdio: ['ignore', 'inherit', 'inherit'], timeout: 120_000 });
    } catch {
      fail('the publish → relay → consume round trip failed (see above)');
    }
  }

  // ---------------------------------------------------------------- the packed CLI serves the console
  // The front end is bundled into the tarball at build time: `courier console` from the
  // installed package must serve the page, its assets and the API with nothing built here.
  if (checked.some((pkg) => pkg.manifest.name === '@courier/cli')) {
    writeFileSync(
      join(app, 'courier.config.mjs'),
      `import { InMemoryDatabase, InMemoryOutboxStore } from '@courier/core';\nexport default () => ({ outbox: new InMemoryOutboxStore({ database: new InMemoryDatabase() }) });\n`,
    );
    try {
      await checkConsole(app);
      console.log('ok console: the packed `courier console` serves its page, assets and API');
    } catch (error) {
      fail(`the packed CLI does not serve the console: ${error.message}`);
    }
  }

  // ---------------------------------------------------------------- the kit outside the workspace
  // A plugin author's project: the kit installed from its tarball, a TypeScript fixture module,
  // no vitest setting of ours. One SIGKILL scenario must run there as it does here (it failed
  // with "Unknown file extension .ts" when the kit's parent imported the fixture with Node's
  // own import()).
  if (checked.some((pkg) => pkg.manifest.name === '@courier/conformance') && checked.some((pkg) => pkg.manifest.name === '@courier/mikro-orm')) {
    mkdirSync(join(app, 'kit'));
    writeFileSync(
      join(app, 'kit', 'fixture.ts'),
      `import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';

export async function createFixture(context: FixtureContext) {
  return { store: await createSqliteStoreFixture(context, { directory: process.env.KIT_SQLITE_DIR }), transport: await createIpcBrokerTransportFixture() };
}
`,
    );
    writeFileSync(
      join(app, 'kit', 'bus.test.ts'),
      `import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createFixture } from './fixture.ts';

describeBus('outside', { store: async (context) => (await createFixture(context)).store, transport: async (context) => (await createFixture(context)).transport }, {
  process: { module: fileURLToPath(new URL('./fixture.ts', import.meta.url)) },
});
`,
    );
    writeFileSync(join(app, 'vitest.config.mjs'), `export default { test: { include: ['kit/**/*.test.ts'] } };\n`);
    const sqliteDir = join(scratch, 'sqlite');
    mkdirSync(sqliteDir);
    let output = '';
    let passed = false;
    try {
      output = execFileSync(process.execPath, [join(app, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '-t', 'after-publish-before-complete: killed there'], {
        cwd: app,
        encoding: 'utf8',
        env: { ...process.env, KIT_SQLITE_DIR: sqliteDir, NO_COLOR: '1', CI: 'true' },
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 300_000,
      });
      passed = /Tests\s+1 passed/.test(output);
    } catch (error) {
      output = `${error.stdout ?? ''}${error.stderr ?? ''}`;
    }
    if (passed) console.log('ok kit: a SIGKILL scenario ran in a project outside the workspace with a TypeScript fixture module');
    else {
      console.error(output.split('\n').slice(-60).join('\n'));
      fail('the conformance kit could not run a SIGKILL scenario outside the workspace (output above)');
    }
  }
} finally {
  if (process.env.COURIER_SMOKE_KEEP === '1') console.log(`kept ${scratch}`);
  else rmSync(scratch, { recursive: true, force: true });
}

/** Starts the installed `courier console` in `app`, fetches the page, one asset and the stats, and stops it. */
async function checkConsole(app) {
  const { spawn } = await import('node:child_process');
  const child = spawn(process.execPath, [join(app, 'node_modules', '@courier', 'cli', 'dist', 'bin.js'), 'console', '--port', '0', '--config', 'courier.config.mjs'], { cwd: app, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  try {
    const url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`not serving after 60 s: ${stderr}`)), 60_000);
      child.stderr.on('data', (chunk) => {
        stderr += chunk;
        const match = /serving (http:\/\/\S+?\/)/.exec(stderr);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]);
        }
      });
      child.once('exit', (code) => reject(new Error(`exited ${code}: ${stderr}`)));
    });
    const page = await (await fetch(url)).text();
    if (!page.includes('<div id="app">')) throw new Error(`the page is not the console's: ${page.slice(0, 200)}`);
    const asset = /src="\.\/(assets\/[^"]+\.js)"/.exec(page)?.[1];
    if (!asset || (await fetch(new URL(asset, url))).status !== 200) throw new Error(`its script ${asset ?? '(none named)'} is not served`);
    const stats = await fetch(new URL('api/stats', url));
    if (stats.status !== 200 || !('stats' in (await stats.json()))) throw new Error(`/api/stats answered ${stats.status}`);
  } finally {
    child.kill('SIGTERM');
  }
}

if (failures.length > 0) {
  console.error(`pack smoke test FAILED: ${failures.length} problem(s)`);
  process.exit(1);
}
console.log(`pack smoke test passed: ${packages.length} package(s), MikroORM ${mikroOrmMajor === '7' ? MIKRO_ORM_7 : 'as the workspace pins it'}`);
