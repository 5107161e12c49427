// Scenario 1's producer transaction on the other PostgreSQL adapters (issue 31: each ≥ 0.95 ×
// the same library's own hand-written outbox INSERT in the same transaction): node-postgres
// with @courier/pg, Kysely with @courier/kysely, Knex with @courier/knex. Each pair runs the
// same order row on the same library and connection pool; only the outbox write differs.
import { createBus, InMemoryBroker } from '@courier/core';
import { KnexOutboxStore } from '@courier/knex';
import { KyselyOutboxStore, preparingCourierStatements } from '@courier/kysely';
import { PgOutboxStore } from '@courier/pg';
import knexFactory from 'knex';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { OrderPlaced, orderPayload, OUTBOX_COLUMNS, outboxValues, type BenchDb } from './setup.js';
import { URLS } from './services.js';

/** The adapters' producer modes, in A/B order (each hand-written line right before its Courier line). */
export const ADAPTER_PAIRS = [
  { library: 'node-postgres', hand: 'hand-written outbox (raw pg)', courier: 'Courier outbox publish (@courier/pg)' },
  { library: 'Kysely', hand: 'hand-written outbox (Kysely)', courier: 'Courier outbox publish (@courier/kysely)' },
  { library: 'Knex', hand: 'hand-written outbox (Knex)', courier: 'Courier outbox publish (@courier/knex)' },
] as const;

export type AdapterMode = (typeof ADAPTER_PAIRS)[number]['hand' | 'courier'];

/** One transaction per mode, and `close` for the pools. */
export interface AdapterProducers {
  readonly run: Record<AdapterMode, (id: string) => Promise<void>>;
  /** The server process of a connection of the library's pool (with one writer, the one every transaction runs on). */
  readonly backendPid: Record<(typeof ADAPTER_PAIRS)[number]['library'], () => Promise<number>>;
  close(): Promise<void>;
}

/**
 * Opens a pool of `writers` connections per library on `db`'s tables (opened with `prefix`) and returns each mode's
 * transaction: the order row, then the outbox row (hand-written, or Courier's keyed publish).
 */
export function adapterProducers(db: BenchDb, prefix: string, writers: number): AdapterProducers {
  const tablePrefix = `${prefix}_`;
  const orders = `${tablePrefix}orders`;
  const outbox = db.names.outbox;
  const columns = OUTBOX_COLUMNS.split(', ');
  const transport = new InMemoryBroker().connect();

  const pool = new pg.Pool({ connectionString: URLS.postgresql, max: writers });
  const pgBus = createBus({ outbox: new PgOutboxStore({ pool, tablePrefix }), transport });
  const pgInsert = `INSERT INTO "${outbox}" (${OUTBOX_COLUMNS}) VALUES (${columns.slice(0, 13).map((_, index) => `$${index + 1}`).join(', ')}, 'pending', 0, now(), now())`;
  const pgTx = async (id: string, outboxWrite: (client: pg.PoolClient) => Promise<unknown>) => {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(`INSERT INTO "${orders}" (id, customer_id, total_cents, created_at) VALUES ($1, $2, $3, now())`, [id, `c-${id.slice(-6)}`, 12_345]);
      await outboxWrite(client);
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  };

  // Tables named at run time: the schema type says only that every table has unknown columns.
  // The pool wrapped as @courier/kysely's README recommends: Courier's statements prepared, the
  // hand-written line's statements still unnamed as Kysely sends them (both modes share the pool).
  const kyselyPool = new pg.Pool({ connectionString: URLS.postgresql, max: writers });
  const kysely = new Kysely<Record<string, Record<string, unknown>>>({
    dialect: new PostgresDialect({ pool: process.env['COURIER_BENCH_KYSELY_UNPREPARED'] === '1' ? kyselyPool : preparingCourierStatements(kyselyPool) }),
  });
  const kyselyBus = createBus({ outbox: new KyselyOutboxStore({ db: kysely, tablePrefix }), transport });
  const knex = knexFactory({ client: 'pg', connection: URLS.postgresql, pool: { min: 0, max: writers } });
  const knexBus = createBus({ outbox: new KnexOutboxStore({ knex, tablePrefix }), transport });
  const orderRow = (id: string) => ({ id, customer_id: `c-${id.slice(-6)}`, total_cents: 12_345, created_at: new Date() });
  const outboxRow = (id: string, now: unknown) => ({
    ...Object.fromEntries(outboxValues(id).map((value, index) => [columns[index]!, value])),
    state: 'pending',
    attempts: 0,
    available_at: now,
    created_at: now,
  });

  const run: AdapterProducers['run'] = {
    'hand-written outbox (raw pg)': (id) => pgTx(id, (client) => client.query(pgInsert, outboxValues(id))),
    'Courier outbox publish (@courier/pg)': (id) => pgTx(id, (client) => pgBus.outbox(client).publish(OrderPlaced, orderPayload(id), { key: id })),
    'hand-written outbox (Kysely)': (id) =>
      kysely.transaction().execute(async (trx) => {
        await trx.insertInto(orders).values(orderRow(id)).execute();
        await trx.insertInto(outbox).values(outboxRow(id, sql`now()`)).execute();
      }),
    'Courier outbox publish (@courier/kysely)': (id) =>
      kysely.transaction().execute(async (trx) => {
        await trx.insertInto(orders).values(orderRow(id)).execute();
        await kyselyBus.outbox(trx).publish(OrderPlaced, orderPayload(id), { key: id });
      }),
    'hand-written outbox (Knex)': (id) =>
      knex.transaction(async (trx) => {
        await trx(orders).insert(orderRow(id));
        await trx(outbox).insert(outboxRow(id, knex.fn.now()));
      }),
    'Courier outbox publish (@courier/knex)': (id) =>
      knex.transaction(async (trx) => {
        await trx(orders).insert(orderRow(id));
        await knexBus.outbox(trx).publish(OrderPlaced, orderPayload(id), { key: id });
      }),
  };
  const backendPid: AdapterProducers['backendPid'] = {
    'node-postgres': async () => Number((await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid),
    Kysely: async () => Number((await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(kysely)).rows[0]!.pid),
    Knex: async () => Number(((await knex.raw('SELECT pg_backend_pid() AS pid')) as { rows: { pid: number }[] }).rows[0]!.pid),
  };
  return {
    run,
    backendPid,
    async close() {
      await Promise.allSettled([pool.end(), kysely.destroy(), knex.destroy(), transport.close()]);
    },
  };
}
