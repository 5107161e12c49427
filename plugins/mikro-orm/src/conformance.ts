// `@courier/mikro-orm/conformance`: a store fixture for the conformance suites that needs no
// server, so a transport author can run the bus suite, SIGKILL scenarios included, with one
// import. It is loaded only through this subpath: the package root stays free of it.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FixtureContext, StoreFixture } from '@courier/conformance';
import type { EntityManager, MikroORM, Options } from '@mikro-orm/core';
import { MikroOrmInboxStore } from './mikro-orm-inbox-store.js';
import { MikroOrmOutboxStore } from './mikro-orm-outbox-store.js';
import { withSqliteBusyTimeout } from './sqlite-options.js';

/** Options of {@link createSqliteStoreFixture}. */
export interface SqliteStoreFixtureOptions {
  /**
   * Folder of the database files, one `<testId>.db` per test. Default
   * `<os temp folder>/courier-conformance-sqlite`. A parent and the workers it spawns must
   * use the same folder (the default is the same in every process of one machine).
   */
  readonly directory?: string;
  /**
   * Keep the test's database files when the fixture closes (to look into a failed run).
   * Default false: the test process removes them (see {@link createSqliteStoreFixture}).
   */
  readonly keepFiles?: boolean;
}

/**
 * Open fixtures per database file in this process: the files go only when the last one
 * closes, so a case that opens a second fixture of its testId (a second bus) never finds
 * its file gone under it.
 */
const openFixtures = new Map<string, number>();

/**
 * Removes a test's database file and SQLite's companions (write-ahead log, shared-memory
 * index, rollback journal): left behind, one test's four files pile up per run in a folder
 * every run of the machine shares (issue 30, guess 2).
 */
function removeDatabaseFiles(file: string): void {
  for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(`${file}${suffix}`, { force: true });
}

/**
 * Creates a store fixture over a SQLite file (MikroORM with `@mikro-orm/libsql`, no
 * server): an outbox and an inbox with tables prefixed `<testId>_`, and an effects table
 * written in the handler's unit of work.
 *
 * Guarantees: the file outlives the process, and `createSqliteStoreFixture` with the same
 * `testId` in another process opens the same tables, so the bus suite's process-level
 * (SIGKILL) scenarios can use it from a fixture module's `createFixture`; several
 * processes share the file safely (the stores use WAL, a busy timeout and immediate
 * write locks). Requires `@courier/conformance` and `@mikro-orm/libsql` (optional peer
 * dependencies).
 *
 * Files: `<directory>/<testId>.db` (with SQLite's `-wal` and `-shm` while open), the
 * directory `<os temp folder>/courier-conformance-sqlite` unless given. `close()` releases
 * the connection and, in the test process, removes the test's files once its last fixture
 * of that testId in the process has closed (the kit closes the parent's fixture after every
 * worker has exited). A worker process of the SIGKILL scenarios (`COURIER_CONFORMANCE_WORKER`
 * set) never removes them: the parent and later workers still read the file. Files of a run
 * that was itself killed stay; pass your own `directory` to clear them with the rest of your
 * temporary files, or `keepFiles: true` to keep them for inspection.
 */
export async function createSqliteStoreFixture(context: FixtureContext, options: SqliteStoreFixtureOptions = {}): Promise<StoreFixture<EntityManager>> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId '${testId}' is not safe in table names`);
  const directory = options.directory ?? join(tmpdir(), 'courier-conformance-sqlite');
  mkdirSync(directory, { recursive: true });
  const file = join(directory, `${testId}.db`);
  const effectsTable = `${testId}_effects`;
  // Loaded here, not at the top: importing this subpath must not need the driver until a fixture is made.
  const [{ EntitySchema }, { MikroORM: LibSqlOrm }] = await Promise.all([import('@mikro-orm/core'), import('@mikro-orm/libsql')]);
  // A class per fixture: MikroORM keeps metadata on the class, so two open fixtures must not share one.
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
  // A busy timeout from the moment libsql opens a connection: MikroORM's init reads the
  // schema before any store exists to configure the connection, and a process recovering the
  // journal of one the SIGKILL scenarios killed keeps readers out for a moment — without it,
  // a worker died at start with "database is locked".
  const orm: MikroORM = await LibSqlOrm.init(
    withSqliteBusyTimeout({
      dbName: file,
      entities: [schema],
      debug: false,
      discovery: { warnWhenNoEntities: false },
    } as Options),
  );
  const connection = orm.em.getConnection('write');
  openFixtures.set(file, (openFixtures.get(file) ?? 0) + 1);
  let closed = false;
  // Counted down once per fixture, whether its setup failed or it closed (twice is once).
  const release = () => {
    if (closed) return;
    closed = true;
    const left = (openFixtures.get(file) ?? 1) - 1;
    if (left > 0) {
      openFixtures.set(file, left);
      return;
    }
    openFixtures.delete(file);
    if (!options.keepFiles && process.env['COURIER_CONFORMANCE_WORKER'] === undefined) removeDatabaseFiles(file);
  };
  try {
    await connection.execute(`CREATE TABLE IF NOT EXISTS "${effectsTable}" (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`, [], 'run');
    const tablePrefix = `${testId}_`;
    const outbox = new MikroOrmOutboxStore({ orm, tablePrefix });
    const inbox = new MikroOrmInboxStore({ orm, tablePrefix });
    await outbox.ensureSchema();
    return {
      outbox,
      inbox,
      transaction: <T>(work: (tx: EntityManager) => Promise<T>) => orm.em.fork().transactional((em) => work(em)),
      transactionHeldBeforeCommit: <T>(work: (tx: EntityManager) => Promise<T>, beforeCommit: () => Promise<void>) =>
        orm.em.fork().transactional((em) => {
          // The transactional fork has an event manager of its own, so this hook sees only
          // this transaction; it runs after the store's subscriber has written the rows.
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
        tx.persist(tx.create(Effect, { effectId: id }));
        await tx.flush();
      },
      async readEffects() {
        const rows = (await connection.execute(`SELECT effect_id FROM "${effectsTable}" ORDER BY seq`, [], 'all')) as Record<string, unknown>[];
        return rows.map((row) => String(row['effect_id']));
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
          await orm.close();
        } finally {
          release();
        }
      },
    };
  } catch (error) {
    await orm.close().catch(() => undefined);
    release();
    throw error;
  }
}
