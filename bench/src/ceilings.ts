// The raw ceilings Courier is compared with, measured in the same run with the same
// durability: a hand-written amqplib confirm loop, a hand-written SQL claim loop, and
// hand-written producer transactions (MikroORM, and plain node-postgres).
import type { EntityManager, Knex } from '@mikro-orm/postgresql';
import pg from 'pg';
import { toAmqpMessage } from '@courier/rabbitmq';
import type { Envelope } from '@courier/core';
import { amqpOrder, OUTBOX_COLUMNS, outboxValues, TOPIC, type BenchBroker, type BenchDb } from './setup.js';
import { URLS } from './services.js';

/** The confirm window of the raw loop, equal to the transport's default. */
export const RAW_CONFIRM_WINDOW = 256;

/**
 * Publishes `count` persistent, mandatory messages (the transport's own AMQP mapping of
 * an order envelope) to the run's exchange on one confirm channel with up to `window`
 * unconfirmed; resolves with messages per second once every confirm arrived.
 */
export async function rawPublishLoop(broker: BenchBroker, count: number, window = RAW_CONFIRM_WINDOW): Promise<number> {
  const connection = await broker.connect();
  try {
    const channel = await connection.createConfirmChannel();
    let inFlight = 0;
    let failed = 0;
    let wake: (() => void) | null = null;
    const waitFor = (ready: () => boolean) =>
      ready()
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            wake = () => {
              if (!ready()) return;
              wake = null;
              resolve();
            };
          });
    let needsDrain = false;
    channel.on('drain', () => {
      needsDrain = false;
      wake?.();
    });
    const started = performance.now();
    for (let index = 0; index < count; index += 1) {
      await waitFor(() => inFlight < window && !needsDrain);
      const message = amqpOrder(`order-${index}`);
      inFlight += 1;
      const flushed = channel.publish(broker.exchange, TOPIC, message.content, { ...message.properties, persistent: true, mandatory: true }, (error: unknown) => {
        inFlight -= 1;
        if (error) failed += 1;
        wake?.();
      });
      if (!flushed) needsDrain = true;
    }
    await waitFor(() => inFlight === 0);
    const elapsed = (performance.now() - started) / 1000;
    await channel.close();
    if (failed > 0) throw new Error(`raw publish loop: ${failed} of ${count} messages were nacked`);
    return count / elapsed;
  } finally {
    await connection.close().catch(() => undefined);
  }
}

/**
 * Drains the seeded backlog with hand-written SQL: claim `batch` due rows with
 * `FOR UPDATE SKIP LOCKED` under a lease (one statement on PostgreSQL; select then
 * update in one transaction on MariaDB), then mark them published. No head-of-key check,
 * no fencing token: the least an outbox relay must do. Resolves with rows per second.
 */
export async function rawClaimLoop(db: BenchDb, batch = 100): Promise<number> {
  const knex = (db.orm.em as unknown as EntityManager).getConnection('write').getKnex() as Knex;
  const outbox = db.table('outbox');
  let done = 0;
  const started = performance.now();
  for (;;) {
    let seqs: string[];
    if (db.dialect === 'postgresql') {
      const result = await knex.raw(
        `WITH c AS (SELECT seq FROM ${outbox} WHERE state = 'pending' AND available_at <= now() ORDER BY available_at, seq LIMIT ? FOR UPDATE SKIP LOCKED) ` +
          `UPDATE ${outbox} o SET lease_owner = 'raw', available_at = now() + interval '30 seconds' FROM c WHERE o.seq = c.seq ` +
          `RETURNING o.seq, o.message_id, o.message_type, o.topic, o.msg_key, o.headers, o.payload`,
        [batch],
      );
      seqs = (result.rows as { seq: string }[]).map((row) => String(row.seq));
    } else {
      seqs = await knex.transaction(async (trx) => {
        const [rows] = (await trx.raw(
          `SELECT seq, message_id, message_type, topic, msg_key, headers, payload FROM ${outbox} WHERE state = 'pending' AND available_at <= NOW(3) ` +
            `ORDER BY available_at, seq LIMIT ? FOR UPDATE SKIP LOCKED`,
          [batch],
        )) as [{ seq: string }[]];
        const ids = rows.map((row) => String(row.seq));
        if (ids.length > 0) {
          await trx.raw(`UPDATE ${outbox} SET lease_owner = 'raw', available_at = NOW(3) + INTERVAL 30 SECOND WHERE seq IN (${ids.map(() => '?').join(',')})`, ids);
        }
        return ids;
      });
    }
    if (seqs.length === 0) break;
    const now = db.dialect === 'postgresql' ? 'now()' : 'NOW(3)';
    await knex.raw(`UPDATE ${outbox} SET state = 'published', published_at = ${now} WHERE seq IN (${seqs.map(() => '?').join(',')})`, seqs);
    done += seqs.length;
  }
  return done / ((performance.now() - started) / 1000);
}

/** Batch size of the hand-written relay (issue 14's baseline). */
export const HAND_RELAY_BATCH = 500;

/** One claimed outbox row as the hand-written relays read it (column name → driver value). */
export type OutboxRow = Record<string, unknown>;

/**
 * The loop every hand-written relay of the bench shares, as a user would write it: in one
 * transaction, claim `batch` pending rows with `SELECT … FOR UPDATE SKIP LOCKED`, hand them
 * to `send` (which resolves once the broker has them durably), mark them published, commit.
 * No per-key order, no lease, no fencing. One loop, until nothing is pending. Resolves with
 * rows per second.
 */
export async function handWrittenClaimLoop(db: BenchDb, batch: number, send: (rows: readonly OutboxRow[]) => Promise<void>): Promise<number> {
  const knex = (db.orm.em as unknown as EntityManager).getConnection('write').getKnex() as Knex;
  const outbox = db.table('outbox');
  const now = db.dialect === 'postgresql' ? 'now()' : 'NOW(3)';
  let done = 0;
  const started = performance.now();
  for (;;) {
    const count = await knex.transaction(async (trx) => {
      const result = await trx.raw(
        `SELECT seq, message_id, message_type, message_version, topic, msg_key, occurred_at, correlation_id, causation_id, traceparent, tracestate, headers, payload ` +
          `FROM ${outbox} WHERE state = 'pending' AND available_at <= ${now} ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED`,
        [batch],
      );
      const rows = (db.dialect === 'postgresql' ? result.rows : result[0]) as OutboxRow[];
      if (rows.length === 0) return 0;
      await send(rows);
      const seqs = rows.map((row) => String(row['seq']));
      await trx.raw(`UPDATE ${outbox} SET state = 'published', published_at = ${now} WHERE seq IN (${seqs.map(() => '?').join(',')})`, seqs);
      return rows.length;
    });
    if (count === 0) break;
    done += count;
  }
  return done / ((performance.now() - started) / 1000);
}

/**
 * The relay a user would write by hand instead of Courier, for RabbitMQ: the shared claim
 * loop, publishing each batch on one confirm channel (persistent, mandatory, the transport's
 * own AMQP mapping, so the same bytes) and waiting for every confirm before the mark. The
 * same durability as Courier's (synchronous commit, quorum queue, confirms).
 */
export async function handWrittenRelay(db: BenchDb, broker: BenchBroker, batch = HAND_RELAY_BATCH): Promise<number> {
  const connection = await broker.connect();
  try {
    const channel = await connection.createConfirmChannel();
    const rate = await handWrittenClaimLoop(db, batch, async (rows) => {
      const confirms = rows.map((row) => {
        const envelope = {
          messageId: String(row['message_id']),
          type: String(row['message_type']),
          version: Number(row['message_version']),
          topic: String(row['topic']),
          occurredAt: String(row['occurred_at']),
          key: row['msg_key'] === null ? null : String(row['msg_key']),
          correlationId: String(row['correlation_id']),
          causationId: null,
          traceparent: null,
          tracestate: null,
          headers: JSON.parse(String(row['headers'])) as Record<string, string>,
          payload: String(row['payload']),
        } as Envelope;
        const message = toAmqpMessage(envelope);
        return new Promise<void>((resolve, reject) => {
          channel.publish(broker.exchange, envelope.topic, message.content, { ...message.properties, persistent: true, mandatory: true }, (error: unknown) =>
            error ? reject(new Error(`hand-written relay: message ${envelope.messageId} was nacked`)) : resolve(),
          );
        });
      });
      await Promise.all(confirms);
    });
    await channel.close();
    return rate;
  } finally {
    await connection.close().catch(() => undefined);
  }
}

/** What a phase cost this process: CPU seconds (user + system) and peak resident set size. */
export interface ProcessCost<T> {
  readonly result: T;
  readonly cpuSeconds: number;
  /** Highest RSS sampled (every 100 ms, and at the end) during the phase, in MB. */
  readonly peakRssMb: number;
  /** RSS when the phase started, in MB (the bench's own baseline: ORM, drivers, earlier phases). */
  readonly startRssMb: number;
}

/**
 * Runs `work` and measures this process around it with `process.cpuUsage()` and sampled
 * RSS. During a drain the bench process runs only the drain (plus a 10 ms completion
 * poll), so this is the relay's own cost; the database and broker are other processes.
 */
export async function processCost<T>(work: () => Promise<T>): Promise<ProcessCost<T>> {
  const startRss = process.memoryUsage.rss();
  let peak = startRss;
  const sampler = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
  }, 100);
  const cpu = process.cpuUsage();
  try {
    const result = await work();
    const used = process.cpuUsage(cpu);
    peak = Math.max(peak, process.memoryUsage.rss());
    return { result, cpuSeconds: (used.user + used.system) / 1e6, peakRssMb: peak / 2 ** 20, startRssMb: startRss / 2 ** 20 };
  } finally {
    clearInterval(sampler);
  }
}

/** Runs `work` on `writers` closed loops for `seconds` (after a short warm-up); resolves with operations per second. */
export async function closedLoop(writers: number, seconds: number, work: (writer: number, round: number) => Promise<void>): Promise<number> {
  let running = true;
  let counting = false;
  let count = 0;
  let failure: { error: unknown } | undefined;
  const loops = Array.from({ length: writers }, async (_, writer) => {
    try {
      for (let round = 0; running; round += 1) {
        await work(writer, round);
        if (counting) count += 1;
      }
    } catch (error) {
      // Stop every loop and fail the measurement (not the process) once they have ended.
      failure ??= { error };
      running = false;
    }
  });
  await new Promise((resolve) => setTimeout(resolve, Math.min(1_000, seconds * 250)));
  counting = true;
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, seconds * 1_000));
  counting = false;
  const elapsed = (performance.now() - started) / 1000;
  running = false;
  await Promise.all(loops);
  if (failure) throw failure.error;
  return count / elapsed;
}

/** The hand-written outbox insert (PostgreSQL placeholders `?` for MikroORM's connection). */
export function handWrittenInsert(db: BenchDb): string {
  const now = db.dialect === 'postgresql' ? 'now()' : 'NOW(3)';
  return `INSERT INTO ${db.table('outbox')} (${OUTBOX_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ${now}, ${now})`;
}

/** A node-postgres pool on the PostgreSQL URL. */
export function pgPool(max: number): pg.Pool {
  return new pg.Pool({ connectionString: URLS.postgresql, max });
}

/** One raw node-postgres producer transaction: the order row and the outbox row. */
export async function rawPgProducerTx(pool: pg.Pool, db: BenchDb, orderId: string): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`INSERT INTO ${db.table('orders')} (id, customer_id, total_cents, created_at) VALUES ($1, $2, $3, now())`, [orderId, `c-${orderId.slice(-6)}`, 12_345]);
    const values = outboxValues(orderId);
    const placeholders = values.map((_, index) => `$${index + 1}`).join(', ');
    await client.query(
      `INSERT INTO ${db.table('outbox')} (${OUTBOX_COLUMNS}) VALUES (${placeholders}, 'pending', 0, now(), now())`,
      values,
    );
    await client.query('COMMIT');
  } catch (error) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw error;
  } finally {
    client.release();
  }
}
