// The busy timeout must hold on every connection of the application's ORM, not only in
// the store's own transactions. @mikro-orm/libsql 6.6.16 replaces its connection every
// 10 s (its knex dialect deems older ones invalid) and libsql opens it with no busy
// timeout: an application write on the fresh connection (em.transactional, a flush) then
// failed at once with "database is locked" while another process held the file, and the
// connection stayed unusable ("SQL statements in progress", then knex's "Transaction query
// already complete") — what stalled the example's workers under --chaos.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually, type FixtureContext } from '@courier/conformance';
import type { MikroORM } from '@mikro-orm/core';
import { MikroORM as LibSqlOrm } from '@mikro-orm/libsql';
import { afterEach, describe, expect, it } from 'vitest';
import { createSqliteStoreFixture } from '../src/conformance.js';
import { MikroOrmOutboxStore } from '../src/index.js';

const HOLD_MS = 1_500;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** The libsql module the ORM's knex dialect loads (a dependency of @mikro-orm/knex). */
function libsqlPath(): string {
  const knex = createRequire(import.meta.url).resolve('@mikro-orm/libsql');
  return createRequire(createRequire(knex).resolve('@mikro-orm/knex')).resolve('libsql');
}

/**
 * Another process takes the file's write lock (`IMMEDIATE`; `EXCLUSIVE` keeps readers out too,
 * as a process does while it recovers the journal of one that was killed) and holds it for
 * `HOLD_MS`; resolves once it holds it, with its exit.
 */
async function holdWriteLock(file: string, mode: 'IMMEDIATE' | 'EXCLUSIVE' = 'IMMEDIATE'): Promise<{ exited: Promise<number | null> }> {
  const script =
    `const Database = require(${JSON.stringify(libsqlPath())}); const db = new Database(${JSON.stringify(file)});` +
    `db.exec('BEGIN ${mode}'); console.log('locked'); setTimeout(() => { db.exec('COMMIT'); db.close(); }, ${HOLD_MS});`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
  cleanups.push(async () => {
    child.kill('SIGKILL');
    await exited;
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout.on('data', (chunk: Buffer) => {
      if (chunk.toString('utf8').includes('locked')) resolve();
    });
    void exited.then((code) => reject(new Error(`the lock holder exited with ${String(code)} before it held the lock`)));
  });
  return { exited };
}

/** A handle on the raw connection the ORM's pool hands out now (to see it replaced). */
async function rawConnection(orm: MikroORM): Promise<unknown> {
  const client = (orm.em.getConnection() as unknown as { getKnex(): { client: { acquireConnection(): Promise<unknown>; releaseConnection(c: unknown): Promise<void> } } }).getKnex().client;
  const raw = await client.acquireConnection();
  await client.releaseConnection(raw);
  return raw;
}

async function appWrite(orm: MikroORM, value: string): Promise<void> {
  await orm.em.fork().transactional(async (em) => {
    await em.getConnection().execute('INSERT INTO app_rows (v) VALUES (?)', [value], 'run', em.getTransactionContext());
  });
}

describe('SQLite: every connection of the ORM waits for the write lock', () => {
  it('an application transaction on a connection the ORM opened after the store started waits for another process instead of failing, and the connection stays usable', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'courier-fresh-connection-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, 'app.db');
    const orm = (await LibSqlOrm.init({ dbName: file, entities: [], discovery: { warnWhenNoEntities: false }, debug: false })) as unknown as MikroORM;
    cleanups.push(() => orm.close(true));
    const store = new MikroOrmOutboxStore({ orm, wakeups: false });
    cleanups.push(() => store.close());
    await store.ensureSchema();
    await store.stats();
    await orm.em.getConnection().execute('CREATE TABLE app_rows (id INTEGER PRIMARY KEY, v TEXT NOT NULL)', [], 'run');

    // The ORM replaces its connection (libsql's knex dialect: after 10 s).
    const first = await rawConnection(orm);
    await eventually(async () => expect(await rawConnection(orm)).not.toBe(first), { timeoutMs: 30_000, intervalMs: 500 });

    const holder = await holdWriteLock(file);
    const started = Date.now();
    await appWrite(orm, 'while another process writes');
    const waited = Date.now() - started;
    expect(await holder.exited).toBe(0);

    // Still usable afterwards, for the application and the store alike.
    await appWrite(orm, 'after');
    await expect(store.stats()).resolves.toBeDefined();
    const rows = await orm.em.getConnection().execute('SELECT v FROM app_rows ORDER BY id', [], 'all');
    expect(rows.map((row: { v: string }) => row.v)).toEqual(['while another process writes', 'after']);
    console.log(`application write on a fresh connection waited ${waited} ms for a ${HOLD_MS} ms lock held by another process`);
  }, 90_000);
});

describe('SQLite: the published conformance fixture opens a file another process holds', () => {
  // CI saw a SIGKILL scenario's worker die at start with "database is locked": MikroORM's
  // init reads the schema (`ensureDatabase`) before any store exists to give its connection
  // the busy timeout, and libsql opens connections with none. The fixture now asks libsql
  // for one at open (driverOptions.connection.timeout), as the README tells users to.
  it('waits for a lock that keeps readers out instead of failing at the ORM\'s init', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'courier-fixture-open-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const testId = `open_${process.pid}`;
    const file = join(dir, `${testId}.db`);
    const seed = (await LibSqlOrm.init({ dbName: file, entities: [], discovery: { warnWhenNoEntities: false }, debug: false })) as unknown as MikroORM;
    await seed.em.getConnection().execute('CREATE TABLE seeded (id INTEGER PRIMARY KEY)', [], 'run');
    await seed.close(true);

    const holder = await holdWriteLock(file, 'EXCLUSIVE');
    const started = Date.now();
    const fixture = await createSqliteStoreFixture({ testId } as FixtureContext, { directory: dir });
    cleanups.push(() => fixture.close());
    const waited = Date.now() - started;
    expect(await holder.exited).toBe(0);
    await expect(fixture.outbox.stats()).resolves.toBeDefined();
    console.log(`the fixture's ORM init waited ${waited} ms for a ${HOLD_MS} ms exclusive lock held by another process`);
  }, 60_000);
});
