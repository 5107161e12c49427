// @courier/prisma/testing: a Prisma Client generated where Prisma's engines cannot be
// downloaded. `prisma generate` (Prisma 7, `prisma-client` generator) needs no engine to
// write a client for a driver adapter, yet asks for the schema engine first and, without
// PRISMA_SCHEMA_ENGINE_BINARY, tries to download one from binaries.prisma.sh (unreachable on
// machines without that host; ../shared/ENVIRONMENT.md of this repository). Courier's own
// tests and its example generate their clients this way; so can a project's tests.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

/** What {@link generatePrismaClient} and {@link loadPrismaClient} generate, and where. */
export interface PrismaClientGeneration {
  /**
   * The schema (`schema.prisma` text): a `generator` block with an `output` line (it is
   * pointed at the generated directory, whatever it names), a `datasource`, any models.
   * Use `provider = "prisma-client"` with `moduleFormat = "esm"` and
   * `importFileExtension = "ts"` so Node can load the generated `client.ts` itself.
   */
  readonly schema: string;
  /**
   * The project that has `prisma` and `@prisma/client` installed: both are resolved from it,
   * and the client is written to its `.prisma-client/` folder (ignore it in git), because
   * the generated client imports `@prisma/client/runtime/client`, which must resolve from
   * there, and Node strips TypeScript types only outside node_modules.
   */
  readonly projectDir: string;
  /** Names the client's folder (`<name>-<Prisma version>-<schema hash>`). Default `client`. Letters, digits, `.`, `_` and `-`. */
  readonly name?: string;
}

const GENERATOR_OUTPUT = /^(\s*output\s*=\s*)"[^"]*"/m;
const NAME = /^[A-Za-z0-9._-]+$/;

/** The version of `@prisma/client` installed in `projectDir` (a generated client must match its runtime). */
export function prismaVersion(projectDir: string): string {
  const require = projectRequire(projectDir);
  return (JSON.parse(readFileSync(require.resolve('@prisma/client/package.json'), 'utf8')) as { version: string }).version;
}

/**
 * Generates the client of `schema` offline unless this Prisma version already generated it for
 * this schema, and returns the folder holding it (its entry is `client.ts`).
 *
 * Guarantees: no network access (PRISMA_SCHEMA_ENGINE_BINARY is set to `/bin/true` unless the
 * environment sets it: `prisma generate` runs no schema engine for a client; on Windows set
 * it to any program that exits 0). A folder is reused only for the same Prisma version and
 * schema text (named by both), so an edited schema is generated again. Several processes may
 * call it at once: each writes a folder of its own and renames it into place; the first
 * rename wins and the others use it. Bad options fail with an `Error` naming the option;
 * a failed generation fails with Prisma's own output and leaves nothing behind.
 */
export function generatePrismaClient(options: PrismaClientGeneration): string {
  const { schema, projectDir, name = 'client' } = checked(options);
  const dir = join(resolve(projectDir), '.prisma-client', `${name}-${prismaVersion(projectDir)}-${createHash('sha256').update(schema).digest('hex').slice(0, 8)}`);
  if (existsSync(join(dir, 'client.ts'))) return dir;
  const cli = join(dirname(projectRequire(projectDir).resolve('prisma/package.json')), 'build', 'index.js');
  const work = `${dir}.tmp-${process.pid}-${Date.now()}`;
  mkdirSync(work, { recursive: true });
  const schemaFile = join(work, 'schema.prisma');
  writeFileSync(schemaFile, schema.replace(GENERATOR_OUTPUT, '$1"./client"'));
  try {
    execFileSync(process.execPath, [cli, 'generate', '--schema', schemaFile], {
      cwd: work,
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: process.env['PRISMA_SCHEMA_ENGINE_BINARY'] ?? '/bin/true', PRISMA_HIDE_UPDATE_MESSAGE: '1', CHECKPOINT_DISABLE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 120_000,
    });
  } catch (error) {
    const output = error as { stdout?: Buffer; stderr?: Buffer };
    rmSync(work, { recursive: true, force: true });
    throw new Error(`prisma generate failed (${name}): ${String(output.stderr ?? '')}${String(output.stdout ?? '')}`, { cause: error });
  }
  try {
    renameSync(join(work, 'client'), dir);
  } catch (error) {
    // Another process renamed its copy first: use that one.
    if (!existsSync(join(dir, 'client.ts'))) throw error;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return dir;
}

/**
 * {@link generatePrismaClient}, then imports the generated client and returns its
 * `PrismaClient` class, typed as the caller says (`Client`: what the caller uses of it; the
 * generated types are not visible to a program type-checked before generation).
 */
export async function loadPrismaClient<Client = unknown>(options: PrismaClientGeneration): Promise<Client> {
  const dir = generatePrismaClient(options);
  const module = (await import(pathToFileURL(join(dir, 'client.ts')).href)) as { PrismaClient?: Client };
  if (module.PrismaClient === undefined) throw new Error(`the client generated in ${dir} exports no PrismaClient: use the "prisma-client" generator`);
  return module.PrismaClient;
}

function checked(options: PrismaClientGeneration): PrismaClientGeneration {
  if (options === null || typeof options !== 'object') throw new Error(`'options' must be an object with 'schema' and 'projectDir'`);
  const { schema, projectDir, name } = options;
  if (typeof schema !== 'string' || schema.trim() === '') throw new Error(`'schema' must be the text of a Prisma schema`);
  if (!GENERATOR_OUTPUT.test(schema)) throw new Error(`'schema' has no generator 'output = "…"' line to point at the generated client`);
  if (typeof projectDir !== 'string' || !existsSync(join(projectDir, 'package.json'))) throw new Error(`'projectDir' must be a project folder with a package.json (got ${JSON.stringify(projectDir)})`);
  if (name !== undefined && (typeof name !== 'string' || !NAME.test(name))) throw new Error(`'name' must be letters, digits, '.', '_' or '-' (got ${JSON.stringify(name)})`);
  return options;
}

function projectRequire(projectDir: string): NodeRequire {
  return createRequire(join(resolve(projectDir), 'package.json'));
}
