// Prisma Clients generated at test time, one per database provider, by this package's own
// offline helper (@courier/prisma/testing): Courier's tables need no Prisma model, so the
// schema is a datasource and a generator only. The output lives in `.prisma-client/` of this
// package (gitignored). ESM with `.ts` imports, so Node itself loads it (the SIGKILL workers
// run outside vitest).
import { fileURLToPath } from 'node:url';
import type { PrismaClientLike, PrismaRawClient } from '../../src/index.js';
import { loadPrismaClient as loadGenerated } from '../../src/testing.js';

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

/** Generates (once per Prisma version and provider, shared by every test process) and imports the Prisma Client for `provider`; returns its `PrismaClient` class. */
export function loadPrismaClient(provider: PrismaProvider): Promise<GeneratedPrismaClientClass> {
  return loadGenerated<GeneratedPrismaClientClass>({ schema: schemaFor(provider), projectDir: PACKAGE_DIR, name: provider });
}

function schemaFor(provider: PrismaProvider): string {
  return `generator client {\n  provider = "prisma-client"\n  output   = "./client"\n  moduleFormat = "esm"\n  importFileExtension = "ts"\n}\n\ndatasource db {\n  provider = "${provider}"\n}\n`;
}
