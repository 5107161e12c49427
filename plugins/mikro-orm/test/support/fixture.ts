// Store fixtures for the conformance suites and the plugin's own tests: one MikroORM per
// test, Courier tables named after the test id (so cases run concurrently on one server),
// and a per-test effects table written through the unit of work.
//
// Importable in a child process: `createFixture({ testId })` with the same testId (and
// the same COURIER_STORE_DIALECT) reconnects to the same tables; `close()` never drops them.
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FixtureContext, StoreFixture } from '@courier/conformance';
import { EntitySchema, type EntityManager, type MikroORM, type Options } from '@mikro-orm/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore, type MikroOrmOutboxStoreConfig } from '../../src/index.js';
import { locateInStore } from './locate.js';

/** The databases the fixtures can target. `mysql-driver` is MariaDB through `@mikro-orm/mysql` (mysql2). */
export type FixtureDialect = 'postgresql' | 'mariadb' | 'mysql-driver' | 'sqlite';

/** Every fixture dialect, for tests that loop over them. */
export const FIXTURE_DIALECTS: readonly FixtureDialect[] = ['postgresql', 'mariadb', 'mysql-driver', 'sqlite'];

/** Connection URL of the PostgreSQL test database (`COURIER_PG_URL`). */
export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
/** Connection URL of the MariaDB (or MySQL 8) test database (`COURIER_MARIADB_URL`). */
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
/**
 * The mariadb connector gives up on a new socket after 1 s by default: a loaded machine
 * (CPU-starved event loop) can take longer than that to see a local connection open.
 */
const MARIADB_DRIVER_OPTIONS = { connection: { connectTimeout: 10_000 } };
/** Folder of the SQLite test files (`COURIER_SQLITE_DIR`). */
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-mikro-orm-sqlite');

const HOW_TO_START: Record<FixtureDialect, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  'mysql-driver': `start MariaDB (see the 'mariadb' fixture) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** A store fixture plus what the plugin's own tests need beyond the conformance interface. */
export interface MikroOrmFixture extends StoreFixture<EntityManager> {
  readonly dialect: FixtureDialect;
  readonly orm: MikroORM;
  readonly outbox: MikroOrmOutboxStore;
  readonly inbox: MikroOrmInboxStore;
  /** The Courier table prefix of this fixture (`<testId>_`). */
  readonly tablePrefix: string;
  /** Entity class of the effects table, for tests that persist entities next to appends. */
  readonly Effect: new () => { seq?: number; effectId: string };
  /** Runs raw SQL (`?` placeholders) outside any unit of work. */
  sql(query: string, params?: readonly unknown[]): Promise<Record<string, unknown>[]>;
  /** Quoted name of a table of this fixture, e.g. `table('outbox')`. */
  table(name: string): string;
}

/** Options of {@link createMikroOrmFixture}. */
export interface MikroOrmFixtureOptions {
  /** Extra outbox settings (wake-ups, logger). */
  readonly outbox?: Partial<Omit<MikroOrmOutboxStoreConfig, 'orm'>>;
  /** Extra ORM options (pool sizes, allowGlobalContext). */
  readonly orm?: Partial<Options>;
  /** Skip ensureSchema (tests of the missing-schema error). */
  readonly withoutSchema?: boolean;
}

/**
 * Opens a MikroORM for `dialect` with the effects entity of `testId`, creates the Courier
 * schema with prefix `<testId>_` and the effects table, and returns the fixture. A server
 * that cannot be reached fails loudly with how to start it.
 */
export async function createMikroOrmFixture(dialect: FixtureDialect, context: FixtureContext, options: MikroOrmFixtureOptions = {}): Promise<MikroOrmFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  const effectsTable = `${testId}_effects`;
  // A class per fixture: MikroORM hangs metadata on the class prototype, so sharing one
  // class between concurrently open ORMs would mix up their table names.
  class Effect {
    seq?: number;
    effectId!: string;
  }
  const schema = new EntitySchema<Effect>({
    class: Effect,
    tableName: effectsTable,
    properties: {
      seq: { type: 'number', primary: true, autoincrement: true },
      effectId: { type: 'string', fieldName: 'effect_id' },
    },
  });
  const orm = await openOrm(dialect, testId, [schema], options.orm ?? {});
  const tablePrefix = `${testId}_`;
  const connection = orm.em.getConnection('write');
  const quote = (name: string) => (dialect === 'mariadb' || dialect === 'mysql-driver' ? `\`${name}\`` : `"${name}"`);
  const sql = async (query: string, params: readonly unknown[] = []) => (await connection.execute(query, [...params], 'all')) as Record<string, unknown>[];
  try {
    const effectsDdl =
      dialect === 'postgresql'
        ? `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
        : dialect === 'sqlite'
          ? `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`
          : `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`;
    await connection.execute(effectsDdl, [], 'run');
    const outbox = new MikroOrmOutboxStore({ ...options.outbox, orm, tablePrefix });
    const inbox = new MikroOrmInboxStore({ orm, tablePrefix });
    if (!options.withoutSchema) await outbox.ensureSchema();
    return {
      dialect,
      orm,
      outbox,
      inbox,
      tablePrefix,
      Effect,
      sql,
      table: (name: string) => quote(`${tablePrefix}${name}`),
      outboxPublishedRows: outbox.publishedRows,
      transaction: <T>(work: (tx: EntityManager) => Promise<T>) => orm.em.fork().transactional((em) => work(em)),
      transactionHeldBeforeCommit: <T>(work: (tx: EntityManager) => Promise<T>, beforeCommit: () => Promise<void>) =>
        orm.em.fork().transactional((em) => {
          // The transactional fork has an event manager of its own (a clone), so this hook
          // sees only this transaction; it runs after the store's subscriber, registered
          // first, has written the rows.
          em.getEventManager().registerSubscriber({ beforeTransactionCommit: () => beforeCommit() });
          return work(em);
        }),
      reusableUnitOfWork: {
        async begin() {
          const em = orm.em.fork();
          await em.begin();
          return em;
        },
        async rollback(em: EntityManager) {
          await em.rollback();
          await em.begin();
          return em;
        },
        commit: (em: EntityManager) => em.commit(),
      },
      async recordEffect(tx: EntityManager, id: string) {
        // Through the unit of work, like a handler's own entity: persisted, then flushed
        // inside the caller's transaction.
        tx.persist(tx.create(Effect, { effectId: id }));
        await tx.flush();
      },
      async readEffects() {
        const rows = await sql(`SELECT effect_id FROM ${quote(effectsTable)} ORDER BY seq`);
        return rows.map((row) => String(row['effect_id']));
      },
      locate: (ids: readonly string[]) => locateInStore({ dialect, sql, table: (name) => quote(`${tablePrefix}${name}`) }, ids),
      async close() {
        await outbox.close();
        await inbox.close();
        await orm.close();
      },
    };
  } catch (error) {
    await orm.close().catch(() => undefined);
    throw error;
  }
}

async function openOrm(dialect: FixtureDialect, testId: string, entities: EntitySchema[], extra: Partial<Options>): Promise<MikroORM> {
  const common = { entities, debug: false, discovery: { warnWhenNoEntities: false }, ...extra };
  let orm: MikroORM;
  try {
    switch (dialect) {
      case 'postgresql': {
        const { MikroORM: PgOrm } = await import('@mikro-orm/postgresql');
        orm = await PgOrm.init({ clientUrl: PG_URL, pool: { min: 0, max: 10 }, ...common } as Options);
        break;
      }
      case 'mariadb': {
        const { MikroORM: MariaDbOrm } = await import('@mikro-orm/mariadb');
        orm = await MariaDbOrm.init({ clientUrl: MARIADB_URL, pool: { min: 0, max: 10 }, driverOptions: MARIADB_DRIVER_OPTIONS, ...common } as Options);
        break;
      }
      case 'mysql-driver': {
        const { MikroORM: MySqlOrm } = await import('@mikro-orm/mysql');
        orm = await MySqlOrm.init({ clientUrl: MARIADB_URL, pool: { min: 0, max: 10 }, ...common } as Options);
        break;
      }
      case 'sqlite': {
        mkdirSync(SQLITE_DIR, { recursive: true });
        const { MikroORM: LibSqlOrm } = await import('@mikro-orm/libsql');
        orm = await LibSqlOrm.init({ dbName: join(SQLITE_DIR, `${testId}.db`), ...common } as Options);
        break;
      }
    }
  } catch (error) {
    throw new Error(`the ${dialect} test database cannot be opened: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  // MikroORM 7's init no longer connects (the first query does), and its checkConnection()
  // reports "Connection not established" until then: connect first, so an unreachable
  // server fails here, with how to start it. On 6, init has connected already.
  if (!(await orm.isConnected())) {
    try {
      await orm.connect();
    } catch (error) {
      await orm.close(true).catch(() => undefined);
      throw new Error(`the ${dialect} test database cannot be opened: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
    }
  }
  const check = await orm.em.getConnection().checkConnection();
  if (!check.ok) {
    await orm.close(true).catch(() => undefined);
    throw new Error(`the ${dialect} test database is unreachable (${check.reason}); ${HOW_TO_START[dialect]}`, { cause: check.error });
  }
  return orm;
}

/** The fixture dialect of a child process: `COURIER_STORE_DIALECT`, default `postgresql`. */
export function dialectFromEnvironment(): FixtureDialect {
  const value = process.env['COURIER_STORE_DIALECT'] ?? 'postgresql';
  if (!(FIXTURE_DIALECTS as readonly string[]).includes(value)) {
    throw new Error(`COURIER_STORE_DIALECT must be one of ${FIXTURE_DIALECTS.join(', ')}, got ${JSON.stringify(value)}`);
  }
  return value as FixtureDialect;
}

/**
 * The outbox's `publishedRows` of a child process: `COURIER_STORE_PUBLISHED_ROWS`, default
 * `keep` (the store's default), so a test file can run the bus suite's workers in either mode.
 */
export function publishedRowsFromEnvironment(): 'keep' | 'delete' {
  const value = process.env['COURIER_STORE_PUBLISHED_ROWS'] ?? 'keep';
  if (value !== 'keep' && value !== 'delete') throw new Error(`COURIER_STORE_PUBLISHED_ROWS must be keep or delete, got ${JSON.stringify(value)}`);
  return value;
}

/**
 * The fixture factory of the conformance suites (`StoreFixtureFactory<EntityManager>`),
 * for the dialect in `COURIER_STORE_DIALECT` (default PostgreSQL) unless one is given, and
 * the outbox's `publishedRows` in `COURIER_STORE_PUBLISHED_ROWS` (default `keep`).
 */
export function createFixture(context: FixtureContext, dialect: FixtureDialect = dialectFromEnvironment()): Promise<MikroOrmFixture> {
  const publishedRows = publishedRowsFromEnvironment();
  return createMikroOrmFixture(dialect, context, publishedRows === 'keep' ? {} : { outbox: { publishedRows } });
}

/** Per-dialect factories, for the conformance test files. */
export const createPostgresFixture = (context: FixtureContext) => createMikroOrmFixture('postgresql', context);
export const createMariaDbFixture = (context: FixtureContext) => createMikroOrmFixture('mariadb', context);
export const createMySqlDriverFixture = (context: FixtureContext) => createMikroOrmFixture('mysql-driver', context);
export const createSqliteFixture = (context: FixtureContext) => createMikroOrmFixture('sqlite', context);

/** Per-dialect factories whose outbox deletes rows at completion (`publishedRows: 'delete'`). */
export const createPostgresDeletingFixture = (context: FixtureContext) => createMikroOrmFixture('postgresql', context, { outbox: { publishedRows: 'delete' } });
export const createMariaDbDeletingFixture = (context: FixtureContext) => createMikroOrmFixture('mariadb', context, { outbox: { publishedRows: 'delete' } });
export const createSqliteDeletingFixture = (context: FixtureContext) => createMikroOrmFixture('sqlite', context, { outbox: { publishedRows: 'delete' } });
