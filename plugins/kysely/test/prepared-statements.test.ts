// Courier's statements as named prepared statements on Kysely's PostgreSQL connections
// (issue 31): Kysely's driver sends every statement unnamed, so PostgreSQL planned Courier's
// outbox INSERT afresh in every producing transaction (the Kysely producer line was 0.73–0.91 ×
// Kysely's own insert). A pool wrapped by `preparingCourierStatements` names Courier's texts
// only; the connection's pg_prepared_statements is the proof, read in the same transaction.
import { uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { KyselyOutboxStore, MAX_PREPARED_STATEMENTS, preparingCourierStatements } from '../src/index.js';
import { PG_URL, type AnyDb } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('preparingCourierStatements (Kysely on PostgreSQL)', () => {
  async function open(wrap: boolean) {
    // One connection, so the statements prepared by one transaction are visible to the next.
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    const db = new Kysely<AnyDb>({ dialect: new PostgresDialect({ pool: wrap ? preparingCourierStatements(pool) : pool }) });
    cleanups.push(() => db.destroy());
    const tablePrefix = `${uniqueId()}_`;
    const outbox = new KyselyOutboxStore({ db, tablePrefix });
    await outbox.ensureSchema();
    cleanups.push(() => outbox.close());
    const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
    const Work = defineMessage('kysely.Prepared', { version: 1, topic: 'kysely.prepared' });
    const outboxTable = `${tablePrefix}outbox`;
    return { db, bus, Work, outboxTable };
  }

  const preparedOnThisConnection = async (trx: Kysely<AnyDb>) =>
    (await sql<{ name: string; statement: string }>`SELECT name, statement FROM pg_prepared_statements`.execute(trx)).rows;

  it("runs Courier's append as a named prepared statement on the connection, and the application's own statements unnamed", async () => {
    const { db, bus, Work, outboxTable } = await open(true);
    for (let n = 0; n < 3; n++) {
      await db.transaction().execute(async (trx) => {
        await sql`SELECT ${n}::int AS mine`.execute(trx);
        await bus.outbox(trx).publish(Work, { n }, { key: 'k' });
      });
    }
    const prepared = await db.transaction().execute((trx) => preparedOnThisConnection(trx));
    const courier = prepared.filter((row) => row.name.startsWith('courier_'));
    expect(courier.some((row) => row.statement.startsWith(`INSERT INTO "${outboxTable}"`))).toBe(true);
    // The user's statement, Kysely's begin/commit and this read are not prepared.
    expect(prepared.filter((row) => !row.name.startsWith('courier_'))).toEqual([]);
    expect(prepared.some((row) => /mine/.test(row.statement))).toBe(false);
    const rows = (await sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql.table(outboxTable)}`.execute(db)).rows;
    expect(rows[0]!.n).toBe(3);
  });

  it('an unwrapped pool prepares nothing (the default: everything unnamed, as Kysely sends it)', async () => {
    const { db, bus, Work } = await open(false);
    await db.transaction().execute(async (trx) => {
      await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
    });
    expect(await db.transaction().execute((trx) => preparedOnThisConnection(trx))).toEqual([]);
  });

  it('forwards the pool function form PostgresDialect takes, and the pool members Kysely reads', async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    const wrapped = preparingCourierStatements(async () => pool);
    const db = new Kysely<AnyDb>({ dialect: new PostgresDialect({ pool: wrapped }) });
    cleanups.push(() => db.destroy());
    expect((await sql<{ one: number }>`SELECT 1 AS one`.execute(db)).rows).toEqual([{ one: 1 }]);
    const direct = preparingCourierStatements(pool);
    expect(direct.options).toBe(pool.options);
    expect(MAX_PREPARED_STATEMENTS).toBe(256);
  });

  it('refuses what is not a pool with a ConfigError naming the fix', () => {
    for (const bad of [null, undefined, 42, 'postgres://x', {}, { connect: () => undefined }]) {
      expect(() => preparingCourierStatements(bad as never)).toThrow(ConfigError);
      expect(() => preparingCourierStatements(bad as never)).toThrow(/must be a node-postgres Pool \(new pg\.Pool/);
    }
  });
});
