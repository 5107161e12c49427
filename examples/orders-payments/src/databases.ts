import { MikroOrmOutboxStore, withSqliteBusyTimeout } from '@courier/mikro-orm';
import type { MikroORM, Options } from '@mikro-orm/core';
import { quoteTable, type CourierTableRefs } from './inspectors.js';
import { requireCjs, SHOP_ENTITIES } from './mikro-orm-shop.js';
import type { ServiceName } from './snapshot.js';

/**
 * Each service keeps its own Courier tables (its own outbox and inbox), as two services
 * with two databases would; here they share one database (or PostgreSQL schema) that
 * belongs to the run.
 */
export const TABLE_PREFIXES: Readonly<Record<ServiceName, string>> = Object.freeze({ orders: 'orders_courier_', payments: 'payments_courier_' });

/** Quoted names of each service's outbox and inbox tables. */
export function courierTables(schema: string | undefined): Record<ServiceName, CourierTableRefs> {
  const refs = (service: ServiceName): CourierTableRefs => ({
    outbox: quoteTable(schema, `${TABLE_PREFIXES[service]}outbox`),
    inbox: quoteTable(schema, `${TABLE_PREFIXES[service]}inbox`),
  });
  return { orders: refs('orders'), payments: refs('payments') };
}

const COMMON: Partial<Options> = { entities: SHOP_ENTITIES, debug: false, discovery: { warnWhenNoEntities: false } };

/**
 * Opens MikroORM on a SQLite file through `@mikro-orm/libsql` (no server). Several worker
 * processes share the file, and MikroORM's init reads the schema before Courier's store can
 * give the connection its busy timeout: `withSqliteBusyTimeout` makes every connection wait
 * for another process's lock from the moment libsql opens it (the plugin README's "SQLite shared by
 * several processes").
 */
export async function openSqliteOrm(file: string): Promise<MikroORM> {
  const { MikroORM: LibSqlOrm } = requireCjs('@mikro-orm/libsql') as typeof import('@mikro-orm/libsql');
  return LibSqlOrm.init(withSqliteBusyTimeout({ ...COMMON, dbName: file } as Options)) as Promise<MikroORM>;
}

/**
 * Opens MikroORM on PostgreSQL with `schema` as the entities' schema. The runner (`waitForServer`
 * false) fails at once with how to start the server; a worker process opens it without
 * connecting, as the README's quick start does, so a worker started while PostgreSQL restarts
 * comes up and its bus waits for the server instead of the process dying.
 */
export async function openPostgresOrm(url: string, schema: string, poolMax = 10, options: { readonly waitForServer?: boolean } = {}): Promise<MikroORM> {
  // Loaded on demand (the in-memory setup needs no driver), with `require`: see mikro-orm-shop.ts.
  const { MikroORM: PgOrm } = requireCjs('@mikro-orm/postgresql') as typeof import('@mikro-orm/postgresql');
  const config = { ...COMMON, clientUrl: url, schema, pool: { min: 0, max: poolMax } } as Options;
  if (options.waitForServer) return (await PgOrm.init({ ...config, connect: false })) as MikroORM;
  const orm = (await PgOrm.init(config)) as MikroORM;
  const check = await orm.em.getConnection().checkConnection();
  if (!check.ok) {
    await orm.close(true).catch(() => undefined);
    throw new Error(
      `PostgreSQL is unreachable at ${redact(url)} (${check.reason}). Start it (\`bash scripts/services.sh\` prepares the role and database), ` +
        `or point COURIER_PG_URL at a server where you may create schemas.`,
      { cause: check.error },
    );
  }
  return orm;
}

/**
 * Creates the run's tables: the PostgreSQL schema (if any), the services' entities with
 * MikroORM's schema generator, and each service's Courier tables with `ensureSchema()`.
 */
export async function prepareDatabase(orm: MikroORM, schema: string | undefined): Promise<void> {
  if (schema !== undefined) await orm.em.getConnection().execute(`CREATE SCHEMA IF NOT EXISTS "${schema}"`, [], 'run');
  await orm.schema.createSchema();
  for (const service of ['orders', 'payments'] as const) {
    const store = new MikroOrmOutboxStore({ orm, tablePrefix: TABLE_PREFIXES[service], schema, wakeups: false });
    await store.ensureSchema();
    await store.close();
  }
}

/** Drops the run's PostgreSQL schema and everything in it. */
export async function dropSchema(orm: MikroORM, schema: string): Promise<void> {
  await orm.em.getConnection().execute(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`, [], 'run');
}

/** `url` without its password, for messages. */
export function redact(url: string): string {
  return url.replace(/\/\/([^:/@]+):[^@]*@/, '//$1:***@');
}
