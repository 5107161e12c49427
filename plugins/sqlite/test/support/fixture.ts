// Store fixtures for the conformance suites and this package's tests: one SQLite file per
// test (its own directory under the OS temp dir), Courier tables prefixed `<testId>_`, and an
// effects table written through the handler's transaction. Importable in a child process:
// the same testId opens the same file; `close()` removes it only in the parent.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FixtureContext, StoreFixture } from '@courier/conformance';
import { createClient, type Client, type Transaction } from '@libsql/client';
import Database from 'better-sqlite3';
import {
  BetterSqlite3InboxStore,
  BetterSqlite3OutboxStore,
  LibsqlInboxStore,
  LibsqlOutboxStore,
  withLibsqlTransaction,
  withTransaction,
  type BetterSqlite3OutboxStoreConfig,
  type LibsqlOutboxStoreConfig,
} from '../../src/index.js';

/** Where the test files go (`COURIER_SQLITE_DIR`). */
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-sqlite-plugin');

/** The path of the file of `testId`. */
export function sqliteFile(testId: string): string {
  mkdirSync(SQLITE_DIR, { recursive: true });
  return join(SQLITE_DIR, `${testId}.db`);
}

function removeFile(file: string): void {
  if (process.env['COURIER_CONFORMANCE_WORKER'] !== undefined) return;
  for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(`${file}${suffix}`, { force: true });
}

/** A better-sqlite3 store fixture plus what this package's tests need. */
export interface BetterSqlite3Fixture extends StoreFixture<Database.Database> {
  readonly database: Database.Database;
  readonly outbox: BetterSqlite3OutboxStore;
  readonly inbox: BetterSqlite3InboxStore;
  readonly file: string;
  readonly tablePrefix: string;
}

/** Opens `<testId>.db` with better-sqlite3, creates the schema and the effects table. */
export async function createBetterSqlite3Fixture(context: FixtureContext, options: { outbox?: Partial<Omit<BetterSqlite3OutboxStoreConfig, 'database'>> } = {}): Promise<BetterSqlite3Fixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  const file = sqliteFile(testId);
  const database = new Database(file);
  const tablePrefix = `${testId}_`;
  const effects = `"${testId}_effects"`;
  try {
    const outbox = new BetterSqlite3OutboxStore({ ...options.outbox, database, tablePrefix });
    const inbox = new BetterSqlite3InboxStore({ database, tablePrefix });
    await outbox.ensureSchema();
    await withTransaction(database, async (db) => {
      db.exec(`CREATE TABLE IF NOT EXISTS ${effects} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`);
    });
    return {
      database,
      outbox,
      inbox,
      file,
      tablePrefix,
      outboxPublishedRows: outbox.publishedRows,
      transaction: (work) => withTransaction(database, work),
      transactionHeldBeforeCommit: (work, beforeCommit) =>
        withTransaction(database, async (db) => {
          const value = await work(db);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        async begin() {
          database.exec('BEGIN IMMEDIATE');
          return database;
        },
        async rollback(db) {
          db.exec('ROLLBACK');
          db.exec('BEGIN IMMEDIATE');
          return db;
        },
        async commit(db) {
          db.exec('COMMIT');
        },
      },
      async recordEffect(db, id) {
        db.prepare(`INSERT INTO ${effects} (effect_id) VALUES (?)`).run(id);
      },
      async readEffects() {
        const rows = database.prepare(`SELECT effect_id FROM ${effects} ORDER BY seq`).all() as { effect_id: string }[];
        return rows.map((row) => row.effect_id);
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
        } finally {
          database.close();
          removeFile(file);
        }
      },
    };
  } catch (error) {
    database.close();
    throw error;
  }
}

/** A libsql store fixture plus what this package's tests need. */
export interface LibsqlFixture extends StoreFixture<Transaction> {
  readonly client: Client;
  readonly outbox: LibsqlOutboxStore;
  readonly inbox: LibsqlInboxStore;
  readonly file: string;
  readonly tablePrefix: string;
}

/** Opens `<testId>.db` with `@libsql/client` (`file:` URL), creates the schema and the effects table. */
export async function createLibsqlFixture(context: FixtureContext, options: { outbox?: Partial<Omit<LibsqlOutboxStoreConfig, 'client'>> } = {}): Promise<LibsqlFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  const file = sqliteFile(testId);
  const client = createClient({ url: `file:${file}` });
  const tablePrefix = `${testId}_`;
  const effects = `"${testId}_effects"`;
  try {
    const outbox = new LibsqlOutboxStore({ ...options.outbox, client, tablePrefix });
    const inbox = new LibsqlInboxStore({ client, tablePrefix });
    await outbox.ensureSchema();
    await withLibsqlTransaction(client, async (tx) => {
      await tx.execute(`CREATE TABLE IF NOT EXISTS ${effects} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`);
    });
    return {
      client,
      outbox,
      inbox,
      file,
      tablePrefix,
      outboxPublishedRows: outbox.publishedRows,
      transaction: (work) => withLibsqlTransaction(client, work),
      transactionHeldBeforeCommit: (work, beforeCommit) =>
        withLibsqlTransaction(client, async (tx) => {
          const value = await work(tx);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        begin: () => client.transaction('write'),
        async rollback(tx) {
          await tx.rollback();
          tx.close();
          return client.transaction('write');
        },
        async commit(tx) {
          try {
            await tx.commit();
          } finally {
            tx.close();
          }
        },
      },
      async recordEffect(tx, id) {
        await tx.execute({ sql: `INSERT INTO ${effects} (effect_id) VALUES (?)`, args: [id] });
      },
      async readEffects() {
        const result = await client.execute(`SELECT effect_id FROM ${effects} ORDER BY seq`);
        return result.rows.map((row) => String(row['effect_id']));
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
        } finally {
          client.close();
          removeFile(file);
        }
      },
    };
  } catch (error) {
    client.close();
    throw error;
  }
}
