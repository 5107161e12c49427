// Store fixtures on Drizzle for the conformance suites and this package's tests: one Drizzle
// database per test over PostgreSQL (node-postgres), MariaDB (mysql2) or a SQLite file
// (libsql), Courier tables prefixed `<testId>_`, and an effects table written through the
// handler's Drizzle transaction. Servers that cannot be reached fail loudly with how to start them.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import { sql } from 'drizzle-orm';
import { drizzle as drizzleMysql } from 'drizzle-orm/mysql2';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { createPool } from 'mysql2/promise';
import pg from 'pg';
import { SQLITE_BUSY_TIMEOUT_MS } from '@courier/sql-engine';
import { DrizzleInboxStore, DrizzleOutboxStore } from '../../src/index.js';

/** The databases the fixtures can target. */
export type DrizzleFixtureDialect = 'postgresql' | 'mariadb' | 'sqlite';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-drizzle-sqlite');

const HOW_TO_START: Record<DrizzleFixtureDialect, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** A Drizzle database of any supported driver, as the tests use it (untyped schema). */
// The fixture serves three drivers whose databases and transactions share no useful supertype.
export type AnyDb = any;
export type Trx = any;

/** A store fixture plus what this package's tests need. */
export interface DrizzleFixture extends StoreFixture<Trx> {
  readonly dialect: DrizzleFixtureDialect;
  readonly db: AnyDb;
  readonly inbox: DrizzleInboxStore<AnyDb, Trx>;
  readonly outbox: DrizzleOutboxStore<AnyDb, Trx>;
  readonly tablePrefix: string;
  /** Runs `query` on the database (PostgreSQL/MySQL `execute`, SQLite `all`) and returns its rows. */
  rows(query: ReturnType<typeof sql.raw>): Promise<Record<string, unknown>[]>;
}

async function openSqlite(file: string) {
  const { drizzle } = await import('drizzle-orm/libsql');
  // libsql opens a connection per transaction and BEGINs before any statement of ours could
  // set a busy timeout on it: without `timeout` a second writer fails with SQLITE_BUSY at once.
  return drizzle({ connection: { url: `file:${file}`, timeout: SQLITE_BUSY_TIMEOUT_MS } });
}

/** Drizzle's query logger: every statement a Drizzle database or its transactions send (Courier's included, as its executor runs through Drizzle). */
export interface QueryLogger {
  logQuery(query: string, params: unknown[]): void;
}

/** Opens a Drizzle database on `dialect` for one test (its own file on SQLite) and a way to close it; `logger` sees every statement it sends. */
export async function openDrizzle(dialect: DrizzleFixtureDialect, testId: string, logger?: QueryLogger): Promise<{ db: AnyDb; close(): Promise<void> }> {
  let opened: { db: AnyDb; close(): Promise<void> };
  switch (dialect) {
    case 'postgresql': {
      const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
      opened = { db: drizzlePg(pool, logger ? { logger } : {}), close: () => pool.end() };
      break;
    }
    case 'mariadb': {
      const pool = createPool({ uri: MARIADB_URL, connectionLimit: 10, connectTimeout: 10_000 });
      opened = { db: drizzleMysql(pool, logger ? { logger } : {}), close: () => pool.end() };
      break;
    }
    case 'sqlite': {
      mkdirSync(SQLITE_DIR, { recursive: true });
      const db = await openSqlite(join(SQLITE_DIR, `${testId}.db`));
      opened = {
        db,
        async close() {
          db.$client.close();
        },
      };
      break;
    }
  }
  try {
    await rowsOf(opened.db, sql.raw('SELECT 1'));
  } catch (error) {
    await opened.close().catch(() => undefined);
    throw new Error(`the ${dialect} test database cannot be reached: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  return opened;
}

async function rowsOf(db: Trx, query: ReturnType<typeof sql.raw>): Promise<Record<string, unknown>[]> {
  if (typeof db.all === 'function') return db.all(query);
  const result = await db.execute(query);
  return Array.isArray(result) ? result[0] : result.rows;
}

/**
 * A Drizzle transaction held open outside its callback, as the suite's reusable unit of work
 * needs: Drizzle only offers callback transactions, so the callback waits until `commit` or
 * `rollback` is called.
 */
export async function openTransaction(db: AnyDb): Promise<{ tx: Trx; commit(): Promise<void>; rollback(): Promise<void> }> {
  let finish!: (outcome: 'commit' | 'rollback') => void;
  const decided = new Promise<'commit' | 'rollback'>((resolve) => (finish = resolve));
  let handTx!: (tx: Trx) => void;
  const opened = new Promise<Trx>((resolve) => (handTx = resolve));
  const rolledBack = new Error('rollback requested by the test');
  const done = (db as Trx)
    .transaction(async (tx: Trx) => {
      handTx(tx);
      if ((await decided) === 'rollback') throw rolledBack;
    })
    .catch((error: unknown) => {
      if (error !== rolledBack) throw error;
    });
  const tx = await Promise.race([opened, done.then(() => Promise.reject(new Error('the transaction ended before it opened')))]);
  return {
    tx,
    commit: () => (finish('commit'), done),
    rollback: () => (finish('rollback'), done),
  };
}

/** Creates the fixture of `testId` on `dialect`: schema, effects table, stores. */
export async function createDrizzleFixture(dialect: DrizzleFixtureDialect, context: FixtureContext): Promise<DrizzleFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  // What the kit's statementLog reports: Drizzle's logger sees every statement on the database.
  // PostgreSQL: the INSERT takes the advisory locks; MariaDB: at most the key buckets FOR UPDATE, then the INSERT.
  const statements = recordStatements(dialect === 'postgresql' ? 1 : 2);
  const { db, close } = await openDrizzle(dialect, testId, {
    logQuery(query) {
      statements.record(query);
    },
  });
  const tablePrefix = `${testId}_`;
  const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
  const effects = quote(`${testId}_effects`);
  const open = new Map<Trx, { commit(): Promise<void>; rollback(): Promise<void> }>();
  const begin = async () => {
    const handle = await openTransaction(db);
    open.set(handle.tx, handle);
    return handle.tx;
  };
  const handleOf = (tx: Trx) => {
    const handle = open.get(tx);
    if (!handle) throw new Error('not a transaction this fixture began');
    open.delete(tx);
    return handle;
  };
  try {
    const ddl =
      dialect === 'postgresql'
        ? `CREATE TABLE IF NOT EXISTS ${effects} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
        : dialect === 'sqlite'
          ? `CREATE TABLE IF NOT EXISTS ${effects} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`
          : `CREATE TABLE IF NOT EXISTS ${effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`;
    await rowsOf(db, sql.raw(ddl));
    const inbox = new DrizzleInboxStore<AnyDb, Trx>({ db, tablePrefix });
    const outbox = new DrizzleOutboxStore<AnyDb, Trx>({ db, tablePrefix });
    await outbox.ensureSchema();
    return {
      dialect,
      db,
      inbox,
      outbox,
      outboxPublishedRows: outbox.publishedRows,
      ...(dialect === 'sqlite'
        ? {}
        : {
            statementLog: statements.statementLog,
          }),
      tablePrefix,
      rows: (query) => rowsOf(db, query),
      transaction: <T>(work: (tx: Trx) => Promise<T>) => (db as Trx).transaction(work) as Promise<T>,
      transactionHeldBeforeCommit: <T>(work: (tx: Trx) => Promise<T>, beforeCommit: () => Promise<void>) =>
        (db as Trx).transaction(async (tx: Trx) => {
          const value = await work(tx);
          await beforeCommit();
          return value;
        }) as Promise<T>,
      reusableUnitOfWork: {
        begin,
        async rollback(tx: Trx) {
          await handleOf(tx).rollback();
          return begin();
        },
        commit: (tx: Trx) => handleOf(tx).commit(),
      },
      async recordEffect(tx: Trx, id: string) {
        await rowsOf(tx, sql`INSERT INTO ${sql.raw(effects)} (effect_id) VALUES (${id})`);
      },
      async readEffects() {
        const rows = await rowsOf(db, sql.raw(`SELECT effect_id FROM ${effects} ORDER BY seq`));
        return rows.map((row) => String(row['effect_id']));
      },
      async close() {
        try {
          for (const handle of open.values()) await handle.rollback().catch(() => undefined);
          await outbox.close();
          await inbox.close();
        } finally {
          await close();
          if (dialect === 'sqlite' && process.env['COURIER_CONFORMANCE_WORKER'] === undefined) {
            for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(join(SQLITE_DIR, `${testId}.db${suffix}`), { force: true });
          }
        }
      },
    };
  } catch (error) {
    await close().catch(() => undefined);
    throw error;
  }
}
