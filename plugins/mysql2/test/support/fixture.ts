// Store fixtures for the conformance suites and this package's own tests: one mysql2 pool
// per test, Courier tables named after the test id (so cases run concurrently on one
// server), and a per-test effects table written on the handler's connection.
//
// Importable in a child process: `createMysql2Fixture({ testId })` with the same testId
// reconnects to the same tables; `close()` never drops them.
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import { createPool, type Pool, type PoolConnection } from 'mysql2/promise';
import { Mysql2InboxStore, Mysql2OutboxStore, settleAppends, withTransaction, type Mysql2OutboxStoreConfig } from '../../src/index.js';
import { runInTransaction } from '../../src/transactions.js';

/** Connection URL of the MariaDB (or MySQL 8) test database (`COURIER_MARIADB_URL`). */
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';

const HOW_TO_START =
  `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`, ` +
  `or \`eval "$(bash scripts/services.sh)"\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`;

/** A store fixture plus what this package's own tests need beyond the conformance interface. */
export interface Mysql2Fixture extends StoreFixture<PoolConnection> {
  readonly pool: Pool;
  readonly outbox: Mysql2OutboxStore;
  readonly inbox: Mysql2InboxStore;
  /** The Courier table prefix of this fixture (`<testId>_`). */
  readonly tablePrefix: string;
  /** Runs SQL (`?` placeholders) on the pool, outside any transaction. */
  sql(query: string, params?: readonly unknown[]): Promise<Record<string, unknown>[]>;
  /** Quoted name of a table of this fixture, e.g. `table('outbox')`. */
  table(name: string): string;
}

/** Opens a pool on the test database and the stores with prefix `<testId>_`; fails loudly with how to start MariaDB. */
export async function createMysql2Fixture(context: FixtureContext, options: { outbox?: Partial<Omit<Mysql2OutboxStoreConfig, 'pool'>> } = {}): Promise<Mysql2Fixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  // connectTimeout: a loaded machine can take more than mysql2's 10 s default to see a local socket open.
  const pool = createPool({ uri: MARIADB_URL, connectionLimit: 8, connectTimeout: 30_000 });
  // What the kit's statementLog reports: mysql2 has no query event, so each connection the pool
  // opens has its `query` (which the promise API and transaction control call) wrapped.
  // MariaDB: at most the keys' locks (with the transaction check) in a SELECT, then the INSERT.
  const statements = recordStatements(2);
  pool.on('connection', (connection) => {
    const core = connection as unknown as { query: (...args: unknown[]) => unknown };
    const query = core.query.bind(core);
    core.query = (...args: unknown[]) => {
      const [first] = args;
      statements.record(typeof first === 'string' ? first : String((first as { sql?: unknown } | null)?.sql));
      return query(...args);
    };
  });
  const tablePrefix = `${testId}_`;
  const effects = `\`${testId}_effects\``;
  const sql = async (query: string, params: readonly unknown[] = []) => {
    const [rows] = await pool.query({ sql: query, values: params as unknown[], supportBigNumbers: true, bigNumberStrings: true });
    return Array.isArray(rows) ? (rows as Record<string, unknown>[]) : [];
  };
  try {
    await sql(`CREATE TABLE IF NOT EXISTS ${effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`);
  } catch (error) {
    await pool.end().catch(() => undefined);
    throw new Error(`MariaDB is not reachable for the mysql2 tests: ${error instanceof Error ? error.message : String(error)}; ${HOW_TO_START}`, { cause: error });
  }
  const outbox = new Mysql2OutboxStore({ ...options.outbox, pool, tablePrefix });
  const inbox = new Mysql2InboxStore({ pool, tablePrefix });
  await outbox.ensureSchema();
  return {
    pool,
    outbox,
    inbox,
    tablePrefix,
    sql,
    table: (name: string) => `\`${tablePrefix}${name}\``,
    outboxPublishedRows: outbox.publishedRows,
    statementLog: statements.statementLog,
    transaction: (work) => withTransaction(pool, work),
    async transactionHeldBeforeCommit(work, beforeCommit) {
      const connection = await pool.getConnection();
      return runInTransaction(connection, work, false, beforeCommit);
    },
    reusableUnitOfWork: {
      async begin() {
        const connection = await pool.getConnection();
        await connection.beginTransaction();
        return connection;
      },
      async rollback(connection) {
        // The writes started on it belong to the transaction being rolled back.
        await settleAppends(connection).catch(() => undefined);
        await connection.rollback();
        await connection.beginTransaction();
        return connection;
      },
      async commit(connection) {
        try {
          await settleAppends(connection);
          await connection.commit();
        } catch (error) {
          await connection.rollback().catch(() => undefined);
          throw error;
        } finally {
          connection.release();
        }
      },
    },
    async recordEffect(tx, id) {
      await tx.query(`INSERT INTO ${effects} (effect_id) VALUES (?)`, [id]);
    },
    async readEffects() {
      const rows = await sql(`SELECT effect_id FROM ${effects} ORDER BY seq`);
      return rows.map((row) => String(row['effect_id']));
    },
    async close() {
      await outbox.close();
      await inbox.close();
      await pool.end();
    },
  };
}
