import { randomUUID } from 'node:crypto';
import {
  ClosedError,
  ConfigError,
  CourierError,
  ENVELOPE_FIELDS,
  TransportError,
  boundReason,
  decodeEnvelope,
  describeError,
  noopLogger,
  payloadBytes,
  type DeadLetter,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type Logger,
  type PortLimits,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
  type TransportDeadLetters,
} from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { detectDialect, knexListenSource, SqlRunner } from '@courier/mikro-orm/sql-kit';
import {
  OutboxWakeups,
  classifyDriverError,
  driverMessage,
  toNullableString,
  toNumber,
  type DialectName,
  type PostgresWakeupConfig,
  type SqlRow,
} from '@courier/sql-engine';
import { BusyRetryRunner } from './busy-retry-runner.js';
import { QUEUE_COLUMNS, createQueueDialect, queueKeyHash, resolveQueueNames, type QueueDialect, type QueueInsert, type QueueTableNames } from './queue-dialect.js';

/** The part of a `MikroORM` instance the transport uses: its global EntityManager. */
export interface SqlTransportOrm {
  readonly em: EntityManager;
}

/** Arguments of {@link SqlTransport}. */
export interface SqlTransportConfig {
  /** The application's initialised MikroORM (PostgreSQL, MySQL/MariaDB or SQLite driver); not closed by the transport. */
  readonly orm: SqlTransportOrm;
  /** Prefix of the transport's tables: `<prefix>queue`, `<prefix>queue_groups`. Default `courier_`. */
  readonly tablePrefix?: string;
  /** PostgreSQL schema or MySQL/MariaDB database of the tables. Default: the connection's current one. */
  readonly schema?: string;
  /** Overrides dialect detection from the ORM's platform. */
  readonly dialect?: DialectName;
  /**
   * How long a claimed delivery stays invisible to other instances of its group, in ms
   * (database clock). The subscription renews it every third of this while the handler
   * runs, so it bounds only how late a crashed instance's deliveries come back. Default 30 s.
   */
  readonly leaseMs?: number;
  /** Gap between two claims of an idle subscription, in ms; PostgreSQL wake-ups usually come first. Default 250 ms. */
  readonly pollIntervalMs?: number;
  /** Largest payload (UTF-8 bytes of `envelope.payload`). Default 1 MiB. */
  readonly maxMessageBytes?: number;
  /** Rows per INSERT statement of a publish. Default 200. */
  readonly insertBatchSize?: number;
  /**
   * PostgreSQL wake-ups: a coalesced NOTIFY after every publish commit and a LISTEN
   * connection feeding the subscriptions of this transport. `false` turns both off (behind
   * PgBouncer in transaction pooling mode): subscriptions then poll. Ignored elsewhere.
   */
  readonly wakeups?: PostgresWakeupConfig | false;
  readonly logger?: Logger;
}

/** Options of {@link SqlTransport.prune}. */
export interface SqlTransportPruneOptions {
  /** Dead letters at least this old (by the time they died, database clock) are deleted. */
  readonly olderThanMs: number;
  /** Rows per DELETE, each its own short transaction. Default 1,000. */
  readonly batchSize?: number;
  readonly signal?: AbortSignal;
}

const DEFAULTS = { leaseMs: 30_000, pollIntervalMs: 250, maxMessageBytes: 1024 * 1024, insertBatchSize: 200 } as const;
// How long one operation keeps retrying a lost lock conflict (SQLite's busy file) before it fails retriably.
const LOCK_PATIENCE_MS = 10_000;
const ERROR_BACKOFF_MIN_MS = 100;
const ERROR_BACKOFF_MAX_MS = 5_000;

/**
 * A Courier transport whose queue is a table in the application's own database
 * (PostgreSQL, MySQL/MariaDB, or a SQLite file shared by processes), through MikroORM.
 *
 * Guarantees:
 * - `publish` inserts one row per (message, consumer group subscribed to its topic) and
 *   answers after that insert committed, one result per message; a message whose topic no
 *   group has subscribed to yet is `PUBLISH_UNROUTABLE` (the relay retries it). While the
 *   database is unreachable the call rejects with a retriable `TransportError`.
 * - Consumer groups each get every message of their topics; instances of a group compete:
 *   each claim locks due rows (`FOR UPDATE SKIP LOCKED`; SQLite's single writer) and
 *   leases them until the database clock passes the lease. A crashed instance's rows are
 *   claimed again after the lease; every settle is fenced on the claim's lease id, so a
 *   stale instance changes nothing.
 * - Ordered endpoints claim only the head of each (topic, key) (no earlier row of the key
 *   still pending for the group), so any number of instances share an ordered group and a
 *   key is never handled twice at once; an ordered `retry` keeps the row in front of its key.
 * - `retry(delay)` reschedules the row (`available_at`, database clock) with `attempt + 1`;
 *   redeliveries after a crash keep their attempt. `deadLetter` keeps the row as a dead
 *   letter with its reason (`deadLetters` lists, replays, purges); `prune` deletes old dead
 *   letters in bounded batches. Acknowledged rows are deleted at once.
 * - `close()` is idempotent: stops claiming, waits for handlers in flight, stops renewing.
 */
export class SqlTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  readonly limits: PortLimits = { consumer: { chars: 200 } };
  readonly deadLetters: TransportDeadLetters;
  readonly #runner: SqlRunner;
  readonly #dialect: QueueDialect;
  readonly #names: QueueTableNames;
  readonly #wakeups: OutboxWakeups;
  readonly #logger: Logger;
  readonly #leaseMs: number;
  readonly #pollIntervalMs: number;
  readonly #insertBatchSize: number;
  readonly #subscriptions = new Set<QueueSubscription>();
  readonly #inFlight = new Set<Promise<unknown>>();
  #prepared: Promise<void> | undefined;
  #closing: Promise<void> | undefined;

  constructor(config: SqlTransportConfig) {
    const problems: string[] = [];
    const positive = (name: keyof typeof DEFAULTS): number => {
      const value = config[name] ?? DEFAULTS[name];
      if (!Number.isSafeInteger(value) || value <= 0) problems.push(`'${name}' must be a positive integer, got ${String(value)}`);
      return value;
    };
    this.#leaseMs = positive('leaseMs');
    this.#pollIntervalMs = positive('pollIntervalMs');
    this.#insertBatchSize = positive('insertBatchSize');
    const maxMessageBytes = positive('maxMessageBytes');
    if (!config.orm?.em) problems.push(`'orm' must be an initialised MikroORM instance`);
    let names: QueueTableNames | undefined;
    try {
      names = resolveQueueNames(config);
    } catch (error) {
      problems.push(error instanceof Error ? error.message : String(error));
    }
    const platform = config.orm?.em?.getPlatform();
    const dialectName = config.dialect ?? (platform ? detectDialect(platform) : undefined);
    if (platform && dialectName === undefined) {
      problems.push(`the MikroORM platform '${platform.constructor.name}' is not supported: use @mikro-orm/postgresql, @mikro-orm/mysql, @mikro-orm/mariadb or @mikro-orm/libsql`);
    }
    if (problems.length > 0 || !names || !dialectName) throw new ConfigError(problems);
    this.#names = names;
    this.#dialect = createQueueDialect(dialectName, names);
    this.#logger = config.logger ?? noopLogger;
    const connection = config.orm.em.getConnection('write');
    this.#runner = new BusyRetryRunner(connection, this.#dialect.transactionPrologue, LOCK_PATIENCE_MS);
    this.#wakeups = new OutboxWakeups({
      runner: this.#runner,
      channel: dialectName === 'postgresql' ? names.channel : undefined,
      config: config.wakeups,
      logger: this.#logger,
      source: dialectName === 'postgresql' ? knexListenSource(connection) : undefined,
    });
    this.capabilities = { orderingByKey: true, orderedPipelining: false, nativeDelay: true, nativeDeadLetter: true, maxMessageBytes };
    this.deadLetters = {
      list: (consumer, options) => this.#listDead(consumer, options?.limit ?? 100),
      replay: (consumer, ids) => this.#replay(consumer, ids),
      purge: (consumer, ids) => this.#purge(consumer, ids),
    };
  }

  /** The database family in use. */
  get dialect(): DialectName {
    return this.#dialect.name;
  }

  /**
   * Creates the transport's tables and indexes when missing (idempotent, safe from several
   * processes at once). For production, prefer running {@link SqlTransport.schemaStatements}
   * from your migrations.
   */
  async ensureSchema(): Promise<void> {
    this.#assertOpen();
    try {
      await this.#dialect.prepareDatabase?.(this.#runner);
      if (this.#dialect.name === 'postgresql') {
        // Concurrent CREATE … IF NOT EXISTS can collide in the catalog: take turns.
        await this.#runner.transaction(async (trx) => {
          await this.#runner.all('SELECT pg_advisory_xact_lock(hashtext(?))', [this.#names.channel], trx);
          for (const statement of this.#dialect.schemaStatements()) await this.#runner.run(statement, [], trx);
        });
      } else {
        // One statement per transaction, without SQLite's write lock (its table may not exist yet).
        for (const statement of this.#dialect.schemaStatements()) await this.#runner.transaction((trx) => this.#runner.run(statement, [], trx), { writeLock: false });
      }
    } catch (error) {
      throw this.#error(error, 'ensureSchema');
    }
  }

  /** The idempotent DDL `ensureSchema` runs, for your own migrations. */
  schemaStatements(): string[] {
    return this.#dialect.schemaStatements();
  }

  /**
   * Publishes in order: inserts a row per subscribed group of each message's topic, in one
   * transaction per call (messages that fail alone are retried one per transaction, so a
   * refused one never fails its neighbours), and answers once the insert committed.
   */
  async publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    this.#assertOpen();
    // The Transport contract's ABORTED: retriable, nothing about the messages was wrong.
    if (options.signal?.aborted) throw new TransportError(`'publish' was aborted`, { code: 'ABORTED', retriable: true, cause: options.signal.reason });
    if (messages.length === 0) return [];
    return this.#track(this.#publish(messages));
  }

  async #publish(messages: readonly Envelope[]): Promise<readonly PublishResult[]> {
    await this.#prepare();
    const results = new Map<number, PublishResult>();
    const sendable: { index: number; envelope: Envelope }[] = [];
    messages.forEach((envelope, index) => {
      const bytes = payloadBytes(envelope);
      if (bytes > this.capabilities.maxMessageBytes) {
        results.set(index, {
          messageId: envelope.messageId,
          ok: false,
          error: new TransportError(`message '${envelope.messageId}' has a payload of ${bytes} bytes, over maxMessageBytes ${this.capabilities.maxMessageBytes}`, {
            code: 'PAYLOAD_TOO_LARGE',
            retriable: false,
          }),
        });
      } else {
        sendable.push({ index, envelope });
      }
    });
    if (sendable.length > 0) {
      let routed: Map<number, number>;
      try {
        routed = await this.#insert(sendable);
      } catch (error) {
        if (classifyDriverError(error) !== 'permanent' || sendable.length === 1) {
          if (sendable.length === 1 && classifyDriverError(error) === 'permanent') {
            const only = sendable[0]!;
            results.set(only.index, { messageId: only.envelope.messageId, ok: false, error: this.#rejected(only.envelope, error) });
            return messages.map((_, index) => results.get(index)!);
          }
          throw this.#error(error, 'publish');
        }
        // Something in the batch was refused for its content: find it, one transaction each.
        routed = new Map();
        for (const item of sendable) {
          try {
            for (const [index, count] of await this.#insert([item])) routed.set(index, count);
          } catch (single) {
            if (classifyDriverError(single) !== 'permanent') throw this.#error(single, 'publish');
            results.set(item.index, { messageId: item.envelope.messageId, ok: false, error: this.#rejected(item.envelope, single) });
          }
        }
      }
      for (const { index, envelope } of sendable) {
        if (results.has(index)) continue;
        const count = routed.get(index) ?? 0;
        results.set(
          index,
          count > 0
            ? { messageId: envelope.messageId, ok: true }
            : {
                messageId: envelope.messageId,
                ok: false,
                error: new TransportError(`message '${envelope.messageId}' is unroutable: no consumer group has subscribed to topic '${envelope.topic}'`, {
                  code: 'PUBLISH_UNROUTABLE',
                }),
              },
        );
      }
      if ([...routed.values()].some((count) => count > 0)) this.#wakeups.signal();
    }
    return messages.map((_, index) => results.get(index)!);
  }

  /** Inserts the rows of `items` in one transaction; returns how many groups each got. */
  async #insert(items: readonly { index: number; envelope: Envelope }[]): Promise<Map<number, number>> {
    const topics = [...new Set(items.map((item) => item.envelope.topic))];
    return this.#runner.transaction(
      async (trx) => {
        const groups = await this.#runner.all(`SELECT consumer, topic FROM ${this.#dialect.table('groups')} WHERE topic IN (?)`, [topics], trx);
        const byTopic = new Map<string, string[]>();
        for (const row of groups) {
          const topic = toNullableString(row['topic']) ?? '';
          byTopic.set(topic, [...(byTopic.get(topic) ?? []), toNullableString(row['consumer']) ?? '']);
        }
        const counts = new Map<number, number>();
        const rows: QueueInsert[] = [];
        for (const { index, envelope } of items) {
          const consumers = byTopic.get(envelope.topic) ?? [];
          counts.set(index, consumers.length);
          const body = encodeBody(envelope);
          const keyHash = queueKeyHash(envelope.topic, envelope.key);
          for (const consumer of consumers) rows.push({ consumer, topic: envelope.topic, messageId: envelope.messageId, keyHash, body });
        }
        for (let start = 0; start < rows.length; start += this.#insertBatchSize) {
          const chunk = rows.slice(start, start + this.#insertBatchSize);
          const values = chunk.map(() => `(?, ?, ?, ?, ?, 'pending', ${this.#dialect.now}, 1, 0)`).join(', ');
          await this.#runner.run(
            `INSERT INTO ${this.#dialect.table('queue')} (consumer, topic, message_id, key_hash, body, state, available_at, attempt, replayed) VALUES ${values}`,
            chunk.flatMap((row) => [row.consumer, row.topic, row.messageId, row.keyHash, row.body]),
            trx,
          );
        }
        return counts;
      },
      { readCommitted: this.#dialect.readCommitted },
    );
  }

  /**
   * Subscribes a consumer group: registers the group for each topic (from then on every
   * publish to them inserts a row for it) and starts claiming. At most
   * `endpoint.concurrency` handlers run at once.
   */
  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    this.#assertOpen();
    const problems: string[] = [];
    if (typeof endpoint.consumer !== 'string' || endpoint.consumer.length === 0) problems.push(`'consumer' must be a non-empty string`);
    if (!Array.isArray(endpoint.topics) || endpoint.topics.length === 0) problems.push(`'topics' must list at least one topic`);
    if (!Number.isSafeInteger(endpoint.concurrency) || endpoint.concurrency < 1) problems.push(`'concurrency' must be a positive integer, got ${String(endpoint.concurrency)}`);
    if (problems.length > 0) throw new ConfigError(problems);
    await this.#register(endpoint, 'subscribe');
    this.#assertOpen();
    const subscription = new QueueSubscription({
      endpoint,
      handler,
      runner: this.#runner,
      dialect: this.#dialect,
      leaseMs: this.#leaseMs,
      pollIntervalMs: this.#pollIntervalMs,
      logger: this.#logger,
      onClosed: (closed) => this.#subscriptions.delete(closed),
    });
    this.#subscriptions.add(subscription);
    await subscription.start(this.#wakeups);
    return subscription;
  }

  /**
   * Registers a consumer group for its topics without consuming (idempotent): from then on
   * every publish to them keeps a row for the group, so a producer that starts before the
   * group's first consumer loses nothing to `PUBLISH_UNROUTABLE`. Provision your groups at
   * deploy time, as you would declare queues on a broker.
   */
  async provision(endpoint: Pick<Endpoint, 'consumer' | 'topics'>): Promise<void> {
    this.#assertOpen();
    if (typeof endpoint.consumer !== 'string' || endpoint.consumer.length === 0 || !Array.isArray(endpoint.topics) || endpoint.topics.length === 0) {
      throw new ConfigError(`provision needs a non-empty 'consumer' and at least one topic`);
    }
    await this.#register(endpoint, 'provision');
  }

  #register(endpoint: Pick<Endpoint, 'consumer' | 'topics'>, operation: string): Promise<void> {
    return this.#database(operation, () =>
      this.#runner.transaction(async (trx) => {
        for (const topic of endpoint.topics) await this.#runner.run(this.#dialect.registerGroupSql, [endpoint.consumer, topic], trx);
      }),
    );
  }

  /**
   * Deletes dead letters that died at least `olderThanMs` ago (database clock), `batchSize`
   * per statement, each batch its own short transaction, until a batch comes back short.
   * Returns the count. (Acknowledged rows are deleted at once, so there is nothing else to prune.)
   */
  async prune(options: SqlTransportPruneOptions): Promise<number> {
    this.#assertOpen();
    const batchSize = options.batchSize ?? 1_000;
    if (!Number.isFinite(options.olderThanMs) || options.olderThanMs < 0) throw new ConfigError(`'olderThanMs' must be a number of 0 or more, got ${String(options.olderThanMs)}`);
    if (!Number.isSafeInteger(batchSize) || batchSize < 1) throw new ConfigError(`'batchSize' must be a positive integer, got ${String(batchSize)}`);
    return this.#track(
      (async () => {
        await this.#prepare();
        let deleted = 0;
        for (;;) {
          if (options.signal?.aborted) throw new CourierError('ABORTED', `'prune' was aborted`, { cause: options.signal.reason });
          try {
            const result = await this.#runner.transaction((trx) => this.#runner.run(this.#dialect.pruneDeadSql, [Math.round(options.olderThanMs), batchSize], trx), {
              readCommitted: this.#dialect.readCommitted,
            });
            deleted += result.affectedRows;
            if (result.affectedRows < batchSize) return deleted;
          } catch (error) {
            throw this.#error(error, 'prune');
          }
        }
      })(),
    );
  }

  /**
   * See `Transport.consumerLag`: the group's rows waiting in the queue table — pending and
   * not held by a live lease, so due now, waiting out a retry delay, or left by an instance
   * whose lease ran out (it comes again) — counted by one `SELECT`, database clock. Rows in a
   * handler's hands (leased) and dead letters are not counted. Null when the group has no
   * row in the groups table (it never subscribed, and was never provisioned). Reads only:
   * no lease, no row, no table is written (missing tables are `SCHEMA_MISSING`, as for
   * every other read).
   */
  async consumerLag(consumer: string): Promise<number | null> {
    this.#assertOpen();
    const rows = await this.#database('consumerLag', () =>
      this.#runner.all(
        `SELECT (SELECT COUNT(*) FROM ${this.#dialect.table('groups')} WHERE consumer = ?) AS known, ` +
          `(SELECT COUNT(*) FROM ${this.#dialect.table('queue')} WHERE consumer = ? AND state = 'pending' AND (lease_owner IS NULL OR available_at <= ${this.#dialect.now})) AS waiting`,
        [consumer, consumer],
      ),
    );
    const row = rows[0];
    if (!row || toNumber(row['known']) === 0) return null;
    return toNumber(row['waiting']);
  }

  /** Stops every subscription (waiting for its handlers), the wake-ups, and in-flight calls. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.all([...this.#subscriptions].map((subscription) => subscription.close()));
      while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
      await this.#wakeups.close();
    })();
    return this.#closing;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #listDead(consumer: string, limit: number): Promise<readonly DeadLetter[]> {
    this.#assertOpen();
    const rows = await this.#database('deadLetters.list', () =>
      this.#runner.all(
        `SELECT ${QUEUE_COLUMNS}, reason_code, reason_message, ${this.#dialect.epochMs('dead_at')} AS dead_ms FROM ${this.#dialect.table('queue')} ` +
          `WHERE consumer = ? AND state = 'dead' ORDER BY dead_at, seq LIMIT ?`,
        [consumer, limit],
      ),
    );
    const letters: DeadLetter[] = [];
    for (const row of rows) {
      let envelope: Envelope;
      try {
        envelope = decodeBody(row['body']);
      } catch {
        continue; // not an envelope: listed by no one, purge it with SQL
      }
      letters.push({
        id: String(row['seq']),
        consumer,
        envelope,
        reason: { code: toNullableString(row['reason_code']) ?? 'UNKNOWN', message: toNullableString(row['reason_message']) ?? '' },
        attempt: toNumber(row['attempt']),
        deadAt: new Date(toNumber(row['dead_ms'])),
      });
    }
    return letters;
  }

  async #replay(consumer: string, ids: readonly string[]): Promise<number> {
    this.#assertOpen();
    const seqs = ids.filter((id) => /^\d+$/.test(id));
    if (seqs.length === 0) return 0;
    const queue = this.#dialect.table('queue');
    // A new row (a new seq) rather than the old one revived: the replayed message goes
    // behind its key's pending rows instead of jumping in front of one already in flight.
    const replayed = await this.#database('deadLetters.replay', () =>
      this.#runner.transaction(
        async (trx) => {
          const inserted = await this.#runner.run(
            `INSERT INTO ${queue} (consumer, topic, message_id, key_hash, body, state, available_at, attempt, replayed) ` +
              `SELECT consumer, topic, message_id, key_hash, body, 'pending', ${this.#dialect.now}, 1, 1 FROM ${queue} WHERE consumer = ? AND state = 'dead' AND seq IN (?)`,
            [consumer, seqs],
            trx,
          );
          await this.#runner.run(`DELETE FROM ${queue} WHERE consumer = ? AND state = 'dead' AND seq IN (?)`, [consumer, seqs], trx);
          return inserted.affectedRows;
        },
        { readCommitted: this.#dialect.readCommitted },
      ),
    );
    if (replayed > 0) this.#wakeups.signal();
    return replayed;
  }

  async #purge(consumer: string, ids: readonly string[]): Promise<number> {
    this.#assertOpen();
    const seqs = ids.filter((id) => /^\d+$/.test(id));
    if (seqs.length === 0) return 0;
    const result = await this.#database('deadLetters.purge', () =>
      this.#runner.run(`DELETE FROM ${this.#dialect.table('queue')} WHERE consumer = ? AND state = 'dead' AND seq IN (?)`, [consumer, seqs]),
    );
    return result.affectedRows;
  }

  /** Once per transport: SQLite's WAL mode (outside any transaction). A failure is retried by the next call. */
  #prepare(): Promise<void> {
    this.#prepared ??= (this.#dialect.prepareDatabase?.(this.#runner) ?? Promise.resolve()).catch((error: unknown) => {
      this.#prepared = undefined;
      throw this.#error(error, 'prepare');
    });
    return this.#prepared;
  }

  #assertOpen(): void {
    if (this.#closing) throw new ClosedError('sql transport');
  }

  /**
   * One database call of an operation: tracked (close() waits for it), after the once-per-
   * transport preparation, its driver error restated for `operation`. What a caller does with
   * the rows afterwards is outside, so no other failure is dressed as a database one.
   */
  #database<T>(operation: string, work: () => Promise<T>): Promise<T> {
    return this.#track(
      (async () => {
        await this.#prepare();
        try {
          return await work();
        } catch (error) {
          throw this.#error(error, operation);
        }
      })(),
    );
  }

  async #track<T>(work: Promise<T>): Promise<T> {
    this.#inFlight.add(work);
    try {
      return await work;
    } finally {
      this.#inFlight.delete(work);
    }
  }

  #rejected(envelope: Envelope, error: unknown): CourierError {
    const detail = driverMessage(error);
    return new TransportError(`the database refused message '${envelope.messageId}': ${detail}`, { code: 'PUBLISH_REJECTED', cause: error });
  }

  #error(error: unknown, operation: string): CourierError {
    return toTransportError(error, operation, this.#names);
  }
}

/** Turns a driver error into a `TransportError`: retriable for connectivity and lock conflicts, `SCHEMA_MISSING` with the remedy. */
function toTransportError(error: unknown, operation: string, names: QueueTableNames): CourierError {
  if (error instanceof CourierError) return error;
  const detail = driverMessage(error);
  switch (classifyDriverError(error)) {
    case 'transient':
      return new TransportError(`sql transport '${operation}' failed, a retry may succeed: ${detail}`, { cause: error, retriable: true });
    case 'schema':
      return new TransportError(
        `sql transport '${operation}' failed: the queue table '${names.queue}' or '${names.groups}' is missing (${detail}); create it with \`await transport.ensureSchema()\` or run \`transport.schemaStatements()\` in a migration`,
        { cause: error, code: 'SCHEMA_MISSING', retriable: false },
      );
    default:
      return new TransportError(`sql transport '${operation}' failed: ${detail}`, { cause: error, retriable: false });
  }
}

/** `reason_code` and `reason_message` of a dead row: the reason bounded and sanitised (`boundReason`). */
function deadReasonColumns(reason: DeadLetterReason | undefined): [string, string] {
  const bounded = boundReason(reason ?? { code: 'UNKNOWN', message: '' });
  return [bounded.code, bounded.message];
}

function encodeBody(envelope: Envelope): string {
  const record: Record<string, unknown> = {};
  for (const field of ENVELOPE_FIELDS) record[field] = envelope[field];
  return JSON.stringify(record);
}

function decodeBody(body: unknown): Envelope {
  const text = toNullableString(body);
  if (text === null) throw new TransportError('a queue row has no body', { code: 'ENVELOPE_INVALID', retriable: false });
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new TransportError(`a queue row's body is not JSON: ${String(error)}`, { code: 'ENVELOPE_INVALID', retriable: false, cause: error });
  }
  return decodeEnvelope(parsed);
}

interface SubscriptionConfig {
  readonly endpoint: Endpoint;
  readonly handler: DeliveryHandler;
  readonly runner: SqlRunner;
  readonly dialect: QueueDialect;
  readonly leaseMs: number;
  readonly pollIntervalMs: number;
  readonly logger: Logger;
  readonly onClosed: (subscription: QueueSubscription) => void;
}

/** A claimed row being handled: its lease id fences every settle. */
interface Held {
  readonly seq: string;
  readonly owner: string;
}

/**
 * One subscription's claim loop: claims as many due rows as it has free handler slots,
 * hands each to the handler, renews the leases of those in flight, and sleeps until a
 * wake-up, a freed slot, a local retry coming due, or the poll interval.
 */
class QueueSubscription implements Subscription {
  readonly #config: SubscriptionConfig;
  readonly #held = new Map<string, Held>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #stopping = false;
  #wake: (() => void) | undefined;
  #wakePending = false;
  #loop: Promise<void> | undefined;
  #renewTimer: NodeJS.Timeout | undefined;
  #unwatch: (() => Promise<void>) | undefined;
  #closing: Promise<void> | undefined;

  constructor(config: SubscriptionConfig) {
    this.#config = config;
  }

  async start(wakeups: OutboxWakeups): Promise<void> {
    this.#unwatch = await wakeups.watch(() => this.#signal());
    this.#loop = this.#run();
    const every = Math.max(50, Math.floor(this.#config.leaseMs / 3));
    this.#renewTimer = setInterval(() => void this.#renew(), every);
    this.#renewTimer.unref();
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stopping = true;
      this.#signal();
      for (const timer of this.#timers) clearTimeout(timer);
      this.#timers.clear();
      await this.#loop;
      while (this.#handlers.size > 0) await Promise.allSettled([...this.#handlers]);
      if (this.#renewTimer) clearInterval(this.#renewTimer);
      await this.#unwatch?.();
      this.#config.onClosed(this);
    })();
    return this.#closing;
  }

  #signal(): void {
    this.#wakePending = true;
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  async #sleep(ms: number): Promise<void> {
    if (this.#wakePending || this.#stopping) {
      this.#wakePending = false;
      return;
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
    this.#wakePending = false;
  }

  async #run(): Promise<void> {
    const { endpoint, dialect, runner, leaseMs, pollIntervalMs, logger } = this.#config;
    let backoff = ERROR_BACKOFF_MIN_MS;
    while (!this.#stopping) {
      const free = endpoint.concurrency - this.#handlers.size;
      if (free <= 0) {
        await this.#sleep(pollIntervalMs);
        continue;
      }
      let rows: SqlRow[];
      const owner = randomUUID();
      try {
        // Cleared before the claim: a signal during it means there may be more to claim.
        this.#wakePending = false;
        rows = await dialect.claim(runner, { consumer: endpoint.consumer, limit: free, leaseMs, owner, ordered: endpoint.ordered });
        backoff = ERROR_BACKOFF_MIN_MS;
      } catch (error) {
        logger.warn('courier sql transport: claim failed, retrying', { consumer: endpoint.consumer, error: describeError(error) });
        await this.#sleep(backoff);
        backoff = Math.min(ERROR_BACKOFF_MAX_MS, backoff * 2);
        continue;
      }
      rows.sort((a, b) => Number(BigInt(String(a['seq'])) - BigInt(String(b['seq']))));
      for (const row of rows) this.#dispatch(row, owner);
      if (rows.length < free) await this.#sleep(pollIntervalMs);
    }
  }

  #dispatch(row: SqlRow, owner: string): void {
    const seq = String(row['seq']);
    const held: Held = { seq, owner };
    this.#held.set(seq, held);
    const attempt = toNumber(row['attempt']);
    let envelope: Envelope;
    try {
      envelope = decodeBody(row['body']);
    } catch (error) {
      const reason = { code: 'ENVELOPE_INVALID', message: error instanceof Error ? error.message : String(error) };
      const running = this.#settle(held, 'dead', reason).then(
        () => undefined,
        (failure: unknown) => this.#config.logger.warn('courier sql transport: dead-lettering an invalid row failed', { seq, error: describeError(failure) }),
      );
      this.#trackHandler(running, seq);
      return;
    }
    let settled = false;
    // A settle that failed settled nothing: the row is still held under this lease, so a
    // later settle (the core's retry after it) is taken; left unsettled, the row comes back
    // once the lease runs out (it is no longer renewed once the handler returned).
    const once = async (work: () => Promise<void>): Promise<void> => {
      if (settled) return;
      settled = true;
      try {
        await work();
      } catch (error) {
        settled = false;
        throw error;
      }
    };
    const delivery: Delivery = {
      envelope,
      attempt,
      replayed: toNumber(row['replayed']) === 1,
      // Claimed before without a settle (its lease ran out: the instance died or stalled);
      // a retry resets the count, so a retried copy is a first delivery of its attempt.
      redelivered: toNumber(row['claims']) > 1,
      ack: () => once(() => this.#settle(held, 'ack')),
      retry: (delayMs, reason) => once(() => this.#settle(held, 'retry', reason, delayMs)),
      deadLetter: (reason) => once(() => this.#settle(held, 'dead', reason)),
    };
    const running = (async () => {
      try {
        await this.#config.handler(delivery);
      } catch (error) {
        // The core settles handler failures itself; a rejection here is a bug upstream or a failed settle.
        this.#config.logger.warn('courier sql transport: delivery handler rejected', { seq, error: describeError(error) });
      }
    })();
    this.#trackHandler(running, seq);
  }

  #trackHandler(running: Promise<void>, seq: string): void {
    this.#handlers.add(running);
    void running.finally(() => {
      this.#handlers.delete(running);
      this.#held.delete(seq);
      this.#signal();
    });
  }

  /** Settles a held row, fenced on its lease id: a stale holder (its row claimed again) changes nothing. */
  async #settle(held: Held, how: 'ack' | 'retry' | 'dead', reason?: DeadLetterReason, delayMs = 0): Promise<void> {
    const { dialect, runner } = this.#config;
    const queue = dialect.table('queue');
    try {
      let affected: number;
      if (how === 'ack') {
        affected = (await runner.run(`DELETE FROM ${queue} WHERE seq = ? AND lease_owner = ?`, [held.seq, held.owner])).affectedRows;
      } else if (how === 'retry') {
        const delay = Math.max(0, Math.round(delayMs));
        // `replayed` stays: a replay's retries are still the replay (the consumer records its
        // run under the replay's key; an unmarked copy would be taken for a relay duplicate).
        affected = (
          await runner.run(
            `UPDATE ${queue} SET attempt = attempt + 1, lease_owner = NULL, claims = 0, available_at = ${dialect.plusMs(dialect.now)} WHERE seq = ? AND lease_owner = ?`,
            [delay, held.seq, held.owner],
          )
        ).affectedRows;
        if (affected > 0) this.#wakeAfter(delay);
      } else {
        affected = (
          await runner.run(
            `UPDATE ${queue} SET state = 'dead', lease_owner = NULL, reason_code = ?, reason_message = ?, dead_at = ${dialect.now} WHERE seq = ? AND lease_owner = ?`,
            // Bounded again here: the row stays leased for ever if this write fails (PostgreSQL text
            // cannot hold U+0000; MariaDB TEXT holds 64 KiB), and not every reason comes from the core.
            [...deadReasonColumns(reason), held.seq, held.owner],
          )
        ).affectedRows;
      }
      if (affected === 0) {
        // The lease ran out and another instance claimed the row: it handles the message
        // again (the inbox drops the copy), so this settle has nothing left to do.
        this.#config.logger.warn('courier sql transport: a settle found its lease taken over; the row is redelivered', { seq: held.seq, settle: how });
      }
    } catch (error) {
      const detail = driverMessage(error);
      throw new TransportError(`sql transport could not ${how === 'dead' ? 'dead-letter' : how} row ${held.seq}: ${detail}; it will be redelivered after its lease`, {
        cause: error,
        retriable: true,
      });
    }
  }

  #wakeAfter(delayMs: number): void {
    if (this.#stopping) return;
    const timer = setTimeout(() => {
      this.#timers.delete(timer);
      this.#signal();
    }, delayMs + 5);
    timer.unref();
    this.#timers.add(timer);
  }

  async #renew(): Promise<void> {
    if (this.#stopping && this.#held.size === 0) return;
    const held = [...this.#held.values()];
    if (held.length === 0) return;
    const { dialect, runner, leaseMs, logger } = this.#config;
    try {
      await runner.run(
        `UPDATE ${dialect.table('queue')} SET available_at = ${dialect.plusMs(dialect.now)} WHERE state = 'pending' AND seq IN (?) AND lease_owner IN (?)`,
        [leaseMs, held.map((item) => item.seq), [...new Set(held.map((item) => item.owner))]],
      );
    } catch (error) {
      logger.warn('courier sql transport: lease renewal failed; deliveries may be handed to another instance', { error: describeError(error) });
    }
  }
}
