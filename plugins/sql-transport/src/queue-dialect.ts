import { createHash } from 'node:crypto';
import { ConfigError } from '@courier/core';
import type { DialectName, SqlExecutor, SqlRow, TransactionPrologue } from '@courier/sql-engine';
import { SQLITE_BUSY_TIMEOUT_MS } from '@courier/sql-engine';

/** The names of the transport's tables (unquoted). */
export interface QueueTableNames {
  readonly prefix: string;
  readonly schema: string | undefined;
  /** One row per (consumer group, message): the queue itself, dead letters included. */
  readonly queue: string;
  /** Which consumer groups receive which topics (written by `subscribe`). */
  readonly groups: string;
  /** PostgreSQL: the LISTEN/NOTIFY channel of this queue. */
  readonly channel: string;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MAX_PREFIX = 32;

/** Resolves and validates the table names; throws a `ConfigError` listing every problem. */
export function resolveQueueNames(config: { tablePrefix?: string; schema?: string }): QueueTableNames {
  const prefix = config.tablePrefix ?? 'courier_';
  const problems: string[] = [];
  if (!IDENTIFIER.test(prefix)) {
    problems.push(`'tablePrefix' must start with a letter or '_' and contain only letters, digits and '_', got ${JSON.stringify(prefix)}`);
  }
  if (prefix.length > MAX_PREFIX) problems.push(`'tablePrefix' is longer than ${MAX_PREFIX} characters`);
  if (config.schema !== undefined && !IDENTIFIER.test(config.schema)) {
    problems.push(`'schema' must be a plain identifier (letters, digits, '_'), got ${JSON.stringify(config.schema)}`);
  }
  if (problems.length > 0) throw new ConfigError(problems);
  // PostgreSQL truncates channel names to 63 bytes; a hash keeps distinct queues apart.
  const digest = createHash('sha256').update(`${config.schema ?? ''}.${prefix}queue`).digest('hex');
  return { prefix, schema: config.schema, queue: `${prefix}queue`, groups: `${prefix}queue_groups`, channel: `courier_q_${digest.slice(0, 16)}` };
}

/** A row of the queue to insert. */
export interface QueueInsert {
  readonly consumer: string;
  readonly topic: string;
  readonly messageId: string;
  readonly keyHash: string | null;
  readonly body: string;
}

/** What a claim asks for. */
export interface QueueClaim {
  readonly consumer: string;
  readonly limit: number;
  readonly leaseMs: number;
  /** The claim's unique lease id (written to `lease_owner`; every settle is fenced on it). */
  readonly owner: string;
  /** Head of key only: no earlier pending row of the same (topic, key) for this consumer. */
  readonly ordered: boolean;
}

/** Columns a claim and a dead-letter listing return. */
export const QUEUE_COLUMNS = 'seq, body, attempt, replayed, claims';

/**
 * What differs between PostgreSQL, MySQL/MariaDB and SQLite for the queue. Every time
 * comparison reads the database's clock, never the application's.
 */
export interface QueueDialect {
  readonly name: DialectName;
  /** Quoted, schema-qualified table name. */
  table(name: 'queue' | 'groups'): string;
  readonly now: string;
  /** `expression` plus `?` milliseconds (one placeholder). */
  plusMs(expression: string): string;
  /** `expression` (a timestamp) as epoch milliseconds. */
  epochMs(expression: string): string;
  readonly readCommitted: boolean;
  readonly transactionPrologue?: TransactionPrologue;
  prepareDatabase?<Tx>(runner: SqlExecutor<Tx>): Promise<void>;
  schemaStatements(): string[];
  dropStatements(): string[];
  /** `INSERT` of the (consumer, topic) pair that does nothing when it exists. */
  readonly registerGroupSql: string;
  /** Claims due rows: locks them `SKIP LOCKED` where the database has it, writes the lease, returns {@link QUEUE_COLUMNS}. */
  claim<Tx>(runner: SqlExecutor<Tx>, query: QueueClaim): Promise<SqlRow[]>;
  /** Deletes at most `?` (second placeholder) dead rows of every consumer older than `?` ms (first placeholder). */
  readonly pruneDeadSql: string;
}

/** Hash of a (topic, key) pair: the head-of-key probe compares it (one fixed-width indexed column). */
export function queueKeyHash(topic: string, key: string | null): string | null {
  if (key === null) return null;
  return createHash('sha256').update(topic).update('\u0000').update(key).digest('hex').slice(0, 32);
}

function candidatesSql(dialect: Pick<QueueDialect, 'table' | 'now'>, columns: string, ordered: boolean, lockSuffix: string): string {
  const queue = dialect.table('queue');
  return (
    `SELECT ${columns} FROM ${queue} q WHERE q.consumer = ? AND q.state = 'pending' AND q.available_at <= ${dialect.now}` +
    // Head of key: no earlier row of the key still pending (due, in flight or waiting for a
    // retry) for this consumer. Dead rows do not hold a key; keyless rows have a NULL hash.
    (ordered ? ` AND NOT EXISTS (SELECT 1 FROM ${queue} e WHERE e.consumer = q.consumer AND e.key_hash = q.key_hash AND e.state = 'pending' AND e.seq < q.seq)` : '') +
    ` ORDER BY q.available_at, q.seq LIMIT ?${lockSuffix}`
  );
}

/**
 * PostgreSQL: one statement per claim (candidates locked `FOR UPDATE SKIP LOCKED`, lease
 * written, rows returned); partial indexes over pending and dead rows.
 */
class PostgresQueueDialect implements QueueDialect {
  readonly name = 'postgresql' as const;
  readonly now = 'now()';
  readonly readCommitted = false;
  readonly #names: QueueTableNames;

  constructor(names: QueueTableNames) {
    this.#names = names;
  }

  table(name: 'queue' | 'groups'): string {
    const quoted = `"${this.#names[name]}"`;
    return this.#names.schema === undefined ? quoted : `"${this.#names.schema}".${quoted}`;
  }

  plusMs(expression: string): string {
    return `(${expression} + (?::float8 * interval '1 millisecond'))`;
  }

  epochMs(expression: string): string {
    return `floor(extract(epoch from ${expression}) * 1000)`;
  }

  get registerGroupSql(): string {
    return `INSERT INTO ${this.table('groups')} (consumer, topic) VALUES (?, ?) ON CONFLICT DO NOTHING`;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const queue = this.table('queue');
    const ix = (suffix: string) => `"${n.queue}_${suffix}"`;
    return [
      ...(n.schema === undefined ? [] : [`CREATE SCHEMA IF NOT EXISTS "${n.schema}"`]),
      `CREATE TABLE IF NOT EXISTS ${queue} (
        seq bigserial PRIMARY KEY,
        consumer varchar(200) NOT NULL,
        topic varchar(249) NOT NULL,
        message_id varchar(200) NOT NULL,
        key_hash char(32),
        body text NOT NULL,
        state varchar(7) NOT NULL DEFAULT 'pending',
        available_at timestamptz NOT NULL,
        attempt integer NOT NULL DEFAULT 1,
        claims integer NOT NULL DEFAULT 0,
        replayed smallint NOT NULL DEFAULT 0,
        lease_owner varchar(64),
        reason_code varchar(200),
        reason_message text,
        dead_at timestamptz
      )`,
      // The claim's range scan per consumer: due pending rows in claim order.
      `CREATE INDEX IF NOT EXISTS ${ix('due_ix')} ON ${queue} (consumer, available_at, seq) WHERE state = 'pending'`,
      // The head-of-key probe of ordered claims.
      `CREATE INDEX IF NOT EXISTS ${ix('key_ix')} ON ${queue} (consumer, key_hash, seq) WHERE state = 'pending'`,
      `CREATE INDEX IF NOT EXISTS ${ix('dead_ix')} ON ${queue} (consumer, dead_at) WHERE state = 'dead'`,
      `CREATE TABLE IF NOT EXISTS ${this.table('groups')} (consumer varchar(200) NOT NULL, topic varchar(249) NOT NULL, PRIMARY KEY (topic, consumer))`,
    ];
  }

  dropStatements(): string[] {
    return [`DROP TABLE IF EXISTS ${this.table('queue')}`, `DROP TABLE IF EXISTS ${this.table('groups')}`];
  }

  async claim<Tx>(runner: SqlExecutor<Tx>, query: QueueClaim): Promise<SqlRow[]> {
    const queue = this.table('queue');
    return runner.all(
      `WITH candidates AS (${candidatesSql(this, 'q.seq', query.ordered, ' FOR UPDATE OF q SKIP LOCKED')}) ` +
        `UPDATE ${queue} u SET lease_owner = ?, claims = u.claims + 1, available_at = ${this.plusMs('now()')} FROM candidates WHERE u.seq = candidates.seq ` +
        `RETURNING u.seq, u.body, u.attempt, u.replayed, u.claims`,
      [query.consumer, query.limit, query.owner, query.leaseMs],
    );
  }

  get pruneDeadSql(): string {
    const queue = this.table('queue');
    return (
      `DELETE FROM ${queue} WHERE ctid = ANY (ARRAY(SELECT ctid FROM ${queue} WHERE state = 'dead' AND dead_at < (now() - (?::float8 * interval '1 millisecond')) ` +
      `LIMIT ? FOR UPDATE SKIP LOCKED))`
    );
  }
}

/**
 * MariaDB 10.6+ / MySQL 8: `SELECT … FOR UPDATE SKIP LOCKED` then `UPDATE … WHERE seq IN`
 * in one short READ COMMITTED transaction (no `UPDATE … RETURNING`, and no UPDATE that
 * selects from its own table). Names compared in keys are `VARBINARY` (byte for byte, no
 * PAD SPACE), times `DATETIME(3)` in UTC.
 */
class MySqlQueueDialect implements QueueDialect {
  readonly name = 'mysql' as const;
  readonly now = 'UTC_TIMESTAMP(3)';
  readonly readCommitted = true;
  readonly #names: QueueTableNames;

  constructor(names: QueueTableNames) {
    this.#names = names;
  }

  table(name: 'queue' | 'groups'): string {
    const quoted = `\`${this.#names[name]}\``;
    return this.#names.schema === undefined ? quoted : `\`${this.#names.schema}\`.${quoted}`;
  }

  plusMs(expression: string): string {
    return `TIMESTAMPADD(MICROSECOND, ? * 1000, ${expression})`;
  }

  epochMs(expression: string): string {
    return `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ${expression}) DIV 1000)`;
  }

  get registerGroupSql(): string {
    return `INSERT IGNORE INTO ${this.table('groups')} (consumer, topic) VALUES (?, ?)`;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const ascii = 'CHARACTER SET ascii COLLATE ascii_bin';
    const ix = (suffix: string) => `\`${n.queue}_${suffix}\``;
    return [
      ...(n.schema === undefined ? [] : [`CREATE DATABASE IF NOT EXISTS \`${n.schema}\``]),
      `CREATE TABLE IF NOT EXISTS ${this.table('queue')} (
        seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        consumer VARBINARY(800) NOT NULL,
        topic VARBINARY(996) NOT NULL,
        message_id VARBINARY(800) NOT NULL,
        key_hash CHAR(32) ${ascii} NULL,
        body LONGTEXT NOT NULL,
        state VARCHAR(7) ${ascii} NOT NULL DEFAULT 'pending',
        available_at DATETIME(3) NOT NULL,
        attempt INT NOT NULL DEFAULT 1,
        claims INT NOT NULL DEFAULT 0,
        replayed TINYINT NOT NULL DEFAULT 0,
        lease_owner VARCHAR(64) ${ascii} NULL,
        reason_code VARCHAR(200) NULL,
        reason_message TEXT NULL,
        dead_at DATETIME(3) NULL,
        KEY ${ix('due_ix')} (consumer, state, available_at, seq),
        KEY ${ix('key_ix')} (consumer, key_hash, state, seq),
        KEY ${ix('dead_ix')} (state, dead_at)
      ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
      `CREATE TABLE IF NOT EXISTS ${this.table('groups')} (
        consumer VARBINARY(800) NOT NULL,
        topic VARBINARY(996) NOT NULL,
        PRIMARY KEY (topic, consumer)
      ) ENGINE=InnoDB`,
    ];
  }

  dropStatements(): string[] {
    return [`DROP TABLE IF EXISTS ${this.table('queue')}`, `DROP TABLE IF EXISTS ${this.table('groups')}`];
  }

  async claim<Tx>(runner: SqlExecutor<Tx>, query: QueueClaim): Promise<SqlRow[]> {
    return runner.transaction(
      async (trx) => {
        const rows = await runner.all(candidatesSql(this, `q.${QUEUE_COLUMNS.split(', ').join(', q.')}`, query.ordered, ' FOR UPDATE SKIP LOCKED'), [query.consumer, query.limit], trx);
        if (rows.length > 0) {
          await runner.run(
            `UPDATE ${this.table('queue')} SET lease_owner = ?, claims = claims + 1, available_at = ${this.plusMs(this.now)} WHERE seq IN (?)`,
            [query.owner, query.leaseMs, rows.map((row) => String(row['seq']))],
            trx,
          );
        }
        // The rows were read before the update: report the claim count as it now stands, as the other dialects' RETURNING does.
        return rows.map((row) => ({ ...row, claims: Number(row['claims']) + 1 }));
      },
      { readCommitted: true },
    );
  }

  get pruneDeadSql(): string {
    // A range on (state, dead_at), stopped by LIMIT; READ COMMITTED locks only the deleted rows.
    return `DELETE FROM ${this.table('queue')} WHERE state = 'dead' AND dead_at < TIMESTAMPADD(MICROSECOND, -(? * 1000), UTC_TIMESTAMP(3)) LIMIT ?`;
  }
}

// How long a statement waits for another connection's write lock before SQLITE_BUSY is the
// store's (SQLITE_BUSY_TIMEOUT_MS: wait, never fail). The libsql driver waits synchronously:
// in one process, give every Courier part one ORM (one connection), so none waits for a lock
// its own process holds.
const SQLITE_NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/**
 * SQLite (`@mikro-orm/libsql`), one file shared by several processes: WAL mode, and every
 * transaction takes the write lock with its first statement (so it never has to upgrade a
 * read snapshot, which fails at once with `SQLITE_BUSY`) and waits up to 30 s for it; a
 * transaction that still lost is retried whole (`BusyRetryRunner`). SQLite has one writer at a time, so no row locks are needed. Times
 * are INTEGER milliseconds since the epoch.
 */
class SqliteQueueDialect implements QueueDialect {
  readonly name = 'sqlite' as const;
  readonly now = SQLITE_NOW_MS;
  readonly readCommitted = false;
  readonly transactionPrologue: TransactionPrologue;
  readonly #names: QueueTableNames;

  constructor(names: QueueTableNames) {
    this.#names = names;
    this.transactionPrologue = {
      session: [`PRAGMA busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`],
      writeLock: [`DELETE FROM ${this.table('groups')} WHERE 0`],
    };
  }

  async prepareDatabase<Tx>(runner: SqlExecutor<Tx>): Promise<void> {
    // The busy timeout on every connection of the ORM (the store's dialect does the same):
    // libsql opens connections without one, and the ORM replaces its connection every 10 s.
    await runner.configureEveryConnection?.();
    const mode = String((await runner.untransacted('PRAGMA journal_mode'))[0]?.['journal_mode'] ?? '').toLowerCase();
    if (mode === 'wal' || mode === 'memory' || mode === '') return;
    // Persistent in the file: the first process to get here switches it for all.
    await runner.untransacted('PRAGMA journal_mode = WAL').catch(() => undefined);
  }

  table(name: 'queue' | 'groups'): string {
    return `"${this.#names[name]}"`;
  }

  plusMs(expression: string): string {
    return `(${expression} + ?)`;
  }

  epochMs(expression: string): string {
    return expression;
  }

  get registerGroupSql(): string {
    return `INSERT OR IGNORE INTO ${this.table('groups')} (consumer, topic) VALUES (?, ?)`;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const queue = this.table('queue');
    const ix = (suffix: string) => `"${n.queue}_${suffix}"`;
    return [
      `CREATE TABLE IF NOT EXISTS ${queue} (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        consumer TEXT NOT NULL,
        topic TEXT NOT NULL,
        message_id TEXT NOT NULL,
        key_hash TEXT,
        body TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        available_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        claims INTEGER NOT NULL DEFAULT 0,
        replayed INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        reason_code TEXT,
        reason_message TEXT,
        dead_at INTEGER
      )`,
      `CREATE INDEX IF NOT EXISTS ${ix('due_ix')} ON ${queue} (consumer, available_at, seq) WHERE state = 'pending'`,
      `CREATE INDEX IF NOT EXISTS ${ix('key_ix')} ON ${queue} (consumer, key_hash, seq) WHERE state = 'pending'`,
      `CREATE INDEX IF NOT EXISTS ${ix('dead_ix')} ON ${queue} (consumer, dead_at) WHERE state = 'dead'`,
      `CREATE TABLE IF NOT EXISTS ${this.table('groups')} (consumer TEXT NOT NULL, topic TEXT NOT NULL, PRIMARY KEY (topic, consumer))`,
    ];
  }

  dropStatements(): string[] {
    return [`DROP TABLE IF EXISTS ${this.table('queue')}`, `DROP TABLE IF EXISTS ${this.table('groups')}`];
  }

  async claim<Tx>(runner: SqlExecutor<Tx>, query: QueueClaim): Promise<SqlRow[]> {
    // A read first, without the write lock (WAL readers never wait): an idle subscription's
    // polls then do not queue with every other process's writers for the file's one lock.
    const due = await runner.transaction(
      (trx) => runner.all(`SELECT 1 AS due FROM ${this.table('queue')} WHERE consumer = ? AND state = 'pending' AND available_at <= ${SQLITE_NOW_MS} LIMIT 1`, [query.consumer], trx),
      { writeLock: false },
    );
    if (due.length === 0) return [];
    return runner.all(
      `UPDATE ${this.table('queue')} SET lease_owner = ?, claims = claims + 1, available_at = ${this.plusMs(SQLITE_NOW_MS)} ` +
        `WHERE seq IN (${candidatesSql(this, 'q.seq', query.ordered, '')}) RETURNING ${QUEUE_COLUMNS}`,
      [query.owner, query.leaseMs, query.consumer, query.limit],
    );
  }

  get pruneDeadSql(): string {
    const queue = this.table('queue');
    return `DELETE FROM ${queue} WHERE seq IN (SELECT seq FROM ${queue} WHERE state = 'dead' AND dead_at < (${SQLITE_NOW_MS} - ?) LIMIT ?)`;
  }
}

/** Builds the queue adapter of a SQL family. */
export function createQueueDialect(name: DialectName, names: QueueTableNames): QueueDialect {
  switch (name) {
    case 'postgresql':
      return new PostgresQueueDialect(names);
    case 'mysql':
      return new MySqlQueueDialect(names);
    case 'sqlite':
      if (names.schema !== undefined) throw new ConfigError(`'schema' is not supported on SQLite, got ${JSON.stringify(names.schema)}`);
      return new SqliteQueueDialect(names);
  }
}
