import type { CourierTableNames } from '../courier-tables.js';
import { toNullableString, type SqlRow, type SqlExecutor, type TransactionPrologue } from '../executor.js';

/** The SQL families Courier has adapters for. */
export type DialectName = 'postgresql' | 'mysql' | 'sqlite';

/**
 * The schema version this release writes and expects in the meta table.
 * 2: MySQL/MariaDB id columns compare byte for byte (no PAD SPACE); elsewhere unchanged.
 * 3: the inbox halt tables (`inbox_halts`, `inbox_held`, `inbox_parked`; see `inbox-halts-sql.ts`).
 * 4: MySQL/MariaDB outbox `state` is an ENUM and `published_at` is never NULL, so the
 *    completion rewrites its rows in place (see `mysql-dialect.ts`); elsewhere unchanged.
 * 5: outbox `error_code`, `error_name` and `first_failed_at` (see {@link failureColumnsSql}),
 *    so dead rows can be selected by code; rows failed before it read them as NULL (unknown).
 * 6: outbox `first_due_at` (see {@link firstDueColumnSql}): when a row first became due, so
 *    `stats().oldestPendingAgeMs` counts a row in a retry's backoff from then, not as 0.
 * 7: outbox `leased_until` (see {@link leasedUntilColumnSql}): a claim writes its lease there
 *    and leaves `available_at` (a key of the due index) as it was, so on PostgreSQL the lease
 *    is a HOT update (no index entry, the new version on the same page: the table's
 *    fill factor leaves room for it); PostgreSQL's outbox gets `fillfactor = 50`.
 */
export const SCHEMA_VERSION = 7;

/** Envelope and bookkeeping columns returned for claimed and listed rows. */
export const ROW_COLUMNS = [
  'seq',
  'message_id',
  'message_type',
  'message_version',
  'topic',
  'msg_key',
  'occurred_at',
  'correlation_id',
  'causation_id',
  'traceparent',
  'tracestate',
  'headers',
  'payload',
  'attempts',
] as const;

/** Options of a claim, validated by the store. */
export interface ClaimQuery {
  readonly owner: string;
  readonly limit: number;
  readonly leaseMs: number;
}

/**
 * What a completion does with the rows it completes (`MikroOrmOutboxStoreConfig.publishedRows`):
 * `keep` marks them published (kept until `prune`), `delete` deletes them.
 */
export type PublishedRows = 'keep' | 'delete';

/** Rows a claim completes first (`completeAndClaim`): sequences and lease token as strings. */
export interface CompletionQuery<Tx = unknown> {
  readonly token: string;
  readonly sequences: readonly string[];
  /** Whether the completion marks its rows published or deletes them ({@link completeSql}). */
  readonly publishedRows: PublishedRows;
  /**
   * Run inside the claim's transaction after the completion and the claim, before COMMIT
   * (fault injection only). A dialect that otherwise needs no explicit transaction opens
   * one when this is set, so the statements are the same and only the commit is delayed.
   * `completedIds` are the message ids of the rows the completion changed: PostgreSQL
   * returns them from its one statement, the others read them with {@link completeRows}
   * (before the completion, as a `delete` completion leaves nothing to read after it).
   */
  readonly beforeCommit?: (trx: Tx, completedIds: readonly string[]) => Promise<void>;
}

/** Result of a claim: the fencing token and the claimed rows (any order). */
export interface ClaimResult {
  readonly token: bigint;
  readonly rows: readonly SqlRow[];
  /** Rows the completion changed, when one was asked for. */
  readonly completed?: number;
}

/**
 * What differs between databases. Everything else (the shape of the queries, the state
 * machine) lives in the stores, so each adapter stays small.
 *
 * Time: every expression reads the database's clock; `now` is fixed per statement (per
 * transaction on PostgreSQL), `insertNow` is the instant of the insert itself.
 */
export interface SqlDialect {
  readonly name: DialectName;
  /** Quoted, schema-qualified name of a Courier table (or sequence). */
  table(name: CourierObject): string;
  /** Quoted identifier (an index name, a column). */
  quote(identifier: string): string;
  /** The database clock, as stored in timestamp columns. */
  readonly now: string;
  /** The database clock at the moment of the insert (PostgreSQL: `clock_timestamp()`, not the transaction start). */
  readonly insertNow: string;
  /** `expression` plus `?` milliseconds (one placeholder). */
  plusMs(expression: string): string;
  /** Name of the two-argument maximum function (`GREATEST`, SQLite's scalar `MAX`). */
  readonly greatest: string;
  /**
   * Optional: the placeholder of an integer value in a SELECT list (the outbox insert's
   * `INSERT … SELECT ?, …`), where a driver that binds parameters (node-postgres) leaves
   * their type to the server, which takes an untyped parameter there as text
   * (PostgreSQL: `?::int4`). Default `?`.
   */
  readonly integerParam?: string;
  /** A timestamp from `?` milliseconds since the epoch (one placeholder). */
  readonly fromEpochMs: string;
  /** `expression` (a timestamp column or expression) as milliseconds since the epoch. */
  epochMs(expression: string): string;
  /** Row-locking suffix of the head-of-key SELECT (`FOR UPDATE SKIP LOCKED` where supported). */
  readonly lockSkipLocked: string;
  /** Row-locking suffix of a SELECT that waits for the rows (`FOR UPDATE`; empty where the transaction holds the only write lock). */
  readonly lockForUpdate: string;
  /**
   * Index hint after the head-of-key probe's alias in {@link headsSql} (MySQL/MariaDB: the
   * key index, see the MySQL dialect); absent where the planner keeps the probe on it itself.
   */
  readonly keyProbeHint?: string;
  /** Whether store transactions should run at READ COMMITTED (MySQL's default is stricter). */
  readonly readCommitted: boolean;
  /**
   * Statements that start every store transaction (see `SqlExecutor.prologue`); SQLite: the busy
   * timeout and an immediate write lock. Absent where transactions need no preparation.
   */
  readonly transactionPrologue?: TransactionPrologue;
  /**
   * Prepares the database file once per store, outside any transaction (SQLite: WAL mode,
   * which lets readers and one writer of several processes work side by side).
   */
  prepareDatabase?<Tx>(runner: SqlExecutor<Tx>): Promise<void>;
  /** Idempotent DDL creating every Courier table, index, sequence and seed row of this version. */
  schemaStatements(): string[];
  /**
   * Idempotent statements that bring tables created at schema version `from` (1 or more)
   * to {@link SCHEMA_VERSION}, without the version bump ({@link upgradeSql} adds it).
   * Absent when the tables of every version are the same.
   */
  upgradeStatements?(from: number): string[];
  /**
   * Whether `error`, thrown by one of {@link upgradeStatements}, says the change is already
   * there (SQLite and MySQL have no `ADD COLUMN IF NOT EXISTS`: a racing `ensureSchema()`
   * added the column first). Absent where every upgrade statement is idempotent by itself.
   */
  alreadyUpgraded?(error: unknown): boolean;
  /** Statements dropping every Courier object (migration `down`). */
  dropStatements(): string[];
  /**
   * Takes the transaction-scoped per-key locks for appends of these key hashes inside
   * `trx`, in a fixed order. The store calls it once per transaction, at commit, with
   * every key the transaction appended, so two appenders never deadlock on each other.
   */
  lockKeys<Tx>(runner: SqlExecutor<Tx>, trx: Tx, keyHashes: readonly string[]): Promise<void>;
  /**
   * The same locks as {@link lockKeys}, as a condition an `INSERT … SELECT … WHERE` can
   * carry, so the append takes them in its insert's own round trip. The condition is
   * always true and must be evaluated in full before the statement produces its first row
   * (so before any sequence value is drawn). Absent where the locks need a statement of
   * their own; `undefined` for an append of `rows` rows the dialect cannot write that way.
   */
  keyLockCondition?(keyHashes: readonly string[], rows: number): { readonly sql: string; readonly params: readonly unknown[] } | undefined;
  /**
   * Claims head-of-key rows (perKey 1) in the dialect's cheapest safe way; with `done`,
   * first completes those rows ({@link completeSql}) in the same transaction.
   */
  claimHeads<Tx>(runner: SqlExecutor<Tx>, query: ClaimQuery, done?: CompletionQuery<Tx>): Promise<ClaimResult>;
  /** Allocates the next fencing token inside `trx` (strictly increasing, never reused). */
  nextToken<Tx>(runner: SqlExecutor<Tx>, trx: Tx): Promise<bigint>;
  /** Inserts the inbox record inside `trx`; false when the pair is already recorded. Waits for a racing uncommitted insert. */
  insertInboxRecord<Tx>(runner: SqlExecutor<Tx>, trx: Tx, messageId: string, consumer: string): Promise<boolean>;
  /** Counts one start of (messageId, consumer) in a short transaction of its own; returns the total. */
  recordStart<Tx>(runner: SqlExecutor<Tx>, messageId: string, consumer: string): Promise<number>;
  /** Deletes at most `?` (second placeholder) rows of `table` whose `column` is older than `?` ms (first placeholder) and, when given, whose state is `published`. */
  pruneBatchSql(table: CourierObject, column: string, publishedOnly: boolean): string;
}

/** The Courier objects a dialect can name. */
export type CourierObject = 'outbox' | 'inbox' | 'inboxStarts' | 'inboxHalts' | 'inboxHeld' | 'inboxParked' | 'meta' | 'outboxLocks' | 'tokenSequence';

/** Context every dialect is built with. */
export interface DialectContext {
  readonly names: CourierTableNames;
}

/**
 * The claim's head-of-key candidate query, shared by every dialect (differences are
 * parameters). `completing`: a query of the sequences the same statement completes
 * (PostgreSQL's completion CTE, marking them published or deleting them), which count as
 * published although its snapshot predates the change and still shows them pending.
 */
export function headsSql(dialect: Pick<SqlDialect, 'table' | 'now' | 'keyProbeHint'>, columns: string, lockSuffix: string, completing?: string): string {
  const outbox = dialect.table('outbox');
  return (
    `SELECT ${columns} FROM ${outbox} o ` +
    `WHERE o.state = 'pending' AND o.available_at <= ${dialect.now} AND ${unleasedSql('o.', dialect.now)} ` +
    // Head of key: no earlier row of the same (topic, key) still pending (due, in flight or
    // scheduled) or halted. A published row and a row its completion deleted (publishedRows
    // 'delete') both fail that test, so either counts as published. Keyless rows have a NULL
    // hash, which equals nothing.
    `AND NOT EXISTS (SELECT 1 FROM ${outbox} e${dialect.keyProbeHint ?? ''} WHERE e.key_hash = o.key_hash AND e.state IN ('pending', 'halted') AND e.seq < o.seq` +
    `${completing === undefined ? '' : ` AND e.seq NOT IN (${completing})`}) ` +
    `ORDER BY o.available_at, o.seq LIMIT ?${lockSuffix}`
  );
}

/**
 * The row `alias` (`o.`, or '' unqualified) is under no live lease: never claimed, released,
 * failed, or its lease ran out (`leased_until` is the lease's end, schema version 7). With
 * `available_at <= now` and `state = 'pending'` it is due. `leased_until` is in no index, so the
 * claim's range scan on the due index meets the rows in flight and skips them by this test.
 */
export function unleasedSql(alias: string, now: string): string {
  return `(${alias}leased_until IS NULL OR ${alias}leased_until <= ${now})`;
}

/**
 * `complete`'s statement: completes the rows of `seq IN (?)` (first placeholder, a list) that
 * are still pending under lease token `?` (second), so a stale relay changes nothing. Both
 * forms take exactly the same rows (the same `WHERE`) and report them as affected rows, so
 * they count alike.
 * - `keep`: marks them published. The lease stays on published rows (which relay published
 *   them, for operators); only pending rows carry a live lease, so fencing is unaffected.
 * - `delete`: deletes them. The head-of-key probe ({@link headsSql}) asks only for earlier
 *   rows still pending or halted, so a row that is gone counts as published, as a row
 *   marked so does; dead and halted rows are never pending, so never deleted here.
 */
export function completeSql(dialect: Pick<SqlDialect, 'table' | 'now'>, publishedRows: PublishedRows): string {
  const where = `WHERE seq IN (?) AND state = 'pending' AND lease_token = ?`;
  return publishedRows === 'delete'
    ? `DELETE FROM ${dialect.table('outbox')} ${where}`
    : `UPDATE ${dialect.table('outbox')} SET state = 'published', published_at = ${dialect.now} ${where}`;
}

/** What {@link completeRows} did: the rows it completed, and their message ids when asked for. */
export interface CompletedRows {
  readonly count: number;
  /** Message ids of the completed rows in sequence order (only with `withIds`). */
  readonly ids?: readonly string[];
}

/**
 * Runs `done`'s completion inside `trx` (without one, as a statement of its own) ({@link completeSql}). With `withIds` (the fault hook
 * wants the completed rows' ids) it first reads and locks the rows the statement will take
 * — pending under the lease, in sequence order — so the ids are right in either mode: read
 * after a `delete` completion, the rows would be gone. Locked (`FOR UPDATE`, or SQLite's
 * write lock), no other transaction can change them in between, so they are exactly the
 * rows the statement then completes.
 */
export async function completeRows<Tx>(
  dialect: Pick<SqlDialect, 'table' | 'now' | 'lockForUpdate'>,
  runner: SqlExecutor<Tx>,
  done: Pick<CompletionQuery<Tx>, 'token' | 'sequences' | 'publishedRows'>,
  trx: Tx | undefined,
  withIds = false,
): Promise<CompletedRows> {
  if (done.sequences.length === 0) return withIds ? { count: 0, ids: [] } : { count: 0 };
  const params = [[...done.sequences], done.token];
  const ids = withIds
    ? (
        await runner.all(
          `SELECT message_id FROM ${dialect.table('outbox')} WHERE seq IN (?) AND state = 'pending' AND lease_token = ? ORDER BY seq${dialect.lockForUpdate}`,
          params,
          trx,
        )
      ).map((row) => String(toNullableString(row['message_id'])))
    : undefined;
  const count = (await runner.run(completeSql(dialect, done.publishedRows), params, trx)).affectedRows;
  return ids === undefined ? { count } : { count, ids };
}

/**
 * Everything that upgrades a schema found at version `from` to {@link SCHEMA_VERSION}: the
 * dialect's table changes, then the version bump (so a failed upgrade is retried whole).
 * Empty when there is nothing to do; every statement is idempotent.
 */
export function upgradeSql(dialect: Pick<SqlDialect, 'table' | 'upgradeStatements'>, from: number): string[] {
  if (from >= SCHEMA_VERSION) return [];
  return [
    ...(dialect.upgradeStatements?.(from) ?? []),
    `UPDATE ${dialect.table('meta')} SET value = ${SCHEMA_VERSION} WHERE name = 'schema_version' AND value < ${SCHEMA_VERSION}`,
  ];
}

/**
 * The claimed row's age, `age_ms`: milliseconds since it became due on the database clock,
 * read before the claim writes its lease. Due is the later of the insert (`created_at`) and
 * {@link dueAtSql} (the delay or `notBefore`, a retry's backoff, a release, a replay, an
 * expired lease), as `stats().oldestPendingAgeMs` counts.
 */
export function ageSql(dialect: Pick<SqlDialect, 'now' | 'epochMs' | 'greatest'>, alias: string): string {
  return `(${dialect.epochMs(dialect.now)} - ${dialect.epochMs(`${dialect.greatest}(${alias}.created_at, ${dueAtSql(`${alias}.`)})`)}) AS age_ms`;
}

/**
 * When the row `alias` (`o.`, or '') became due last: the end of its last lease while it has
 * one (a row whose lease ran out is due again from then), else `available_at`. A row under a
 * lease was claimed while due, so its `leased_until` is never before its `available_at`; the
 * value is the one schema version 6 kept in `available_at` itself. `COALESCE`, not the
 * maximum function: MySQL's `GREATEST` and SQLite's `MAX` return NULL for a NULL argument.
 */
export function dueAtSql(alias: string): string {
  return `COALESCE(${alias}leased_until, ${alias}available_at)`;
}

/**
 * The version 5 outbox columns, as `name type` for CREATE TABLE and ADD COLUMN: the last
 * failure's code and error class name (bounded by core's `FAILURE_DETAIL_LIMITS`), and when
 * the row first failed since it was appended or replayed. All nullable: NULL is unknown.
 */
export function failureColumnsSql(types: { readonly text64: string; readonly text200: string; readonly timestamp: string }): string[] {
  return [`error_code ${types.text64}`, `error_name ${types.text200}`, `first_failed_at ${types.timestamp}`];
}

/**
 * The version 6 outbox column, as `name type`: when the row first became due (its insert,
 * or its delay/notBefore), kept while it is retried or released and reset by a replay.
 * Nullable: a row written without it counts from the later of its insert and `available_at`.
 */
export function firstDueColumnSql(timestamp: string): string {
  return `first_due_at ${timestamp}`;
}

/**
 * The version 6 upgrade's backfill: rows that were failing or under a lease when the schema
 * was upgraded get their insert time as first due (their `available_at` already moved to a
 * backoff's end or a lease's expiry, so nothing better is known; a delay such a row had is
 * counted as age). Rows never claimed keep NULL, which reads as exactly when they are due.
 * Idempotent (only NULLs), and it touches only those pending rows.
 */
export function firstDueBackfillSql(dialect: Pick<SqlDialect, 'table'>): string {
  return `UPDATE ${dialect.table('outbox')} SET first_due_at = created_at WHERE state = 'pending' AND first_due_at IS NULL AND (attempts > 0 OR lease_token IS NOT NULL)`;
}

/**
 * The version 7 outbox column, as `name type`: the end of the row's lease, written by a claim
 * and a renewal, cleared (NULL) whenever the lease is (release, failure, replay). Nullable: a
 * row never claimed has none.
 */
export function leasedUntilColumnSql(timestamp: string): string {
  return `leased_until ${timestamp}`;
}

/**
 * The version 7 upgrade's backfill: a row leased under version 6 (pending, with a token, its
 * `available_at` moved to the lease's end and still in the future) gets that end as
 * `leased_until`, so it is neither claimed again before its lease ends nor lost: once the
 * lease ends it is due again (its `available_at` is then in the past). A lease that had ended
 * already needs nothing (the row is due). Idempotent (only NULLs).
 */
export function leaseBackfillSql(dialect: Pick<SqlDialect, 'table' | 'now'>): string {
  return `UPDATE ${dialect.table('outbox')} SET leased_until = available_at WHERE state = 'pending' AND lease_token IS NOT NULL AND leased_until IS NULL AND available_at > ${dialect.now}`;
}

/** `o.`-qualified row columns. */
export function qualifiedColumns(alias: string): string {
  return ROW_COLUMNS.map((column) => `${alias}.${column}`).join(', ');
}
