// Prisma Clients generated at test time, one per database provider: Courier's tables need no
// Prisma model, so the schema is a datasource and a generator only. `prisma generate` runs
// offline with PRISMA_SCHEMA_ENGINE_BINARY set (it asks for a schema engine it does not use
// for this; without the variable it tries to download one from binaries.prisma.sh). The
// output lives in `.prisma-client/` of this package (gitignored): the generated client
// imports `@prisma/client/runtime/client`, which must resolve from there, and Node strips
// TypeScript types only outside node_modules (the SIGKILL workers load it without vitest).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { PrismaClientLike, PrismaRawClient } from '../../src/index.js';

/** The Prisma providers the tests generate a client for. */
export type PrismaProvider = 'postgresql' | 'mysql' | 'sqlite';

/** What the tests use of a generated client: its constructor, typed by the subset Courier uses. */
export interface GeneratedPrismaClient extends PrismaClientLike<PrismaRawClient> {
  $disconnect(): Promise<void>;
  /** Prisma's log events; `query` is emitted for every statement when the client was built with `log: [{ emit: 'event', level: 'query' }]`. */
  $on(event: 'query', listener: (event: { query: string; params: string; duration: number }) => void): void;
}
export type GeneratedPrismaClientClass = new (options: { adapter: unknown; log?: readonly { emit: 'event' | 'stdout'; level: 'query' | 'info' | 'warn' | 'error' }[] }) => GeneratedPrismaClient;

const PACKAGE_DIR = fileURLToPath(new URL('../..', import.meta.url));
const require = createRequire(import.meta.url);

/** The installed Prisma version (the generated client must match its runtime). */
export function prismaVersion(): string {
  const pkg = JSON.parse(readFileSync(require.resolve('@prisma/client/package.json'), 'utf8')) as { version: string };
  return pkg.version;
}

/**
 * Generates (once per Prisma version and provider, shared by every test process: written to
 * a directory of its own, then renamed into place) and imports the Prisma Client for
 * `provider`. Returns its `PrismaClient` class.
 */
export async function loadPrismaClient(provider: PrismaProvider, baseDir: string = PACKAGE_DIR): Promise<GeneratedPrismaClientClass> {
  const schema = schemaFor(provider);
  // Named by version and schema, so a changed generator setting never reuses an old client.
  const dir = join(baseDir, '.prisma-client', `${prismaVersion()}-${provider}-${createHash('sha256').update(schema).digest('hex').slice(0, 8)}`);
  const entry = join(dir, 'client.ts');
  if (!existsSync(entry)) generate(provider, schema, dir);
  const module = (await import(pathToFileURL(entry).href)) as { PrismaClient: GeneratedPrismaClientClass };
  return module.PrismaClient;
}

// The schema of a client for Courier's tests: no model (Courier's tables are not modelled),
// ESM with `.ts` imports so Node itself can load it (the SIGKILL workers run outside vitest).
function schemaFor(provider: PrismaProvider): string {
  return `generator client {\n  provider = "prisma-client"\n  output   = "./client"\n  moduleFormat = "esm"\n  importFileExtension = "ts"\n}\n\ndatasource db {\n  provider = "${provider}"\n}\n`;
}

function generate(provider: PrismaProvider, schemaText: string, dir: string): void {
  const work = `${dir}.tmp-${process.pid}-${Date.now()}`;
  mkdirSync(work, { recursive: true });
  const schema = join(work, 'schema.prisma');
  writeFileSync(schema, schemaText);
  const cli = join(dirname(require.resolve('prisma/package.json')), 'build', 'index.js');
  try {
    execFileSync(process.execPath, [cli, 'generate', '--schema', schema], {
      cwd: work,
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: process.env['PRISMA_SCHEMA_ENGINE_BINARY'] ?? '/bin/true', PRISMA_HIDE_UPDATE_MESSAGE: '1', CHECKPOINT_DISABLE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 120_000,
    });
  } catch (error) {
    const output = error as { stdout?: Buffer; stderr?: Buffer };
    rmSync(work, { recursive: true, force: true });
    throw new Error(`prisma generate failed for ${provider}: ${String(output.stderr ?? '')}${String(output.stdout ?? '')}`, { cause: error });
  }
  try {
    renameSync(join(work, 'client'), dir);
  } catch (error) {
    // Another process renamed its copy first: use that one.
    if (!existsSync(join(dir, 'client.ts'))) throw error;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
