import type { FixtureContext, StoreFixture } from '@courier/conformance';
import pg from 'pg';
import type { Pool, PoolClient } from 'pg';
import { PgInboxStore, PgOutboxStore, withTransaction, type PgOutboxStoreConfig } from '@courier/pg';

/** Connection URL of the PostgreSQL test database (`COURIER_PG_URL`). */
export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test';

const HOW_TO_START = `start PostgreSQL (\`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\`) or point COURIER_PG_URL at one (now ${PG_URL})`;

/** A store fixture plus what this package's own tests need. */
export interface PgFixture extends StoreFixture<PoolClient> {
  readonly pool: Pool;
  readonly outbox: PgOutboxStore;
  readonly inbox: PgInboxStore;
  /** The Courier table prefix of this fixture (`<testId>_`). */
  readonly tablePrefix: string;
  /** Quoted name of the effects table. */
  readonly effectsTable: string;
}

/** Options of {@link createPgFixture}. */
export interface PgFixtureOptions {
  readonly outbox?: Partial<Omit<PgOutboxStoreConfig, 'pool'>>;
}

/**
 * A node-postgres store fixture: a pool of its own, the outbox and inbox with tables
 * prefixed `<testId>_`, and an effects table written on the transaction's client. Fails
 * loudly, saying how to start PostgreSQL, when the server cannot be reached.
 */
export async function createPgFixture(context: FixtureContext, options: PgFixtureOptions = {}): Promise<PgFixture> {
  const { testId } = context;
  if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId '${testId}' is not safe in table names`);
  const pool = new pg.Pool({ connectionString: PG_URL, max: 10 });
  // An idle client's socket error must not crash the test process (a SIGKILL scenario, a restart).
  pool.on('error', () => undefined);
  try {
    await pool.query('SELECT 1');
  } catch (error) {
    await pool.end().catch(() => undefined);
    throw new Error(`the PostgreSQL test database is unreachable (${String(error)}); ${HOW_TO_START}`, { cause: error });
  }
  const tablePrefix = `${testId}_`;
  const effectsTable = `"${testId}_effects"`;
  const outbox = new PgOutboxStore({ pool, tablePrefix, ...options.outbox });
  const inbox = new PgInboxStore({ pool, tablePrefix });
  try {
    await pool.query(`CREATE TABLE IF NOT EXISTS ${effectsTable} (seq bigserial PRIMARY KEY, effect_id text NOT NULL)`);
    await outbox.ensureSchema();
  } catch (error) {
    await pool.end().catch(() => undefined);
    throw error;
  }
  const begin = async (): Promise<PoolClient> => {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
    } catch (error) {
      client.release(true);
      throw error;
    }
    return client;
  };
  return {
    pool,
    outbox,
    inbox,
    tablePrefix,
    effectsTable,
    transaction: (work) => withTransaction(pool, work),
    async transactionHeldBeforeCommit(work, beforeCommit) {
      const client = await begin();
      try {
        const result = await work(client);
        await beforeCommit();
        await client.query('COMMIT');
        return result;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw error;
      } finally {
        client.release();
      }
    },
    reusableUnitOfWork: {
      begin,
      async rollback(client) {
        await client.query('ROLLBACK');
        await client.query('BEGIN');
        return client;
      },
      async commit(client) {
        try {
          await client.query('COMMIT');
        } finally {
          client.release();
        }
      },
    },
    async recordEffect(tx, id) {
      await tx.query(`INSERT INTO ${effectsTable} (effect_id) VALUES ($1)`, [id]);
    },
    async readEffects() {
      const result = await pool.query<{ effect_id: string }>(`SELECT effect_id FROM ${effectsTable} ORDER BY seq`);
      return result.rows.map((row) => row.effect_id);
    },
    async close() {
      try {
        await outbox.close();
        await inbox.close();
      } finally {
        await pool.end();
      }
    },
  };
}
