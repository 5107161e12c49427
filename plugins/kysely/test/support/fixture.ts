// Store fixtures on Kysely for the conformance suites and this package's tests: one Kysely
// per test over PostgreSQL (pg), MariaDB (mysql2) or a SQLite file (better-sqlite3), Courier
// tables prefixed `<testId>_`, and an effects table written through the handler's Kysely
// transaction. Servers that cannot be reached fail loudly with how to start them.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import Database from 'better-sqlite3';
import { Kysely, MysqlDialect, PostgresDialect, SqliteDialect, sql, type LogEvent, type Transaction } from 'kysely';
import { createPool } from 'mysql2';
import pg from 'pg';
import { KyselyInboxStore, KyselyOutboxStore, preparingCourierStatements } from '../../src/index.js';

/** The databases the fixtures can target. */
export type KyselyFixtureDialect = 'postgresql' | 'mariadb' | 'sqlite';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-kysely-sqlite');

const HOW_TO_START: Record<KyselyFixtureDialect, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** The tables of a fixture's database as the tests see them (untyped: names are per test). */
export type AnyDb = Record<string, Record<string, unknown>>;
export type Trx = Transaction<AnyDb>;

/** A store fixture plus what this package's tests need. */
export interface KyselyFixture extends StoreFixture<Trx> {
  readonly dialect: KyselyFixtureDialect;
  readonly db: Kysely<AnyDb>;
  readonly inbox: KyselyInboxStore<AnyDb>;
  readonly outbox: KyselyOutboxStore<AnyDb>;
  readonly tablePrefix: string;
  /** Quoted name of a Courier table of this fixture, e.g. `table('outbox')`. */
  table(name: string): string;
}

/**
 * Opens a Kysely on `dialect` for one test (its own file on SQLite); `onStatement`, when
 * given, sees the text of every statement it sends (Kysely's `log`, set only at construction).
 */
export async function openKysely(dialect: KyselyFixtureDialect, testId: string, onStatement?: (text: string) => void): Promise<Kysely<AnyDb>> {
  const log = onStatement === undefined ? {} : { log: (event: LogEvent) => onStatement(event.query.sql) };
  let db: Kysely<AnyDb>;
  switch (dialect) {
    case 'postgresql':
      // Courier's statements prepared, as the README recommends: the suites run on that path
      // (test/prepared-statements.test.ts covers the unwrapped pool too).
      db = new Kysely<AnyDb>({ dialect: new PostgresDialect({ pool: preparingCourierStatements(new pg.Pool({ connectionString: PG_URL, max: 10 })) }), ...log });
      break;
    case 'mariadb':
      db = new Kysely<AnyDb>({ dialect: new MysqlDialect({ pool: createPool({ uri: MARIADB_URL, connectionLimit: 10, connectTimeout: 10_000 }) }), ...log });
      break;
    case 'sqlite':
      mkdirSync(SQLITE_DIR, { recursive: true });
      db = new Kysely<AnyDb>({ dialect: new SqliteDialect({ database: new Database(join(SQLITE_DIR, `${testId}.db`)) }), ...log });
      break;
  }
  try {
    await sql`SELECT 1`.execute(db);
  } catch (error) {
    await db.destroy().catch(() => undefined);
    throw new Error(`the ${dialect} test database cannot be reached: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  return db;
}

/** Creates the fixture of `testId` on `dialect`: schema, effects table, stores. */
export async function createKyselyFixture(dialect: KyselyFixtureDialect, context: FixtureContext): Promise<KyselyFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  // What the kit's statementLog reports: Kysely's log sees every statement it sends, in
  // transactions too. PostgreSQL: the INSERT takes the advisory locks; MariaDB: at most the
  // key buckets FOR UPDATE, then the INSERT.
  const statements = recordStatements(dialect === 'postgresql' ? 1 : 2);
  const db = await openKysely(dialect, testId, dialect === 'sqlite' ? undefined : statements.record);
  const tablePrefix = `${testId}_`;
  const effects = `${testId}_effects`;
  const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
  try {
    const ddl =
      dialect === 'postgresql'
        ? `CREATE TABLE IF NOT EXISTS ${quote(effects)} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
        : dialect === 'sqlite'
          ? `CREATE TABLE IF NOT EXISTS ${quote(effects)} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`
          : `CREATE TABLE IF NOT EXISTS ${quote(effects)} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`;
    await sql.raw(ddl).execute(db);
    const inbox = new KyselyInboxStore({ db, tablePrefix });
    const outbox = new KyselyOutboxStore({ db, tablePrefix });
    await outbox.ensureSchema();
    return {
      dialect,
      db,
      inbox,
      outbox,
      outboxPublishedRows: outbox.publishedRows,
      ...(dialect === 'sqlite' ? {} : { statementLog: statements.statementLog }),
      tablePrefix,
      table: (name: string) => quote(`${tablePrefix}${name}`),
      transaction: <T>(work: (tx: Trx) => Promise<T>) => db.transaction().execute(work),
      transactionHeldBeforeCommit: <T>(work: (tx: Trx) => Promise<T>, beforeCommit: () => Promise<void>) =>
        db.transaction().execute(async (tx) => {
          const value = await work(tx);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        begin: () => db.startTransaction().execute(),
        async rollback(tx: Trx) {
          await (tx as Awaited<ReturnType<ReturnType<typeof db.startTransaction>['execute']>>).rollback().execute();
          return db.startTransaction().execute();
        },
        commit: (tx: Trx) => (tx as Awaited<ReturnType<ReturnType<typeof db.startTransaction>['execute']>>).commit().execute(),
      },
      async recordEffect(tx: Trx, id: string) {
        await sql`INSERT INTO ${sql.table(effects)} (effect_id) VALUES (${id})`.execute(tx);
      },
      async readEffects() {
        const { rows } = await sql<{ effect_id: string }>`SELECT effect_id FROM ${sql.table(effects)} ORDER BY seq`.execute(db);
        return rows.map((row) => String(row.effect_id));
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
        } finally {
          await db.destroy();
          if (dialect === 'sqlite' && process.env['COURIER_CONFORMANCE_WORKER'] === undefined) {
            for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(join(SQLITE_DIR, `${testId}.db${suffix}`), { force: true });
          }
        }
      },
    };
  } catch (error) {
    await db.destroy().catch(() => undefined);
    throw error;
  }
}
