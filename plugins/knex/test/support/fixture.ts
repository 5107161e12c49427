// Store fixtures on Knex for the conformance suites and this package's tests: one Knex per
// test over PostgreSQL (pg), MariaDB (mysql2) or a SQLite file (better-sqlite3), Courier
// tables prefixed `<testId>_`, and an effects table written through the handler's Knex
// transaction. Servers that cannot be reached fail loudly with how to start them.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import knexFactory, { type Knex } from 'knex';
import { KnexInboxStore, KnexOutboxStore } from '../../src/index.js';

/** The databases the fixtures can target. */
export type KnexFixtureDialect = 'postgresql' | 'mariadb' | 'sqlite';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-knex-sqlite');

const HOW_TO_START: Record<KnexFixtureDialect, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** A store fixture plus what this package's tests need. */
export interface KnexFixture extends StoreFixture<Knex.Transaction> {
  readonly dialect: KnexFixtureDialect;
  readonly knex: Knex;
  readonly inbox: KnexInboxStore;
  readonly outbox: KnexOutboxStore;
  readonly tablePrefix: string;
  /** Quoted name of a Courier table of this fixture, e.g. `table('outbox')`. */
  table(name: string): string;
}

/** Opens a Knex on `dialect` for one test (its own file on SQLite). */
export async function openKnex(dialect: KnexFixtureDialect, testId: string): Promise<Knex> {
  let knex: Knex;
  switch (dialect) {
    case 'postgresql':
      knex = knexFactory({ client: 'pg', connection: PG_URL, pool: { min: 0, max: 10 } });
      break;
    case 'mariadb':
      knex = knexFactory({ client: 'mysql2', connection: { uri: MARIADB_URL, connectTimeout: 10_000 } as Knex.MySql2ConnectionConfig, pool: { min: 0, max: 10 } });
      break;
    case 'sqlite':
      mkdirSync(SQLITE_DIR, { recursive: true });
      knex = knexFactory({ client: 'better-sqlite3', connection: { filename: join(SQLITE_DIR, `${testId}.db`) }, useNullAsDefault: true });
      break;
  }
  try {
    await knex.raw('SELECT 1');
  } catch (error) {
    await knex.destroy().catch(() => undefined);
    throw new Error(`the ${dialect} test database cannot be reached: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  return knex;
}

/** Creates the fixture of `testId` on `dialect`: schema, effects table, stores. */
export async function createKnexFixture(dialect: KnexFixtureDialect, context: FixtureContext): Promise<KnexFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  const knex = await openKnex(dialect, testId);
  // What the kit's statementLog reports: knex emits 'query' for every statement it sends, in
  // transactions too (Courier's run through knex.raw).
  // PostgreSQL: the INSERT takes the advisory locks; MariaDB: at most the key buckets FOR UPDATE, then the INSERT.
  const statements = recordStatements(dialect === 'postgresql' ? 1 : 2);
  knex.on('query', (query: { sql: string }) => statements.record(query.sql));
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
    await knex.raw(ddl);
    const inbox = new KnexInboxStore({ knex, tablePrefix });
    const outbox = new KnexOutboxStore({ knex, tablePrefix });
    await outbox.ensureSchema();
    return {
      dialect,
      knex,
      inbox,
      outbox,
      outboxPublishedRows: outbox.publishedRows,
      ...(dialect === 'sqlite'
        ? {}
        : {
            statementLog: statements.statementLog,
          }),
      tablePrefix,
      table: (name: string) => quote(`${tablePrefix}${name}`),
      transaction: <T>(work: (tx: Knex.Transaction) => Promise<T>) => knex.transaction(work),
      transactionHeldBeforeCommit: <T>(work: (tx: Knex.Transaction) => Promise<T>, beforeCommit: () => Promise<void>) =>
        knex.transaction(async (tx) => {
          const value = await work(tx);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        begin: () => knex.transaction(),
        async rollback(tx: Knex.Transaction) {
          await tx.rollback();
          return knex.transaction();
        },
        async commit(tx: Knex.Transaction) {
          await tx.commit();
        },
      },
      async recordEffect(tx: Knex.Transaction, id: string) {
        await tx(effects).insert({ effect_id: id });
      },
      async readEffects() {
        const rows = (await knex(effects).select('effect_id').orderBy('seq')) as { effect_id: string }[];
        return rows.map((row) => String(row.effect_id));
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
        } finally {
          await knex.destroy();
          if (dialect === 'sqlite' && process.env['COURIER_CONFORMANCE_WORKER'] === undefined) {
            for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(join(SQLITE_DIR, `${testId}.db${suffix}`), { force: true });
          }
        }
      },
    };
  } catch (error) {
    await knex.destroy().catch(() => undefined);
    throw error;
  }
}
