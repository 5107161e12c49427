import type { CourierTableNames } from '../courier-tables.js';
import { classifyError, toBigInt, toNumber, type SqlExecutor } from '../executor.js';
import { haltSql } from './inbox-halts-sql.js';
import { ageSql, completeRows, failureColumnsSql, firstDueBackfillSql, firstDueColumnSql, headsSql, leaseBackfillSql, leasedUntilColumnSql, qualifiedColumns, SCHEMA_VERSION, type ClaimQuery, type ClaimResult, type CompletionQuery, type CourierObject, type SqlDialect } from './sql-dialect.js';

/**
 * Types of the columns compared in keys or `WHERE`s: binary strings, compared byte for
 * byte (see {@link MySqlDialect}). Four bytes per character of the envelope limits
 * (messageId and consumer 200, topic 249, key 1024), so every accepted value fits.
 */
/** The version 5 outbox columns (see `failureColumnsSql`). */
const FAILURE_COLUMNS = failureColumnsSql({ text64: 'VARCHAR(64) NULL', text200: 'VARCHAR(200) NULL', timestamp: 'DATETIME(3) NULL' });
const FIRST_DUE_COLUMN = firstDueColumnSql('DATETIME(3) NULL');
const LEASED_UNTIL_COLUMN = leasedUntilColumnSql('DATETIME(3) NULL');

const ID_COLUMNS = {
  message_id: 'VARBINARY(800)',
  consumer: 'VARBINARY(800)',
  topic: 'VARBINARY(996)',
  msg_key: 'VARBINARY(4096)',
} as const;

/**
 * `state` (schema version 4): one byte, whatever the state, so `pending` → `published`
 * keeps the row's size (see {@link MySqlDialect}, "Completion in place"). Strict SQL modes
 * refuse any other value. A new state is an `ALTER` appending to the list (a new schema
 * version), which is metadata only.
 */
const STATE_COLUMN = "ENUM('pending', 'published', 'dead', 'halted') CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending'";
/** The `published_at` of a row not (yet) published, instead of NULL (schema version 4). */
export const NOT_PUBLISHED_AT = '1970-01-01 00:00:00.000';
/** `published_at` (schema version 4): never NULL, so setting it keeps the row's size. */
const PUBLISHED_AT_COLUMN = `DATETIME(3) NOT NULL DEFAULT '${NOT_PUBLISHED_AT}'`;

/** Number of lock rows appends of keys hash into (see {@link MySqlDialect}). */
export const KEY_LOCK_BUCKETS = 1024;

/**
 * MariaDB 10.6+ / MySQL 8 adapter (both `@mikro-orm/mariadb` and `@mikro-orm/mysql`).
 *
 * - Per-key append lock: `GET_LOCK` is session-scoped and would outlive a pooled
 *   transaction, so appends lock one of {@link KEY_LOCK_BUCKETS} fixed rows
 *   (`SELECT … FOR UPDATE` on the primary key) chosen by the key's hash. The rows exist
 *   from migration time, so the lock is a record lock even at REPEATABLE READ (no gap
 *   locks, no insert of a new lock row that two producers could deadlock on); it is held
 *   to commit. Two keys sharing a bucket only serialise their appends.
 * - Claim: `SELECT … FOR UPDATE SKIP LOCKED` then `UPDATE … WHERE seq IN (…)` in one short
 *   READ COMMITTED transaction (no `UPDATE … RETURNING`, and no UPDATE selecting from its
 *   own table). The token comes from a counter row updated last, so a re-claim always
 *   draws a greater token than the claim it supersedes.
 * - The head scan's `NOT EXISTS` probe is pinned to the key index (`FORCE INDEX`, see
 *   `keyProbeHint`).
 * - Times are `DATETIME(3)` in UTC (`UTC_TIMESTAMP(3)`), independent of session time zones.
 * - Every id or name compared in a key or a `WHERE` (messageId, consumer, topic, key) is a
 *   `VARBINARY` column holding the UTF-8 bytes, so `'m1'` and `'m1 '` (or two Unicode
 *   normalisations) are different values. The `utf8mb4_bin` collation of schema version 1
 *   compares with PAD SPACE on MariaDB and made them equal; binary strings have no
 *   collation and no padding on MariaDB and MySQL 8 alike, so one DDL serves both.
 * - Completion in place (schema version 4): InnoDB rewrites a clustered-index record in
 *   place only when no changed column changes its stored size; otherwise it deletes and
 *   re-inserts the record, and on the outbox's full pages (rows are appended in key order)
 *   that takes page reorganisations, logged as page contents. With `state` a
 *   `VARCHAR(9)` ('pending' 7 bytes, 'published' 9) and `published_at` NULL (0 bytes)
 *   until set, every completion did that: measured on MariaDB 10.11, 7.7 KB of redo per
 *   completed row (~370 bytes in place) and, four relay-like loops draining 10,000 rows,
 *   1,560–2,100 rows/s against 2,450–2,720 with the v4 columns (bench/README.md, "MariaDB
 *   completion in place"). So `state` is a one-byte ENUM and `published_at` is
 *   {@link NOT_PUBLISHED_AT} until the row is published (never NULL). Nothing Courier reads
 *   changes: states compare as the same strings, and `published_at` is only read by
 *   pruning, together with `state = 'published'`. Operators' own queries for unpublished
 *   rows should test `state`, not `published_at IS NULL`. With `publishedRows: 'delete'` the
 *   completion is a `DELETE` of the same rows instead (InnoDB delete-marks the records and
 *   their index entries; purge removes them later), and none of this applies to it.
 */
/** The lock-table rows of these key hashes, ascending (the order every appender takes them in). */
function lockBuckets(keyHashes: readonly string[]): number[] {
  return [...new Set(keyHashes.map((hash) => Number.parseInt(hash.slice(0, 8), 16) % KEY_LOCK_BUCKETS))].sort((a, b) => a - b);
}

export class MySqlDialect implements SqlDialect {
  readonly name = 'mysql' as const;
  readonly now = 'UTC_TIMESTAMP(3)';
  readonly insertNow = 'UTC_TIMESTAMP(3)';
  readonly fromEpochMs = "TIMESTAMPADD(MICROSECOND, ? * 1000, '1970-01-01 00:00:00')";
  readonly greatest = 'GREATEST';
  readonly lockSkipLocked = ' FOR UPDATE SKIP LOCKED';
  readonly lockForUpdate = ' FOR UPDATE';
  readonly readCommitted = true;
  /**
   * The head scan's probe `e.key_hash = o.key_hash` is meant as a lookup on `key_ix`, which
   * MariaDB skips outright for a NULL hash (keyless rows). The optimizer may instead take a
   * range over the pending rows of a `state` index and test `key_hash` on each (through the
   * clustered index), with no NULL shortcut. It weighs the lookup by the index statistics,
   * where InnoDB counts all NULLs as one value (`innodb_stats_method=nulls_equal`): with
   * mostly keyless rows the lookup is estimated at a large share of the table (half in the
   * bench), so once few rows are pending the range looks cheaper. Seen on MariaDB 10.11 in the last ~5% of a 100k keyless
   * drain (lookup 49,462 rows estimated, range 5,501): each of a batch's 250 probes read
   * ~1,500 rows, 3.5–8 s per claim against 2–50 ms with this hint at the same moment; the
   * drain's median 2,246 msg/s against 4,891 with the hint, 8 alternated drains each
   * (bench/README.md, "The MariaDB keyless drain at 100k — cause"). The hint keeps the plan
   * the index is there for; no result changes.
   */
  readonly keyProbeHint: string;
  readonly #names: CourierTableNames;

  constructor(names: CourierTableNames) {
    this.#names = names;
    this.keyProbeHint = ` FORCE INDEX (${this.quote(`${names.outbox}_key_ix`)})`;
  }

  quote(identifier: string): string {
    return `\`${identifier}\``;
  }

  table(name: CourierObject): string {
    const quoted = this.quote(this.#names[name]);
    return this.#names.schema === undefined ? quoted : `${this.quote(this.#names.schema)}.${quoted}`;
  }

  plusMs(expression: string): string {
    return `TIMESTAMPADD(MICROSECOND, ? * 1000, ${expression})`;
  }

  epochMs(expression: string): string {
    return `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ${expression}) DIV 1000)`;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const ascii = 'CHARACTER SET ascii COLLATE ascii_bin';
    const buckets = Array.from({ length: KEY_LOCK_BUCKETS }, (_, index) => `(${index})`).join(', ');
    return [
      ...(n.schema === undefined ? [] : [`CREATE DATABASE IF NOT EXISTS ${this.quote(n.schema)}`]),
      `CREATE TABLE IF NOT EXISTS ${this.table('outbox')} (
        seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        message_id ${ID_COLUMNS.message_id} NOT NULL,
        message_type VARCHAR(200) NOT NULL,
        message_version INT NOT NULL,
        topic ${ID_COLUMNS.topic} NOT NULL,
        msg_key ${ID_COLUMNS.msg_key} NULL,
        key_hash CHAR(32) ${ascii} NULL,
        occurred_at VARCHAR(32) NOT NULL,
        correlation_id VARCHAR(200) NOT NULL,
        causation_id VARCHAR(200) NULL,
        traceparent VARCHAR(55) NULL,
        tracestate VARCHAR(512) NULL,
        headers LONGTEXT NOT NULL,
        payload LONGTEXT NOT NULL,
        state ${STATE_COLUMN},
        available_at DATETIME(3) NOT NULL,
        attempts INT NOT NULL DEFAULT 0,
        last_error TEXT NULL,
        failed_at DATETIME(3) NULL,
        ${FAILURE_COLUMNS.join(',\n        ')},
        ${FIRST_DUE_COLUMN},
        lease_owner VARCHAR(200) NULL,
        lease_token BIGINT NULL,
        created_at DATETIME(3) NOT NULL,
        published_at ${PUBLISHED_AT_COLUMN},
        ${LEASED_UNTIL_COLUMN},
        UNIQUE KEY ${this.quote(`${n.outbox}_message_id_uq`)} (message_id),
        KEY ${this.quote(`${n.outbox}_due_ix`)} (state, available_at, seq),
        KEY ${this.quote(`${n.outbox}_key_ix`)} (key_hash, state, seq),
        KEY ${this.quote(`${n.outbox}_failed_ix`)} (state, seq),
        KEY ${this.quote(`${n.outbox}_published_ix`)} (state, published_at)
      ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
      `CREATE TABLE IF NOT EXISTS ${this.table('outboxLocks')} (bucket SMALLINT NOT NULL PRIMARY KEY) ENGINE=InnoDB`,
      `INSERT IGNORE INTO ${this.table('outboxLocks')} (bucket) VALUES ${buckets}`,
      `CREATE TABLE IF NOT EXISTS ${this.table('inbox')} (
        message_id ${ID_COLUMNS.message_id} NOT NULL,
        consumer ${ID_COLUMNS.consumer} NOT NULL,
        processed_at DATETIME(3) NOT NULL,
        PRIMARY KEY (message_id, consumer),
        KEY ${this.quote(`${n.inbox}_processed_ix`)} (processed_at)
      ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
      `CREATE TABLE IF NOT EXISTS ${this.table('inboxStarts')} (
        message_id ${ID_COLUMNS.message_id} NOT NULL,
        consumer ${ID_COLUMNS.consumer} NOT NULL,
        starts INT NOT NULL,
        updated_at DATETIME(3) NOT NULL,
        PRIMARY KEY (message_id, consumer),
        KEY ${this.quote(`${n.inboxStarts}_updated_ix`)} (updated_at)
      ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
      ...haltSql(this, n.prefix).schema(),
      `CREATE TABLE IF NOT EXISTS ${this.table('meta')} (
        name VARCHAR(64) ${ascii} NOT NULL PRIMARY KEY,
        value BIGINT NOT NULL
      ) ENGINE=InnoDB`,
      `INSERT IGNORE INTO ${this.table('meta')} (name, value) VALUES ('schema_version', ${SCHEMA_VERSION}), ('lease_token', 0)`,
    ];
  }

  upgradeStatements(from: number): string[] {
    const outbox = this.table('outbox');
    // Version 3 -> 4: completion in place. New rows get the default first (metadata only),
    // so no NULL appears between the UPDATE and the ALTER, which rebuilds the table (a copy
    // that blocks writes while it runs: prune the outbox first). Converting a state outside
    // the ENUM fails in strict mode instead of changing it.
    const inPlace =
      from >= 4
        ? []
        : [
            `ALTER TABLE ${outbox} ALTER COLUMN published_at SET DEFAULT '${NOT_PUBLISHED_AT}'`,
            `UPDATE ${outbox} SET published_at = '${NOT_PUBLISHED_AT}' WHERE published_at IS NULL`,
            `ALTER TABLE ${outbox} MODIFY state ${STATE_COLUMN}, MODIFY published_at ${PUBLISHED_AT_COLUMN}`,
          ];
    // Version 4 -> 5: the failure columns, one ALTER each. Nullable columns at the end are
    // added in place (INSTANT on MariaDB 10.3+ and MySQL 8), not by a copy, so three cost
    // what one does. No ADD COLUMN IF NOT EXISTS on MySQL 8: a column already there (a racing
    // caller, an upgrade that stopped half-way) is {@link alreadyUpgraded} — per column, so the
    // missing ones are still added (one ALTER of all three failed whole on the first duplicate).
    const failureColumns = from >= 5 ? [] : FAILURE_COLUMNS.map((column) => `ALTER TABLE ${outbox} ADD COLUMN ${column}`);
    // Version 5 -> 6: first_due_at, in place like those, then its backfill (pending rows
    // failing or leased at the upgrade only).
    failureColumns.push(...(from >= 6 ? [] : [`ALTER TABLE ${outbox} ADD COLUMN ${FIRST_DUE_COLUMN}`, firstDueBackfillSql(this)]));
    // Version 6 -> 7: leased_until, in place like those, then the backfill of the leases taken
    // under 6. (PostgreSQL's fill factor has no counterpart here: InnoDB updates a row in place.)
    failureColumns.push(...(from >= 7 ? [] : [`ALTER TABLE ${outbox} ADD COLUMN ${LEASED_UNTIL_COLUMN}`, leaseBackfillSql(this)]));
    // Version 2 -> 3: the inbox halt tables.
    const halts = from >= 3 ? [] : haltSql(this, this.#names.prefix).schema();
    if (from >= 2) return [...halts, ...inPlace, ...failureColumns];
    const modify = (columns: readonly (keyof typeof ID_COLUMNS)[], nullable: readonly string[] = []) =>
      columns.map((column) => `MODIFY ${column} ${ID_COLUMNS[column]} ${nullable.includes(column) ? 'NULL' : 'NOT NULL'}`).join(', ');
    // Version 1 -> 2: the id columns become binary. Converting a utf8mb4 column to VARBINARY
    // keeps its UTF-8 bytes, and byte comparison only tells apart values PAD SPACE merged,
    // so the unique keys hold. Each ALTER rebuilds its table (a copy; size it for the outbox).
    return [
      `ALTER TABLE ${outbox} ${modify(['message_id', 'topic', 'msg_key'], ['msg_key'])}`,
      `ALTER TABLE ${this.table('inbox')} ${modify(['message_id', 'consumer'])}`,
      `ALTER TABLE ${this.table('inboxStarts')} ${modify(['message_id', 'consumer'])}`,
      ...halts,
      ...inPlace,
      ...failureColumns,
    ];
  }

  alreadyUpgraded(error: unknown): boolean {
    // ER_DUP_FIELDNAME: the column is there already.
    return (error as { errno?: unknown } | null)?.errno === 1060 || (error instanceof Error && /Duplicate column name/i.test(error.message));
  }

  dropStatements(): string[] {
    return (['outbox', 'outboxLocks', 'inbox', 'inboxStarts', 'inboxHalts', 'inboxHeld', 'inboxParked', 'meta'] as const).map((name) => `DROP TABLE IF EXISTS ${this.table(name)}`);
  }

  async lockKeys<Tx>(runner: SqlExecutor<Tx>, trx: Tx, keyHashes: readonly string[]): Promise<void> {
    const buckets = lockBuckets(keyHashes);
    if (buckets.length === 0) return;
    // Ascending primary-key order, so two appenders of the same buckets never deadlock.
    await runner.all(`SELECT bucket FROM ${this.table('outboxLocks')} WHERE bucket IN (?) ORDER BY bucket FOR UPDATE`, [buckets], trx);
  }

  keyLockCondition(keyHashes: readonly string[], rows: number): { sql: string; params: unknown[] } | undefined {
    const buckets = lockBuckets(keyHashes);
    // Several rows would need a multi-row SELECT source, which MariaDB and MySQL 8 spell
    // differently (VALUES vs VALUES ROW): those appends keep the lock statement of their own.
    if (buckets.length === 0 || rows !== 1) return undefined;
    // The same locks as lockKeys, in the same order, from an uncorrelated subquery of the
    // INSERT … SELECT's WHERE: it is evaluated before the first row is written, so before
    // the AUTO_INCREMENT seq is drawn, and FOR UPDATE takes exclusive locks (an INSERT …
    // SELECT alone would take shared ones, which two appenders of a key can both hold).
    // Checked on MariaDB 10.11: a second appender of the bucket waits for the first's
    // commit, and an appender of another bucket does not wait (plugins/mysql2/test/append-statements.test.ts).
    return {
      sql: `(SELECT COUNT(*) FROM (SELECT bucket FROM ${this.table('outboxLocks')} WHERE bucket IN (?) ORDER BY bucket FOR UPDATE) AS courier_locks) >= 0`,
      params: [buckets],
    };
  }

  async claimHeads<Tx>(runner: SqlExecutor<Tx>, query: ClaimQuery, done?: CompletionQuery<Tx>): Promise<ClaimResult> {
    return runner.transaction(
      async (trx) => {
        // The completion first: it locks only rows of its own lease, which no claim waits
        // for (they are skipped), so it adds no lock cycle; the head scan then sees it.
        const completion = done === undefined ? undefined : await completeRows(this, runner, done, trx, done.beforeCommit !== undefined);
        const completed = completion?.count;
        const rows = await runner.all(headsSql(this, `${qualifiedColumns('o')}, ${ageSql(this, 'o')}`, this.lockSkipLocked), [query.limit], trx);
        // Drawn after the rows are locked: whoever held them before has committed, so this
        // token is greater than the one their previous lease carries.
        const token = await this.nextToken(runner, trx);
        if (rows.length > 0) {
          await runner.run(
            `UPDATE ${this.table('outbox')} SET lease_owner = ?, lease_token = ?, leased_until = ${this.plusMs(this.now)} WHERE seq IN (?)`,
            [query.owner, token.toString(), query.leaseMs, rows.map((row) => String(row['seq']))],
            trx,
          );
        }
        await done?.beforeCommit?.(trx, completion?.ids ?? []);
        return { token, rows, ...(completed === undefined ? {} : { completed }) };
      },
      { readCommitted: true },
    );
  }

  async nextToken<Tx>(runner: SqlExecutor<Tx>, trx: Tx): Promise<bigint> {
    // LAST_INSERT_ID(expr) hands the new value back in the OK packet: one round trip.
    const result = await runner.run(`UPDATE ${this.table('meta')} SET value = LAST_INSERT_ID(value + 1) WHERE name = 'lease_token'`, [], trx);
    if (result.affectedRows !== 1) throw new Error(`the lease token counter row is missing from ${this.table('meta')}`);
    const fromPacket = result.insertId === undefined || result.insertId === null ? 0n : toBigInt(result.insertId);
    if (fromPacket > 0n) return fromPacket;
    const rows = await runner.all('SELECT LAST_INSERT_ID() AS value', [], trx);
    return toBigInt(rows[0]?.['value']);
  }

  async insertInboxRecord<Tx>(runner: SqlExecutor<Tx>, trx: Tx, messageId: string, consumer: string): Promise<boolean> {
    // A plain INSERT: it waits for a racing uncommitted insert of the same pair and fails
    // with a duplicate-key error if that one commits. InnoDB rolls back only the statement,
    // so the transaction stays usable. (INSERT IGNORE would also swallow truncation.)
    try {
      await runner.run(`INSERT INTO ${this.table('inbox')} (message_id, consumer, processed_at) VALUES (?, ?, UTC_TIMESTAMP(3))`, [messageId, consumer], trx);
      return true;
    } catch (error) {
      if (classifyError(runner, error) === 'duplicate') return false;
      throw error;
    }
  }

  async recordStart<Tx>(runner: SqlExecutor<Tx>, messageId: string, consumer: string): Promise<number> {
    return runner.transaction(
      async (trx) => {
        await runner.run(
          `INSERT INTO ${this.table('inboxStarts')} (message_id, consumer, starts, updated_at) VALUES (?, ?, 1, UTC_TIMESTAMP(3)) ` +
            'ON DUPLICATE KEY UPDATE starts = starts + 1, updated_at = UTC_TIMESTAMP(3)',
          [messageId, consumer],
          trx,
        );
        const rows = await runner.all(`SELECT starts FROM ${this.table('inboxStarts')} WHERE message_id = ? AND consumer = ?`, [messageId, consumer], trx);
        return toNumber(rows[0]?.['starts']);
      },
      { readCommitted: true },
    );
  }

  pruneBatchSql(table: CourierObject, column: string, publishedOnly: boolean): string {
    const state = publishedOnly ? `state = 'published' AND ` : '';
    // A range on the (state, published_at) or (processed_at) index, stopped by LIMIT. No
    // ORDER BY: any old rows will do, and the optimizer sometimes answers ORDER BY on a
    // DELETE with a filesort of the whole range. At READ COMMITTED it locks only the rows
    // it deletes, none of the gaps producers insert into.
    return `DELETE FROM ${this.table(table)} WHERE ${state}${column} < TIMESTAMPADD(MICROSECOND, -(? * 1000), UTC_TIMESTAMP(3)) LIMIT ?`;
  }
}
