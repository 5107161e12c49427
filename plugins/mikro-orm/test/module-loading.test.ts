// Loading the plugin costs start-up time in every worker process. MikroORM is CommonJS:
// a value `import` of it from ESM makes Node lex the whole package tree (hundreds of ms on
// a busy machine) even when the application loaded MikroORM with `require`, so the plugin
// takes only types from `@mikro-orm/*`; the migrations entry point loads the migrator only
// when courierMigrations() is called.
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { IsolationLevel } from '@mikro-orm/core';
import { describe, expect, it } from 'vitest';
import { READ_COMMITTED } from '../src/sql-runner.js';
import { SCHEMA_VERSION } from '../src/index.js';

const PLUGIN_DIR = fileURLToPath(new URL('..', import.meta.url));

describe('module loading', () => {
  it('importing @courier/mikro-orm loads no MikroORM module', async () => {
    // A process of its own: this one has MikroORM loaded already. The CommonJS cache lists
    // every CommonJS module loaded, through `require` or through an ESM `import`.
    const script = [
      `import { createRequire } from 'node:module';`,
      `await import('./src/index.ts');`,
      `const loaded = Object.keys(createRequire(import.meta.url).cache).filter((file) => file.includes('@mikro-orm'));`,
      `console.log(JSON.stringify(loaded));`,
    ].join('\n');
    const { stdout } = await promisify(execFile)(process.execPath, ['--conditions=@courier/source', '--import', 'tsx', '--input-type=module', '--eval', script], {
      cwd: PLUGIN_DIR,
      env: { ...process.env, NODE_OPTIONS: '' },
      timeout: 60_000,
    });
    expect(JSON.parse(stdout.trim().split('\n').pop()!)).toEqual([]);
  }, 90_000);

  it('importing @courier/mikro-orm/migrations loads @mikro-orm/migrations only when courierMigrations() is called', async () => {
    // Operator commands import the entry for courierSchemaAdmin and never migrate: the
    // migrator (umzug and a command-line toolkit) was 1.2 s of a 7.3 s `courier stats`.
    const script = [
      `import { createRequire } from 'node:module';`,
      `const loaded = () => Object.keys(createRequire(import.meta.url).cache).some((file) => file.includes('@mikro-orm/migrations') || file.includes('umzug'));`,
      `const { courierMigrations } = await import('./src/migrations.ts');`,
      `const before = loaded();`,
      `const list = courierMigrations();`,
      `console.log(JSON.stringify([before, loaded(), list.length]));`,
    ].join('\n');
    const { stdout } = await promisify(execFile)(process.execPath, ['--conditions=@courier/source', '--import', 'tsx', '--input-type=module', '--eval', script], {
      cwd: PLUGIN_DIR,
      env: { ...process.env, NODE_OPTIONS: '' },
      timeout: 60_000,
    });
    expect(JSON.parse(stdout.trim().split('\n').pop()!)).toEqual([false, true, SCHEMA_VERSION]);
  }, 90_000);

  it('spells READ COMMITTED as MikroORM does', () => {
    expect(READ_COMMITTED).toBe(IsolationLevel.READ_COMMITTED);
  });
});
