// Store fixtures on Prisma 7 for the conformance suites and this package's tests: one Prisma
// Client per test (generated at test time, see prisma-client.ts) with the driver adapter of
// PostgreSQL (@prisma/adapter-pg), MariaDB (@prisma/adapter-mariadb) or a SQLite file
// (@prisma/adapter-better-sqlite3); Courier tables prefixed `<testId>_`, created by Courier's
// own DDL (Prisma's migrate engine does not run here), and an effects table written through
// the handler's transaction client. Servers that cannot be reached fail loudly with how to
// start them.
import { mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { recordStatements, type FixtureContext, type StoreFixture } from '@courier/conformance';
import { PrismaBetterSqlite3 } from '@prisma/adapter-better-sqlite3';
import { PrismaMariaDb } from '@prisma/adapter-mariadb';
import { PrismaPg } from '@prisma/adapter-pg';
import { PrismaInboxStore, PrismaOutboxStore, type PrismaOutboxStoreConfig, type PrismaRawClient, type PrismaTransactionOptions } from '../../src/index.js';
import { loadPrismaClient, type GeneratedPrismaClient, type PrismaProvider } from './prisma-client.js';

/** The databases the fixtures can target. */
export type PrismaFixtureDialect = 'postgresql' | 'mariadb' | 'sqlite';

export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-prisma-sqlite');

const HOW_TO_START: Record<PrismaFixtureDialect, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

const PROVIDER: Record<PrismaFixtureDialect, PrismaProvider> = { postgresql: 'postgresql', mariadb: 'mysql', sqlite: 'sqlite' };

/** The transaction client the tests see (the subset Courier and the fixtures use). */
export type Tx = PrismaRawClient;

/**
 * Interactive-transaction options of the fixtures' own transactions: the conformance suite
 * holds producers open on purpose, and a loaded CI machine is slow; Prisma's 5 s default
 * would roll them back under it.
 */
export const FIXTURE_TRANSACTION_OPTIONS: PrismaTransactionOptions = { maxWait: 30_000, timeout: 120_000 };

/** A store fixture plus what this package's tests need. */
export interface PrismaFixture extends StoreFixture<Tx> {
  readonly dialect: PrismaFixtureDialect;
  readonly prisma: GeneratedPrismaClient;
  readonly inbox: PrismaInboxStore<Tx>;
  readonly outbox: PrismaOutboxStore<Tx>;
  readonly tablePrefix: string;
  /** Quoted name of a Courier table of this fixture, e.g. `table('outbox')`. */
  table(name: string): string;
  /** `sql` with the engine's `?` placeholders rewritten to the dialect's (PostgreSQL `$n`). */
  sql(text: string): string;
}

/** Options of {@link createPrismaFixture}. */
export interface PrismaFixtureOptions {
  readonly outbox?: Partial<Omit<PrismaOutboxStoreConfig<Tx>, 'prisma'>>;
}

/**
 * Opens a Prisma Client on `dialect` for one test (its own file on SQLite); `onStatement`,
 * when given, sees the text of every statement the client sends (Prisma's `query` log event,
 * which the driver adapters emit for raw statements too).
 */
export async function openPrisma(dialect: PrismaFixtureDialect, testId: string, onStatement?: (text: string) => void): Promise<GeneratedPrismaClient> {
  const PrismaClient = await loadPrismaClient(PROVIDER[dialect]);
  let adapter: unknown;
  switch (dialect) {
    case 'postgresql':
      adapter = new PrismaPg({ connectionString: PG_URL, max: 10 });
      break;
    case 'mariadb': {
      const url = new URL(MARIADB_URL);
      adapter = new PrismaMariaDb({
        host: url.hostname,
        port: Number(url.port || 3306),
        user: decodeURIComponent(url.username),
        password: decodeURIComponent(url.password),
        database: url.pathname.slice(1),
        connectionLimit: 10,
        connectTimeout: 10_000,
      });
      break;
    }
    case 'sqlite':
      mkdirSync(SQLITE_DIR, { recursive: true });
      adapter = new PrismaBetterSqlite3({ url: `file:${join(SQLITE_DIR, `${testId}.db`)}` });
      break;
  }
  const prisma = new PrismaClient(onStatement ? { adapter, log: [{ emit: 'event', level: 'query' }] } : { adapter });
  if (onStatement) prisma.$on('query', (event: { query: string }) => onStatement(event.query));
  try {
    await prisma.$queryRawUnsafe('SELECT 1');
  } catch (error) {
    await prisma.$disconnect().catch(() => undefined);
    throw new Error(`the ${dialect} test database cannot be reached: ${String(error)}; ${HOW_TO_START[dialect]}`, { cause: error });
  }
  return prisma;
}

/** Creates the fixture of `testId` on `dialect`: schema, effects table, stores. */
export async function createPrismaFixture(dialect: PrismaFixtureDialect, context: FixtureContext, options: PrismaFixtureOptions = {}): Promise<PrismaFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
  // PostgreSQL: the INSERT takes the advisory locks; MariaDB: at most the key buckets FOR UPDATE, then the INSERT.
  const statements = recordStatements(dialect === 'postgresql' ? 1 : 2);
  const prisma = await openPrisma(dialect, testId, statements.record);
  const tablePrefix = `${testId}_`;
  const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
  const effects = quote(`${testId}_effects`);
  const sql = (text: string) => {
    let n = 0;
    return dialect === 'postgresql' ? text.replace(/\?/g, () => `$${++n}`) : text;
  };
  try {
    const ddl =
      dialect === 'postgresql'
        ? `CREATE TABLE IF NOT EXISTS ${effects} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
        : dialect === 'sqlite'
          ? `CREATE TABLE IF NOT EXISTS ${effects} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`
          : `CREATE TABLE IF NOT EXISTS ${effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`;
    await prisma.$executeRawUnsafe(ddl);
    const inbox = new PrismaInboxStore({ prisma, tablePrefix });
    const outbox = new PrismaOutboxStore({ prisma, tablePrefix, ...options.outbox });
    await outbox.ensureSchema();
    const transaction = <T>(work: (tx: Tx) => Promise<T>) => prisma.$transaction(work, FIXTURE_TRANSACTION_OPTIONS);
    // Prisma's interactive transactions are callback-scoped: an open one is a callback held
    // on a promise until commit (resolve) or rollback (reject).
    const open = new WeakMap<Tx, { finish: (commit: boolean) => void; done: Promise<unknown> }>();
    const begin = () =>
      new Promise<Tx>((resolveBegin, rejectBegin) => {
        const done = prisma.$transaction(
          (tx) =>
            new Promise<void>((resolve, reject) => {
              open.set(tx, { finish: (commit) => (commit ? resolve() : reject(ROLLBACK)), done });
              resolveBegin(tx);
            }),
          FIXTURE_TRANSACTION_OPTIONS,
        );
        done.catch((error: unknown) => {
          if (error !== ROLLBACK) rejectBegin(error);
        });
      });
    const finish = async (tx: Tx, commit: boolean) => {
      const handle = open.get(tx);
      if (handle === undefined) throw new Error('not a transaction begun by this fixture');
      open.delete(tx);
      handle.finish(commit);
      await handle.done.catch((error: unknown) => {
        if (error !== ROLLBACK) throw error;
      });
    };
    return {
      dialect,
      prisma,
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
      sql,
      transaction,
      transactionHeldBeforeCommit: <T>(work: (tx: Tx) => Promise<T>, beforeCommit: () => Promise<void>) =>
        transaction(async (tx) => {
          const value = await work(tx);
          await beforeCommit();
          return value;
        }),
      reusableUnitOfWork: {
        begin,
        async rollback(tx: Tx) {
          await finish(tx, false);
          return begin();
        },
        commit: (tx: Tx) => finish(tx, true),
      },
      async recordEffect(tx: Tx, id: string) {
        await tx.$executeRawUnsafe(sql(`INSERT INTO ${effects} (effect_id) VALUES (?)`), id);
      },
      async readEffects() {
        const rows = await prisma.$queryRawUnsafe<{ effect_id: string }[]>(`SELECT effect_id FROM ${effects} ORDER BY seq`);
        return rows.map((row) => String(row.effect_id));
      },
      async close() {
        try {
          await outbox.close();
          await inbox.close();
        } finally {
          await prisma.$disconnect();
          if (dialect === 'sqlite' && process.env['COURIER_CONFORMANCE_WORKER'] === undefined) {
            for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(join(SQLITE_DIR, `${testId}.db${suffix}`), { force: true });
          }
        }
      },
    };
  } catch (error) {
    await prisma.$disconnect().catch(() => undefined);
    throw error;
  }
}

const ROLLBACK = new Error('rolled back by the fixture');
