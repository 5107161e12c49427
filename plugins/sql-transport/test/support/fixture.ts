// Transport fixtures for the conformance suites: one MikroORM per transport instance, the
// queue tables named after the test id (so cases run concurrently on one server). On
// PostgreSQL and MariaDB every instance connects through a TCP proxy of its own, so a test
// can cut one instance (kill) or all of them (outage) without touching the shared server.
//
// Importable in a child process: the same testId reaches the same tables (the SQLite file
// is `<folder>/<testId>.db`, shared with the store fixture of the same test).
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Transport } from '@courier/core';
import { TcpProxy, targetOf, throughProxy, type FixtureContext, type TransportFixture } from '@courier/conformance';
import type { MikroORM, Options } from '@mikro-orm/core';
import { SqlTransport, type SqlTransportConfig } from '../../src/index.js';
import { locateInQueue } from './locate.js';

/** The databases the fixtures target. */
export type QueueDialectName = 'postgresql' | 'mariadb' | 'sqlite';

/** Connection URL of the PostgreSQL test database (`COURIER_PG_URL`). */
export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';
/** Connection URL of the MariaDB test database (`COURIER_MARIADB_URL`). */
export const MARIADB_URL = process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test';
/**
 * The mariadb connector gives up on a new socket after 1 s by default: a loaded machine
 * (CPU-starved event loop) can take longer than that to see a local connection open.
 */
const MARIADB_DRIVER_OPTIONS = { connection: { connectTimeout: 10_000 } };
/** Folder of the SQLite files; the same default as `@courier/mikro-orm/conformance`, so store and queue share one file. */
export const SQLITE_DIR = process.env['COURIER_SQLITE_DIR'] ?? join(tmpdir(), 'courier-conformance-sqlite');

const HOW_TO_START: Record<QueueDialectName, string> = {
  postgresql: `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`,
  mariadb: `start MariaDB (\`install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\`) or point COURIER_MARIADB_URL at one (now ${MARIADB_URL})`,
  sqlite: `check that ${SQLITE_DIR} is writable (COURIER_SQLITE_DIR)`,
};

/** Short lease: redelivery after a crash waits for it. */
export const FIXTURE_LEASE_MS = 2_000;

/**
 * Opens a MikroORM on the test database of `dialect`, through `proxy` when given. A
 * database that cannot be reached fails loudly with how to start it.
 */
export async function openOrm(dialect: QueueDialectName, testId: string, proxy?: TcpProxy, extra: Partial<Options> = {}): Promise<MikroORM> {
  const common = { entities: [], debug: false, discovery: { warnWhenNoEntities: false }, ...extra };
  // Connecting through a closed proxy is refused at once; knex would retry for 60 s. The
  // bound must reach whichever pool the MikroORM version uses: knex (6) takes
  // acquireConnectionTimeout, pg's own pool (7 on PostgreSQL) connectionTimeoutMillis, and
  // without it a connect the server never answers waits for minutes (test/fixture-bounds).
  const pooled = { pool: { min: 0, max: 10 }, driverOptions: { acquireConnectionTimeout: 3_000, ...(dialect === 'postgresql' ? { connectionTimeoutMillis: 3_000 } : {}) } };
  let orm: MikroORM;
  try {
    switch (dialect) {
      case 'postgresql': {
        const { MikroORM: PgOrm } = await import('@mikro-orm/postgresql');
        orm = await PgOrm.init({ clientUrl: proxy ? throughProxy(PG_URL, proxy) : PG_URL, ...pooled, ...common } as Options);
        break;
      }
      case 'mariadb': {
        const { MikroORM: MariaDbOrm } = await import('@mikro-orm/mariadb');
        orm = await MariaDbOrm.init({ clientUrl: proxy ? throughProxy(MARIADB_URL, proxy) : MARIADB_URL, ...pooled, driverOptions: { ...pooled.driverOptions, ...MARIADB_DRIVER_OPTIONS }, ...common } as Options);
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

interface Instance {
  readonly orm: SharedOrm;
  readonly proxy: TcpProxy | undefined;
  /** Makes the instance's connection refuse every statement, like a process that died. */
  readonly cut: () => void;
  killed: boolean;
}

/** An ORM opened once per (process, testId) on SQLite, shared by every part that asks for it. */
interface SharedOrm {
  readonly orm: MikroORM;
  release(): Promise<void>;
}

const sqliteOrms = new Map<string, { orm: Promise<MikroORM>; users: number }>();

/**
 * The SQLite ORM of `testId` in this process, opened on first use and closed with its last
 * user. The libsql driver waits for a file lock synchronously, blocking the event loop: two
 * connections of one process would wait for each other (the holder cannot reach its next
 * statement), so everything of one process shares one connection, as an application would.
 */
export function sharedSqliteOrm(testId: string): Promise<SharedOrm> {
  let entry = sqliteOrms.get(testId);
  if (!entry) {
    entry = { orm: openOrm('sqlite', testId), users: 0 };
    sqliteOrms.set(testId, entry);
  }
  const current = entry;
  current.users += 1;
  return current.orm.then(
    (orm) => {
      let released = false;
      return {
        orm,
        release: async () => {
          if (released) return;
          released = true;
          current.users -= 1;
          if (current.users === 0 && sqliteOrms.get(testId) === current) {
            sqliteOrms.delete(testId);
            await orm.close(true).catch(() => undefined);
          }
        },
      };
    },
    (error: unknown) => {
      sqliteOrms.delete(testId);
      throw error;
    },
  );
}

/**
 * The ORM as one transport instance sees it: its connection goes dead once `cut()` is
 * called (every statement and transaction rejects), which is how a crashed process's
 * connection looks to the code still holding it.
 */
function cuttable(orm: MikroORM, faults: SettleFaults): { view: SqlTransportConfig['orm']; cut: () => void } {
  let dead = false;
  const connection = orm.em.getConnection('write');
  const deadConnection = new Proxy(connection, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (property !== 'execute' && property !== 'transactional') return typeof value === 'function' ? value.bind(target) : value;
      return (...args: unknown[]) => {
        if (dead) return Promise.reject(new Error('the connection of a killed instance is gone'));
        const kind = property === 'execute' && typeof args[0] === 'string' ? settleKind(args[0]) : undefined;
        if (kind !== undefined && takeFault(faults, kind)) return Promise.reject(new Error(`sql fixture: the database failed the ${kind} statement (injected fault)`));
        return (value as (...rest: unknown[]) => Promise<unknown>).apply(target, args);
      };
    },
  });
  const em = new Proxy(orm.em, {
    get(target, property, receiver) {
      if (property === 'getConnection') return () => deadConnection;
      const value: unknown = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { view: { em }, cut: () => (dead = true) };
}

/** Settles the fixture is to fail next, by kind (`TransportFixture.failSettles`). */
type SettleFaults = Record<'ack' | 'retry' | 'deadLetter', number>;

/** Whether one more fault of `kind` is due (and counts it off). */
function takeFault(faults: SettleFaults, kind: keyof SettleFaults): boolean {
  if (faults[kind] <= 0) return false;
  faults[kind] -= 1;
  return true;
}

/** The settle a statement of the SQL transport carries out, if it is one: its ack's delete, its retry's or dead letter's update. */
function settleKind(sql: string): keyof SettleFaults | undefined {
  if (/^\s*DELETE FROM \S+ WHERE seq = \S+ AND lease_owner = /i.test(sql)) return 'ack';
  if (/SET attempt = attempt \+ 1, lease_owner = NULL/.test(sql)) return 'retry';
  if (/SET state = 'dead', lease_owner = NULL/.test(sql)) return 'deadLetter';
  return undefined;
}

/** Options of {@link createSqlTransportFixture}. */
export interface SqlTransportFixtureOptions {
  /** Extra transport settings (lease, poll interval, wake-ups). */
  readonly config?: Partial<Omit<SqlTransportConfig, 'orm'>>;
}

/**
 * A `TransportFixtureFactory` over `dialect`: transports with tables prefixed `<testId>_`,
 * `kill` cutting the instance's connection without settling anything (its rows come back
 * after the lease), and on PostgreSQL and MariaDB an `outage` that cuts every instance's
 * proxy. On SQLite the instances of one process share one ORM (see {@link sharedSqliteOrm}).
 */
export function createSqlTransportFixture(dialect: QueueDialectName, options: SqlTransportFixtureOptions = {}) {
  return async ({ testId }: FixtureContext): Promise<TransportFixture & { readonly transport: SqlTransport; connect(): Promise<SqlTransport> }> => {
    if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
    const instances = new Map<Transport, Instance>();
    const tablePrefix = `${testId}_`;
    const faults: SettleFaults = { ack: 0, retry: 0, deadLetter: 0 };

    const make = async (): Promise<SqlTransport> => {
      let proxy: TcpProxy | undefined;
      let orm: SharedOrm;
      if (dialect === 'sqlite') {
        orm = await sharedSqliteOrm(testId);
      } else {
        proxy = await TcpProxy.create(targetOf(dialect === 'postgresql' ? PG_URL : MARIADB_URL, dialect === 'postgresql' ? 5432 : 3306));
        await proxy.open();
        const own = await openOrm(dialect, testId, proxy);
        orm = { orm: own, release: () => own.close(true).catch(() => undefined) };
      }
      const { view, cut } = cuttable(orm.orm, faults);
      const transport = new SqlTransport({ orm: view, tablePrefix, leaseMs: FIXTURE_LEASE_MS, pollIntervalMs: 100, ...options.config });
      instances.set(transport, { orm, proxy, cut, killed: false });
      return transport;
    };

    const transport = await make();
    await transport.ensureSchema();

    return {
      transport,
      connect: () => make(),
      kill: async (target) => {
        const instance = instances.get(target);
        if (!instance) throw new Error('kill: not a transport of this fixture');
        instance.killed = true;
        // Like a crash: the connection is gone at once (nothing settled, no lease renewed),
        // and the instance claims nothing more.
        instance.cut();
        await instance.proxy?.close();
        void target.close().catch(() => undefined);
      },
      outage:
        dialect === 'sqlite'
          ? undefined
          : {
              begin: async () => {
                await Promise.all([...instances.values()].map((instance) => instance.proxy?.close() ?? Promise.resolve()));
              },
              end: async () => {
                await Promise.all([...instances.values()].filter((instance) => !instance.killed).map((instance) => instance.proxy?.open() ?? Promise.resolve()));
              },
            },
      // The statement of the settle fails, as a database error or a dropped connection would.
      failSettles: async (kind, count = 1) => {
        faults[kind] += count;
      },
      // Read through the fixture's own instance (its proxy is open unless an outage is on).
      locate: (ids) => locateInQueue(instances.get(transport)!.orm.orm, dialect, testId, ids),
      close: async () => {
        // A killed transport's close may wait forever on a handler the test never settles: not awaited.
        await Promise.all([...instances].filter(([, instance]) => !instance.killed).map(([t]) => t.close().catch(() => undefined)));
        await Promise.all([...instances.values()].map((instance) => instance.orm.release()));
        await Promise.all([...instances.values()].map((instance) => instance.proxy?.close() ?? Promise.resolve()));
      },
    };
  };
}
