// Databases, stores, transport and queues of one bench run: every run has its own table
// prefix and queue prefix, and drops what it created.
import { randomBytes } from 'node:crypto';
import { createBus, defineMessage, newMessageId, type Bus, type Envelope, type PublishResult, type Transport } from '@courier/core';
import { MikroOrmInboxStore, MikroOrmOutboxStore, keyHash, resolveTableNames, type CourierTableNames } from '@courier/mikro-orm';
import { RabbitMqTransport, toAmqpMessage } from '@courier/rabbitmq';
import { EntitySchema, type EntityManager, type MikroORM, type Options } from '@mikro-orm/core';
import { connect, type Channel, type ChannelModel } from 'amqplib';
import { URLS } from './services.js';

export type Dialect = 'postgresql' | 'mariadb';

/** The message every scenario publishes: an order with a small JSON payload (~120 bytes). */
export const OrderPlaced = defineMessage('bench.OrderPlaced', { version: 1 });
export const TOPIC = OrderPlaced.topic;

/** A fresh id for this run's tables and queues. */
export function runId(): string {
  return `bench_${randomBytes(4).toString('hex')}`;
}

/**
 * The shape of a statement a `pg.Client.query` call sends (its first argument: text or a
 * query config), for scripts that count or time statements by kind: the run's table prefix
 * dropped and literals made `?` (MikroORM inlines parameters into the text), cut to `length`.
 */
export function statementShape(query: unknown, length: number): string {
  const text = typeof query === 'string' ? query : (query as { text?: string } | null)?.text ?? '?';
  return text.replace(/"bench_bench_[0-9a-f]+_[a-z]+_/g, '"').replace(/'[^']*'|-?\b\d+\b/g, '?').replace(/\s+/g, ' ').slice(0, length);
}

export function orderPayload(orderId: string): { orderId: string; customerId: string; totalCents: number; currency: string } {
  return { orderId, customerId: `c-${orderId.slice(-6)}`, totalCents: 12_345, currency: 'EUR' };
}

/** The business entity of the producer: one row per order. */
export interface BenchOrder {
  id: string;
  customerId: string;
  totalCents: number;
  createdAt: Date;
}

/** One database with Courier's tables under a prefix of its own, and a business table. */
export interface BenchDb {
  readonly dialect: Dialect;
  readonly orm: MikroORM;
  readonly names: CourierTableNames;
  readonly outbox: MikroOrmOutboxStore;
  readonly inbox: MikroOrmInboxStore;
  /** Entity class of `<prefix>orders`. */
  readonly Order: new () => BenchOrder;
  /** Quoted name of a table (`outbox`, `orders`, …) of this run. */
  table(name: 'outbox' | 'inbox' | 'orders'): string;
  /** Raw SQL on the ORM's connection (`?` placeholders), outside any unit of work. */
  sql(query: string, params?: readonly unknown[]): Promise<Record<string, unknown>[]>;
  /** Drops this run's tables and closes the ORM. */
  close(): Promise<void>;
}

export interface OpenDbOptions {
  readonly prefix: string;
  readonly poolMax?: number;
  /** PostgreSQL LISTEN/NOTIFY wake-ups; the store's default (on) unless false. */
  readonly wakeups?: boolean;
  /** The outbox's `publishedRows` (what a completion does with its rows); the store's default (`keep`) unless set. */
  readonly publishedRows?: 'keep' | 'delete';
  /** PostgreSQL: the connections' `application_name`, so a bench can find its own backends in `pg_stat_activity`. */
  readonly applicationName?: string;
}

/** Opens MikroORM on `dialect`, creates Courier's schema with `<prefix>_` and the orders table. */
export async function openDb(dialect: Dialect, options: OpenDbOptions): Promise<BenchDb> {
  const tablePrefix = `${options.prefix}_`;
  const ordersTable = `${tablePrefix}orders`;
  // A class per ORM: MikroORM keeps metadata on the class.
  class Order implements BenchOrder {
    id!: string;
    customerId!: string;
    totalCents!: number;
    createdAt: Date = new Date();
  }
  const schema = new EntitySchema<Order>({
    class: Order,
    tableName: ordersTable,
    properties: {
      id: { type: 'string', length: 64, primary: true },
      customerId: { type: 'string', length: 64, fieldName: 'customer_id' },
      totalCents: { type: 'integer', fieldName: 'total_cents' },
      createdAt: { type: 'datetime', fieldName: 'created_at' },
    },
  });
  const common = {
    entities: [schema],
    debug: false,
    discovery: { warnWhenNoEntities: false },
    pool: { min: 0, max: options.poolMax ?? 16 },
    ...(options.applicationName === undefined || dialect !== 'postgresql' ? {} : { driverOptions: { connection: { application_name: options.applicationName } } }),
  };
  let orm: MikroORM;
  if (dialect === 'postgresql') {
    const { MikroORM: PgOrm } = await import('@mikro-orm/postgresql');
    orm = await PgOrm.init({ clientUrl: URLS.postgresql, ...common } as Options);
  } else {
    const { MikroORM: MariaDbOrm } = await import('@mikro-orm/mariadb');
    orm = await MariaDbOrm.init({ clientUrl: URLS.mariadb, ...common } as Options);
  }
  const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
  const connection = orm.em.getConnection('write');
  const sql = async (query: string, params: readonly unknown[] = []) => (await connection.execute(query, [...params], 'all')) as Record<string, unknown>[];
  const names = resolveTableNames({ tablePrefix });
  const outbox = new MikroOrmOutboxStore({
    orm,
    tablePrefix,
    ...(options.wakeups === false ? { wakeups: false } : {}),
    ...(options.publishedRows === undefined ? {} : { publishedRows: options.publishedRows }),
  });
  const inbox = new MikroOrmInboxStore({ orm, tablePrefix });
  try {
    await outbox.ensureSchema();
    await sql(
      dialect === 'postgresql'
        ? `CREATE TABLE ${quote(ordersTable)} (id varchar(64) PRIMARY KEY, customer_id varchar(64) NOT NULL, total_cents integer NOT NULL, created_at timestamptz NOT NULL)`
        : `CREATE TABLE ${quote(ordersTable)} (id VARCHAR(64) PRIMARY KEY, customer_id VARCHAR(64) NOT NULL, total_cents INT NOT NULL, created_at DATETIME(3) NOT NULL) ENGINE=InnoDB`,
    );
  } catch (error) {
    await orm.close(true).catch(() => undefined);
    throw error;
  }
  return {
    dialect,
    orm,
    names,
    outbox,
    inbox,
    Order,
    table: (name) => quote(name === 'orders' ? ordersTable : name === 'outbox' ? names.outbox : names.inbox),
    sql,
    /**
     * Drops every table (and PostgreSQL's token sequence) `ensureSchema` and this function
     * created under the run's prefix — the inbox halt tables too, which were left behind —
     * then lists what still carries the prefix and throws naming it.
     */
    async close() {
      await outbox.close().catch(() => undefined);
      await inbox.close().catch(() => undefined);
      try {
        // Held and parked rows refer to their halt: dropped before it.
        const tables = [names.outbox, names.inboxHeld, names.inboxParked, names.inboxHalts, names.inbox, names.inboxStarts, names.meta, ordersTable, ...(dialect === 'mariadb' ? [names.outboxLocks] : [])];
        for (const table of tables) await sql(`DROP TABLE IF EXISTS ${quote(table)}`).catch(() => undefined);
        if (dialect === 'postgresql') await sql(`DROP SEQUENCE IF EXISTS ${quote(names.tokenSequence)}`).catch(() => undefined);
        const left = await sql(
          dialect === 'postgresql'
            ? 'SELECT tablename AS name FROM pg_tables WHERE left(tablename, ?) = ?'
            : 'SELECT table_name AS name FROM information_schema.tables WHERE table_schema = DATABASE() AND LEFT(table_name, ?) = ?',
          [tablePrefix.length, tablePrefix],
        );
        if (left.length > 0) throw new Error(`bench cleanup left tables behind (drop them by hand): ${left.map((row) => String(row['name'])).join(', ')}`);
      } finally {
        await orm.close(true);
      }
    },
  };
}

/** Column list of a hand-written outbox insert (the same columns Courier writes). */
export const OUTBOX_COLUMNS =
  'message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, causation_id, traceparent, tracestate, headers, payload, state, attempts, available_at, created_at';

/** Values of a hand-written outbox row for order `orderId` (same shape and size as Courier's). */
export function outboxValues(orderId: string): unknown[] {
  const messageId = newMessageId();
  return [messageId, OrderPlaced.type, 1, TOPIC, orderId, keyHash(TOPIC, orderId), new Date().toISOString(), messageId, null, null, null, '{}', JSON.stringify(orderPayload(orderId))];
}

/**
 * Seeds `count` pending outbox rows in one INSERT … SELECT (PostgreSQL generate_series,
 * MariaDB's sequence engine), not through Courier: distinct keys (`order-<n>`) or, with
 * `keys`, `n % keys` keys in sequence order, or with `keyless` no key at all. Then ANALYZE.
 */
export async function seedBacklog(db: BenchDb, count: number, options: { keys?: number; from?: number; keyless?: boolean } = {}): Promise<void> {
  const from = options.from ?? 1;
  const to = from + count - 1;
  // Keyless rows (no ordering asked): NULL key and key hash, as Courier writes them.
  const keyColumns = (key: string, hash: string) => (options.keyless ? 'NULL, NULL' : `${key}, ${hash}`);
  const payload = `'{"orderId":"' || k || '","customerId":"c-1","totalCents":12345,"currency":"EUR"}'`;
  if (db.dialect === 'postgresql') {
    const key = options.keys ? `'order-' || (i % ${options.keys})` : `'order-' || i`;
    await db.sql(
      `INSERT INTO ${db.table('outbox')} (${OUTBOX_COLUMNS}) ` +
        `SELECT m, '${OrderPlaced.type}', 1, '${TOPIC}', ${keyColumns('k', `substr(encode(sha256(convert_to('${TOPIC}', 'UTF8') || '\\x00'::bytea || convert_to(k, 'UTF8')), 'hex'), 1, 32)`)}, ` +
        `to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), m, NULL, NULL, NULL, '{}', ${payload}, 'pending', 0, now(), now() ` +
        `FROM (SELECT i, ${key} AS k, 'seed-' || md5(random()::text || i) AS m FROM generate_series(${from}, ${to}) AS i) AS s ORDER BY i`,
    );
    await db.sql(`ANALYZE ${db.table('outbox')}`);
  } else {
    const key = options.keys ? `CONCAT('order-', seq % ${options.keys})` : `CONCAT('order-', seq)`;
    await db.sql(
      `INSERT INTO ${db.table('outbox')} (${OUTBOX_COLUMNS}) ` +
        `SELECT m, '${OrderPlaced.type}', 1, '${TOPIC}', ${keyColumns('k', `LEFT(SHA2(CONCAT('${TOPIC}', CHAR(0), k), 256), 32)`)}, ` +
        `CONCAT(LEFT(DATE_FORMAT(UTC_TIMESTAMP(3), '%Y-%m-%dT%H:%i:%s.%f'), 23), 'Z'), m, NULL, NULL, NULL, '{}', CONCAT('{"orderId":"', k, '","customerId":"c-1","totalCents":12345,"currency":"EUR"}'), 'pending', 0, NOW(3), NOW(3) ` +
        `FROM (SELECT seq, ${key} AS k, CONCAT('seed-', MD5(CONCAT(RAND(), seq))) AS m FROM seq_${from}_to_${to}) AS s ORDER BY seq`,
    );
    await db.sql(`ANALYZE TABLE ${db.table('outbox')}`);
  }
}

/** Pending rows left (cheap: the partial / composite pending index). */
export async function anyPending(db: BenchDb): Promise<boolean> {
  const rows = await db.sql(`SELECT 1 AS one FROM ${db.table('outbox')} WHERE state = 'pending' LIMIT 1`);
  return rows.length > 0;
}

/** A transport wrapper that timestamps the relay's confirms (when `publish` resolves for a batch). */
export class TimedTransport implements Transport {
  readonly #inner: RabbitMqTransport;
  readonly #onConfirmed: (messageIds: readonly string[], at: number) => void;
  confirmed = 0;

  constructor(inner: RabbitMqTransport, onConfirmed: (messageIds: readonly string[], at: number) => void = () => {}) {
    this.#inner = inner;
    this.#onConfirmed = onConfirmed;
  }

  get capabilities() {
    return this.#inner.capabilities;
  }

  get deadLetters() {
    return this.#inner.deadLetters;
  }

  async publish(messages: readonly Envelope[], options?: { signal?: AbortSignal }): Promise<readonly PublishResult[]> {
    const results = await this.#inner.publish(messages, options);
    const at = performance.now();
    const ok = results.filter((result) => result.ok).map((result) => result.messageId);
    this.confirmed += ok.length;
    this.#onConfirmed(ok, at);
    return results;
  }

  subscribe(...args: Parameters<Transport['subscribe']>): ReturnType<Transport['subscribe']> {
    return this.#inner.subscribe(...args);
  }

  close(): Promise<void> {
    return this.#inner.close();
  }
}

/** RabbitMQ resources of one run: the transport's prefix, a sink queue, and cleanup. */
export class BenchBroker {
  readonly prefix: string;
  readonly exchange: string;
  readonly sinkQueue: string;
  readonly #consumers = new Set<string>();
  #admin: ChannelModel | undefined;

  constructor(prefix: string) {
    this.prefix = prefix.replace(/_/g, '-');
    this.exchange = `${this.prefix}.topics`;
    this.sinkQueue = `${this.prefix}.sink`;
  }

  /** Courier's RabbitMQ transport on this run's prefix; `confirmWindow` unless the plugin's default (256). */
  transport(confirmWindow?: number): RabbitMqTransport {
    return new RabbitMqTransport({ connection: URLS.rabbitmq, prefix: this.prefix, ...(confirmWindow === undefined ? {} : { confirmWindow }) });
  }

  /** Remembers a consumer whose queues `close` must delete. */
  track(consumer: string): void {
    this.#consumers.add(consumer);
  }

  /**
   * A durable quorum queue bound to the topic, capped at 1,000 messages (drop-head), so a
   * drain of a million messages does not fill the broker: the raw loop and the relay
   * publish into the same kind of queue, persistent, with confirms.
   */
  async declareSink(): Promise<void> {
    const channel = await (await this.#connection()).createChannel();
    await channel.assertExchange(this.exchange, 'direct', { durable: true });
    await channel.assertQueue(this.sinkQueue, { durable: true, arguments: { 'x-queue-type': 'quorum', 'x-max-length': 1_000 } });
    await channel.bindQueue(this.sinkQueue, this.exchange, TOPIC);
    await channel.close();
  }

  async #connection(): Promise<ChannelModel> {
    this.#admin ??= await connect(URLS.rabbitmq);
    return this.#admin;
  }

  /**
   * A plain amqplib connection for raw loops, with Nagle off like the connections
   * `RabbitMqTransport` opens: a ceiling with a different socket setting would not be the
   * same work.
   */
  connect(): Promise<ChannelModel> {
    return connect(URLS.rabbitmq, { noDelay: true });
  }

  /**
   * Deletes every queue and the exchange this run declared, then checks they are gone and
   * throws naming what is left. On a fresh connection: the admin one may have sat idle for
   * the whole scenario. Each deletion is tried up to three times (a quorum queue's delete can
   * fail under load, and a failed one closes its channel); deleting a queue that does not
   * exist succeeds, so only real failures count.
   */
  async close(): Promise<void> {
    await this.#admin?.close().catch(() => undefined);
    this.#admin = undefined;
    const probe = new RabbitMqTransport({ connection: URLS.rabbitmq, prefix: this.prefix });
    const queues = [this.sinkQueue];
    for (const consumer of this.#consumers) {
      const names = probe.names(consumer);
      queues.push(names.queue, names.deadLetterQueue, ...names.retryQueues.map((tier) => tier.name));
    }
    const connection = await connect(URLS.rabbitmq);
    try {
      const attempt = async (what: (channel: Channel) => Promise<unknown>): Promise<unknown> => {
        let failure: unknown;
        for (let tries = 0; tries < 3; tries += 1) {
          const channel = await connection.createChannel();
          channel.on('error', () => undefined);
          try {
            await what(channel);
            return undefined;
          } catch (error) {
            failure = error;
          } finally {
            await channel.close().catch(() => undefined);
          }
        }
        return failure;
      };
      const problems: string[] = [];
      for (const queue of queues) {
        const failure = await attempt((channel) => channel.deleteQueue(queue));
        if (failure) problems.push(`queue ${queue}: ${failure instanceof Error ? failure.message : String(failure)}`);
      }
      const failure = await attempt((channel) => channel.deleteExchange(this.exchange));
      if (failure) problems.push(`exchange ${this.exchange}: ${failure instanceof Error ? failure.message : String(failure)}`);
      // checkQueue succeeds only for a queue that still exists (404 closes its channel).
      for (const queue of queues) {
        const channel = await connection.createChannel();
        channel.on('error', () => undefined);
        const left = await channel.checkQueue(queue).then(
          () => true,
          () => false,
        );
        if (left) problems.push(`queue ${queue} still exists after its delete`);
        await channel.close().catch(() => undefined);
      }
      if (problems.length > 0) throw new Error(`bench cleanup left RabbitMQ objects behind (delete them by hand):\n  ${problems.join('\n  ')}`);
    } finally {
      await connection.close().catch(() => undefined);
    }
  }
}

/** Builds the envelopes the raw loops publish: the same mapping and bytes as the transport's. */
export function amqpOrder(orderId: string): ReturnType<typeof toAmqpMessage> {
  const messageId = newMessageId();
  const envelope: Envelope = {
    messageId,
    type: OrderPlaced.type,
    version: 1,
    topic: TOPIC,
    occurredAt: new Date().toISOString(),
    key: orderId,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: JSON.stringify(orderPayload(orderId)),
  };
  return toAmqpMessage(envelope);
}

/**
 * `COURIER_BENCH_RELAY_BATCH`: a relay batch size for every bus the bench builds without one of
 * its own (before/after pairs of a change to the default, e.g. the latency scenarios 4 and 5).
 */
function benchRelayBatch(): number | undefined {
  const value = process.env['COURIER_BENCH_RELAY_BATCH'];
  if (value === undefined || value === '') return undefined;
  const batch = Number(value);
  if (!Number.isSafeInteger(batch) || batch <= 0) throw new Error(`COURIER_BENCH_RELAY_BATCH must be a positive integer, got '${value}'`);
  return batch;
}

/**
 * A bus on `db` and `transport`: the relay's default batch size unless `relay.batchSize` (or
 * `COURIER_BENCH_RELAY_BATCH`) says otherwise, polling every second.
 */
export function benchBus(db: BenchDb, transport: Transport, relay: { batchSize?: number; pollIntervalMs?: number } = {}): Bus<EntityManager> {
  const batchSize = relay.batchSize ?? benchRelayBatch();
  const batch = batchSize === undefined ? {} : { batchSize };
  return createBus<EntityManager>({ outbox: db.outbox, inbox: db.inbox, transport, relay: { ...batch, pollIntervalMs: relay.pollIntervalMs ?? 1_000 } });
}

/**
 * One producer transaction of the bench's business: an order row `id` and its OrderPlaced
 * message (keyed by the order) in one MikroORM transaction. `published` is told the message
 * id before the commit, so a confirm can never arrive before the caller knows the id.
 */
export async function produceOrder(db: BenchDb, bus: Bus<EntityManager>, id: string, published?: (messageId: string) => void): Promise<void> {
  await db.orm.em.fork().transactional((em) => {
    em.persist(em.create(db.Order, { id, customerId: 'c-1', totalCents: 12_345, createdAt: new Date() }));
    const messageId = bus.outbox(em).publish(OrderPlaced, orderPayload(id), { key: id });
    published?.(messageId);
    return Promise.resolve();
  });
}

/**
 * `writers` closed loops, each running `transaction` again as soon as the last one
 * committed, for `seconds` (no warm-up: every commit counts, from the first). Resolves with
 * the commits and the seconds they took, once every loop's last transaction ended. The first
 * failure stops every loop and is thrown after they ended.
 */
export async function closedLoopProducers(writers: number, seconds: number, transaction: () => Promise<void>): Promise<{ commits: number; seconds: number }> {
  let running = true;
  let commits = 0;
  let failure: { error: unknown } | undefined;
  const started = performance.now();
  const loops = Array.from({ length: writers }, async () => {
    try {
      while (running) {
        await transaction();
        commits += 1;
      }
    } catch (error) {
      failure ??= { error };
      running = false;
    }
  });
  await sleep(seconds * 1000);
  running = false;
  await Promise.all(loops);
  if (failure) throw failure.error;
  return { commits, seconds: (performance.now() - started) / 1000 };
}

/**
 * Starts `bus`'s relay and warms it and its connection with one message (sequence 1e9, out of
 * the way of a backlog seeded after it): resolves once `confirmed()` says the broker took it
 * and no row is pending, so a drain timed after it measures the relay at speed.
 */
export async function warmRelay(db: BenchDb, bus: Pick<Bus<EntityManager>, 'start' | 'wake'>, confirmed: () => boolean): Promise<void> {
  await bus.start({ relay: true, consumers: false });
  await seedBacklog(db, 1, { from: 1_000_000_000 });
  bus.wake();
  await until(confirmed, 30_000, 'the warm-up message');
  await until(async () => !(await anyPending(db)), 30_000, 'the warm-up message to complete', 20);
}

/** Resolves when `done()` is true, checking every `everyMs`; throws after `timeoutMs`. */
export async function until(done: () => boolean | Promise<boolean>, timeoutMs: number, what: string, everyMs = 5): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await done())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
