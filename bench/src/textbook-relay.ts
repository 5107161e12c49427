// The relay a user writes first from the textbook (issue 40): its own narrow table with a
// partial index on unprocessed rows, one node-postgres connection, and per batch
// BEGIN → SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED → publish on a confirm channel
// → wait for the confirms → UPDATE processed_at → COMMIT. No per-key order across failures,
// no lease, no fencing, no dead letters: the baseline Courier's defaults are held to.
import pg from 'pg';
import type { BenchBroker } from './setup.js';
import { TOPIC } from './setup.js';
import { URLS } from './services.js';

/** The textbook relay's batch sizes the drain scenario measures (issue 40: 500 and 100). */
export const TEXTBOOK_BATCHES = [500, 100] as const;

/**
 * The narrow outbox table of the textbook relay, created under the run's prefix on its own
 * connection, seeded with generate_series and dropped by `close`.
 */
export class TextbookOutbox {
  readonly table: string;
  readonly #client: pg.Client;

  private constructor(table: string, client: pg.Client) {
    this.table = table;
    this.#client = client;
  }

  /** Connects one `pg.Client` and creates `<prefix>_textbook` with its partial index. */
  static async open(prefix: string): Promise<TextbookOutbox> {
    const client = new pg.Client({ connectionString: URLS.postgresql });
    await client.connect();
    const table = `"${prefix}_textbook"`;
    try {
      await client.query(
        `CREATE TABLE ${table} (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, ` +
          `created_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz)`,
      );
      await client.query(`CREATE INDEX "${prefix}_textbook_unprocessed" ON ${table} (id) WHERE processed_at IS NULL`);
    } catch (error) {
      await client.end().catch(() => undefined);
      throw error;
    }
    return new TextbookOutbox(table, client);
  }

  /**
   * Empties the table, then seeds `count` unprocessed rows in one INSERT … SELECT: one
   * aggregate per row and the payload Courier's seeded rows carry, then ANALYZE.
   */
  async seed(count: number): Promise<void> {
    await this.#client.query(`TRUNCATE ${this.table}`);
    await this.#client.query(
      `INSERT INTO ${this.table} (aggregate_id, event_type, payload) ` +
        `SELECT 'order-' || i, 'bench.OrderPlaced', jsonb_build_object('orderId', 'order-' || i, 'customerId', 'c-1', 'totalCents', 12345, 'currency', 'EUR') ` +
        `FROM generate_series(1, $1::int) AS i ORDER BY i`,
      [count],
    );
    await this.#client.query(`ANALYZE ${this.table}`);
  }

  /** Drops the table and closes the connection. */
  async close(): Promise<void> {
    try {
      await this.#client.query(`DROP TABLE IF EXISTS ${this.table}`);
    } finally {
      await this.#client.end().catch(() => undefined);
    }
  }
}

/**
 * Drains `outbox` the textbook way on one fresh `pg.Client` and one amqplib confirm channel,
 * publishing each row persistent (and mandatory, as every other line of the scenario) to the
 * run's exchange under the bench's topic, so it reaches the same capped quorum queue. Stops
 * when a claim finds nothing; resolves with rows per second. `drained`, when given, is told
 * the connection's backend pid once the drain is done, before the connection closes (so a
 * bench can read the backend's CPU time).
 */
export async function textbookRelay(outbox: TextbookOutbox, broker: BenchBroker, batch: number, drained?: (backendPid: number) => void): Promise<number> {
  const client = new pg.Client({ connectionString: URLS.postgresql });
  await client.connect();
  const connection = await broker.connect();
  try {
    const channel = await connection.createConfirmChannel();
    let done = 0;
    const started = performance.now();
    for (;;) {
      await client.query('BEGIN');
      try {
        const { rows } = await client.query<{ id: string; aggregate_id: string; event_type: string; payload: unknown; created_at: Date }>(
          `SELECT id, aggregate_id, event_type, payload, created_at FROM ${outbox.table} WHERE processed_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`,
          [batch],
        );
        if (rows.length === 0) {
          await client.query('COMMIT');
          break;
        }
        for (const row of rows) {
          channel.publish(broker.exchange, TOPIC, Buffer.from(JSON.stringify(row.payload)), {
            persistent: true,
            mandatory: true,
            messageId: row.id,
            type: row.event_type,
            contentType: 'application/json',
            timestamp: row.created_at.getTime(),
            headers: { 'aggregate-id': row.aggregate_id },
          });
        }
        // Rejects if the broker nacked any message of the batch: the transaction rolls back.
        await channel.waitForConfirms();
        await client.query(`UPDATE ${outbox.table} SET processed_at = now() WHERE id = ANY($1::bigint[])`, [rows.map((row) => row.id)]);
        await client.query('COMMIT');
        done += rows.length;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw error;
      }
    }
    const rate = done / ((performance.now() - started) / 1000);
    if (drained) {
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      drained(Number(rows[0]?.pid));
    }
    await channel.close();
    return rate;
  } finally {
    await connection.close().catch(() => undefined);
    await client.end().catch(() => undefined);
  }
}
