// Why @courier/drizzle refuses SQLite (issue 32 asked for conformance on each database an ORM
// supports here): the refusal names the packages that take SQLite, and the better-sqlite3
// driver's reason is kept true here — if Drizzle's better-sqlite3 transactions ever accept an
// async callback, the second test fails and the refusal deserves another look.
import { randomUUID } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '@courier/core';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/better-sqlite3';
import { afterEach, expect, it } from 'vitest';
import { DrizzleInboxStore, DrizzleOutboxStore } from '../src/index.js';
import { SQLITE_DIR } from './support/fixture.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup();
});

function openBetterSqlite3() {
  mkdirSync(SQLITE_DIR, { recursive: true });
  const file = join(SQLITE_DIR, `t${randomUUID().replaceAll('-', '').slice(0, 12)}.db`);
  const db = drizzle(file);
  cleanups.push(() => {
    db.$client.close();
    for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(`${file}${suffix}`, { force: true });
  });
  return db;
}

it('refuses a Drizzle better-sqlite3 database at construction, saying why and naming the packages that take SQLite', () => {
  const db = openBetterSqlite3();
  for (const build of [() => new DrizzleOutboxStore({ db }), () => new DrizzleInboxStore({ db })]) {
    const refused = (() => {
      try {
        build();
        return undefined;
      } catch (error) {
        return error;
      }
    })();
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as Error).message).toMatch(/better-sqlite3's Drizzle transactions are synchronous.*@courier\/kysely or @courier\/knex/);
  }
});

it("the reason: Drizzle's better-sqlite3 transaction refuses an async callback, so no publish can be awaited inside it, and nothing is written", () => {
  const db = openBetterSqlite3();
  db.run(sql`CREATE TABLE effects (id TEXT NOT NULL)`);
  expect(() =>
    db.transaction(async (tx) => {
      tx.run(sql`INSERT INTO effects (id) VALUES ('written before the first await')`);
      await Promise.resolve();
    }),
  ).toThrow(/cannot return a promise/);
  expect(db.all(sql`SELECT id FROM effects`)).toEqual([]);
});
