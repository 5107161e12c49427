// Store fixtures on TypeORM for the conformance suites: one DataSource per test over
// PostgreSQL (pg) or MariaDB (mysql2), Courier tables prefixed `<testId>_`, and an effects
// table written through the handler's EntityManager. Servers that cannot be reached fail
// loudly with how to start them.
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import { createRequire } from 'node:module';
import { DataSource, type EntityManager, type Logger, type QueryRunner } from 'typeorm';
import { TypeOrmInboxStore, TypeOrmOutboxStore } from '../../src/index.js';

/** The databases the fixtures can target. */
export type TypeOrmFixtureDialect = 'postgresql' | 'mariadb';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';

/**
 * Opens an initialized DataSource on `dialect`; `onStatement`, when given, sees the text of
 * every statement it sends. On PostgreSQL that is read at the driver (a node-postgres Client
 * of the pool's own, through TypeORM's `extra` pool options), because Courier's statements
 * there go to the QueryRunner's pg connection past TypeORM's logger; on MariaDB every
 * statement goes through `queryRunner.query`, so TypeORM's logger sees them.
 */
export async function openDataSource(dialect: TypeOrmFixtureDialect, onStatement?: (text: string) => void): Promise<DataSource> {
  const dataSource =
    dialect === 'postgresql'
      ? new DataSource({ type: 'postgres', url: PG_URL, poolSize: 10, ...(onStatement ? { extra: { Client: recordingPgClient(onStatement) } } : {}) })
      : new DataSource({
          type: 'mariadb',
          url: MARIADB_URL,
          poolSize: 10,
          connectTimeout: 10_000,
          ...(onStatement ? { logger: statementLogger(onStatement) } : {}),
        });
  try {
    await dataSource.initialize();
  } catch (error) {
    throw new Error(`the ${dialect} test database cannot be reached: ${String(error)}; start it or point ${dialect === 'postgresql' ? `COURIER_PG_URL (now ${PG_URL})` : `COURIER_MARIADB_URL (now ${MARIADB_URL})`} at one`, {
      cause: error,
    });
  }
  return dataSource;
}

/** The part of node-postgres the recorder extends (pg is TypeORM's driver here; this package has no @types/pg). */
type PgClientClass = new (...args: never[]) => { query(...args: unknown[]): unknown };
const pgClient = (createRequire(import.meta.url)('pg') as { Client: PgClientClass }).Client;

/** A node-postgres Client class that reports the text of each query it is given. */
function recordingPgClient(onStatement: (text: string) => void): PgClientClass {
  return class RecordingClient extends pgClient {
    // pg's query() has many overloads; the recorder only reads the first argument's text.
    override query(...args: unknown[]): never {
      const [first] = args;
      const text = typeof first === 'string' ? first : (first as { text?: unknown } | null)?.text;
      if (typeof text === 'string') onStatement(text);
      return (super.query as (...rest: unknown[]) => never)(...args);
    }
  };
}

/** A TypeORM logger that reports every query and nothing else. */
function statementLogger(onStatement: (text: string) => void): Logger {
  return {
    logQuery: (query) => onStatement(query),
    logQueryError: () => undefined,
    logQuerySlow: () => undefined,
    logSchemaBuild: () => undefined,
    logMigration: () => undefined,
    log: () => undefined,
  };
}

/** A store fixture plus what this package's tests need. */
export interface TypeOrmFixture extends StoreFixture<EntityManager> {
  readonly dataSource: DataSource;
  readonly outbox: TypeOrmOutboxStore;
  readonly inbox: TypeOrmInboxStore;
}

/** Creates the fixture of `testId` on `dialect`: schema, effects table, stores. */
export async function createTypeOrmFixture(dialect: TypeOrmFixtureDialect, context: FixtureContext): Promise<TypeOrmFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  // PostgreSQL: the INSERT takes the advisory locks; MariaDB: at most the key buckets FOR UPDATE, then the INSERT.
  const statements = recordStatements(dialect === 'postgresql' ? 1 : 2);
  const dataSource = await openDataSource(dialect, statements.record);
  const tablePrefix = `${testId}_`;
  const effects = dialect === 'mariadb' ? `\`${testId}_effects\`` : `"${testId}_effects"`;
  const runners = new Set<QueryRunner>();
  const begin = async (): Promise<EntityManager> => {
    const runner = dataSource.createQueryRunner();
    await runner.startTransaction();
    runners.add(runner);
    return runner.manager;
  };
  const end = async (manager: EntityManager, how: 'commit' | 'rollback') => {
    const runner = manager.queryRunner;
    if (runner === undefined || !runners.delete(runner)) throw new Error('not a manager this fixture began');
    try {
      if (how === 'commit') await runner.commitTransaction();
      else await runner.rollbackTransaction();
    } finally {
      await runner.release();
    }
  };
  try {
    await dataSource.query(
      dialect === 'postgresql'
        ? `CREATE TABLE IF NOT EXISTS ${effects} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
        : `CREATE TABLE IF NOT EXISTS ${effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`,
    );
    const inbox = new TypeOrmInboxStore({ dataSource, tablePrefix });
    const outbox = new TypeOrmOutboxStore({ dataSource, tablePrefix });
    await outbox.ensureSchema();
    return {
      dataSource,
      inbox,
      outbox,
      outboxPublishedRows: outbox.publishedRows,
      statementLog: statements.statementLog,
      transaction: (work) => dataSource.transaction(work),
      transactionHeldBeforeCommit: (work, beforeCommit) =>
        dataSource.transaction(async (manager) => {
          const value = await work(manager);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        begin,
        async rollback(manager) {
          await end(manager, 'rollback');
          return begin();
        },
        commit: (manager) => end(manager, 'commit'),
      },
      async recordEffect(manager, id) {
        await manager.query(`INSERT INTO ${effects} (effect_id) VALUES (${dialect === 'postgresql' ? '$1' : '?'})`, [id]);
      },
      async readEffects() {
        const rows = (await dataSource.query(`SELECT effect_id FROM ${effects} ORDER BY seq`)) as { effect_id: string }[];
        return rows.map((row) => String(row.effect_id));
      },
      async close() {
        try {
          for (const runner of runners) {
            await runner.rollbackTransaction().catch(() => undefined);
            await runner.release().catch(() => undefined);
          }
          await outbox.close();
          await inbox.close();
        } finally {
          await dataSource.destroy();
        }
      },
    };
  } catch (error) {
    await dataSource.destroy().catch(() => undefined);
    throw error;
  }
}
