// Why @courier/typeorm refuses SQLite (issue 32 asked for conformance on each database an ORM
// supports here): TypeORM's SQLite drivers share one QueryRunner, so two concurrent
// dataSource.transaction() calls are one transaction with a savepoint, and a rollback of the
// outer undoes what the inner "committed" — Courier's relay claims and inbox records would be
// undone by an application's rollback. The second test keeps that reason true: if TypeORM
// gives SQLite transactions of their own, it fails and the refusal deserves another look.
import { randomUUID } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError } from '@courier/core';
import { DataSource } from 'typeorm';
import { afterEach, expect, it } from 'vitest';
import { TypeOrmInboxStore, TypeOrmOutboxStore } from '../src/index.js';

const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-typeorm-sqlite');
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function openBetterSqlite3(): Promise<DataSource> {
  mkdirSync(SQLITE_DIR, { recursive: true });
  const file = join(SQLITE_DIR, `t${randomUUID().replaceAll('-', '').slice(0, 12)}.db`);
  const dataSource = new DataSource({ type: 'better-sqlite3', database: file });
  await dataSource.initialize();
  cleanups.push(async () => {
    await dataSource.destroy();
    for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(`${file}${suffix}`, { force: true });
  });
  return dataSource;
}

it('refuses a better-sqlite3 DataSource at construction, saying why and naming the packages that take SQLite', async () => {
  const dataSource = await openBetterSqlite3();
  for (const build of [() => new TypeOrmOutboxStore({ dataSource }), () => new TypeOrmInboxStore({ dataSource })]) {
    expect(build).toThrow(ConfigError);
    expect(build).toThrow(/one connection.*a rollback of one undoes what the other committed.*@courier\/kysely, @courier\/knex or @courier\/sqlite/);
  }
});

it("the reason: on TypeORM's better-sqlite3 driver a transaction that committed is undone by a concurrent one's rollback", async () => {
  const dataSource = await openBetterSqlite3();
  await dataSource.query('CREATE TABLE effects (id TEXT NOT NULL)');
  let releaseOuter!: () => void;
  const outerHeld = new Promise<void>((resolve) => (releaseOuter = resolve));
  let outerWrote!: () => void;
  const outerHasWritten = new Promise<void>((resolve) => (outerWrote = resolve));
  const outer = dataSource
    .transaction(async (manager) => {
      await manager.query(`INSERT INTO effects (id) VALUES ('outer')`);
      outerWrote();
      await outerHeld;
      throw new Error('the outer transaction rolls back');
    })
    .catch((error: unknown) => error);
  await outerHasWritten;
  await dataSource.transaction(async (manager) => {
    await manager.query(`INSERT INTO effects (id) VALUES ('inner')`);
  });
  releaseOuter();
  expect(await outer).toBeInstanceOf(Error);
  // With a connection per transaction 'inner' would be kept; TypeORM nested it in 'outer'.
  expect(await dataSource.query('SELECT id FROM effects')).toEqual([]);
});
