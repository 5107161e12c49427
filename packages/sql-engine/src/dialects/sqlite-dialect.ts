import type { CourierTableNames } from '../courier-tables.js';
import { classifyError, toBigInt, toNumber, type SqlExecutor, type TransactionPrologue } from '../executor.js';
import { haltSql } from './inbox-halts-sql.js';
import { ageSql, completeRows, failureColumnsSql, firstDueBackfillSql, firstDueColumnSql, headsSql, leaseBackfillSql, leasedUntilColumnSql, ROW_COLUMNS, SCHEMA_VERSION, type ClaimQuery, type ClaimResult, type CompletionQuery, type CourierObject, type SqlDialect } from './sql-dialect.js';

// Milliseconds since the epoch from SQLite's clock; 'now' is fixed for one statement.
/** The version 5 outbox columns (see `failureColumnsSql`); times in epoch milliseconds, as every SQLite timestamp here. */
const FAILURE_COLUMNS = failureColumnsSql({ text64: 'TEXT', text200: 'TEXT', timestamp: 'INTEGER' });
const FIRST_DUE_COLUMN = firstDueColumnSql('INTEGER');
const LEASED_UNTIL_COLUMN = leasedUntilColumnSql('INTEGER');

const NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/**
 * How long SQLite connections used by Courier wait for another connection's lock before
 * `SQLITE_BUSY`, in milliseconds. Generous on purpose: with `@mikro-orm/libsql` 6.6.16 a
 * statement that fails with `SQLITE_BUSY` inside a transaction leaves the connection
 * unusable ("cannot commit transaction - SQL statements in progress", then knex's
 * "Transaction query already complete" for good), so a busy file must be waited out, never
 * failed; 5 s ran out on a loaded 2-core machine with three processes on one file.
 */
export const SQLITE_BUSY_TIMEOUT_MS = 30_000;

/**
 * SQLite adapter (`@mikro-orm/libsql`), for development, tests and the zero-setup example.
 *
 * - No per-key lock: SQLite has one writer at a time and holds the write lock from a
 *   transaction's first write to its commit, so `AUTOINCREMENT` sequences are drawn in
 *   commit order already.
 * - Claim: one `UPDATE … WHERE seq IN (head-of-key candidates) RETURNING …`, after the
 *   token counter row is bumped in the same transaction.
 * - Times are INTEGER milliseconds since the epoch.
 * - Several processes on one file: the file is put in WAL mode (readers and the writer do
 *   not block each other); every connection of the ORM gets a busy timeout of 30 s when
 *   it opens (`SqlExecutor.configureEveryConnection`), every store transaction sets it again and takes
 *   the write lock with its first statement (a `DELETE … WHERE 0`, since MikroORM begins
 *   with a deferred `BEGIN`), so it waits its turn instead of failing with `SQLITE_BUSY`
 *   when a read would have to be upgraded while another process writes.
 */
export class SqliteDialect implements SqlDialect {
  readonly name = 'sqlite' as const;
  readonly now = NOW_MS;
  readonly insertNow = NOW_MS;
  readonly fromEpochMs = '?';
  readonly greatest = 'MAX';
  readonly lockSkipLocked = '';
  // Store transactions hold SQLite's one write lock from their first statement.
  readonly lockForUpdate = '';
  readonly readCommitted = false;
  readonly transactionPrologue: TransactionPrologue;
  readonly #names: CourierTableNames;

  constructor(names: CourierTableNames) {
    this.#names = names;
    this.transactionPrologue = {
      session: [`PRAGMA busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`],
      writeLock: [`DELETE FROM ${this.table('meta')} WHERE 0`],
    };
  }

  async prepareDatabase<Tx>(runner: SqlExecutor<Tx>): Promise<void> {
    // The busy timeout on every connection of the ORM, the application's transactions included.
    await runner.configureEveryConnection?.();
    const mode = String((await runner.untransacted('PRAGMA journal_mode'))[0]?.['journal_mode'] ?? '').toLowerCase();
    if (mode === 'wal' || mode === 'memory' || mode === '') return;
    try {
      await runner.untransacted(`PRAGMA busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`);
      // Persistent in the file: the first process to get here switches it for all.
      await runner.untransacted('PRAGMA journal_mode = WAL');
    } catch (error) {
      // Another process holds the file; it (or the next check) switches the mode. The
      // store works without WAL, with more waiting.
      if (classifyError(runner, error) !== 'transient') throw error;
    }
  }

  quote(identifier: string): string {
    return `"${identifier}"`;
  }

  table(name: CourierObject): string {
    return this.quote(this.#names[name]);
  }

  plusMs(expression: string): string {
    return `(${expression} + ?)`;
  }

  epochMs(expression: string): string {
    return expression;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const outbox = this.table('outbox');
    const ix = (suffix: string) => this.quote(`${n.outbox}_${suffix}`);
    return [
      // AUTOINCREMENT: a pruned maximum is never handed out again.
      `CREATE TABLE IF NOT EXISTS ${outbox} (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id TEXT NOT NULL UNIQUE,
        message_type TEXT NOT NULL,
        message_version INTEGER NOT NULL,
        topic TEXT NOT NULL,
        msg_key TEXT,
        key_hash TEXT,
        occurred_at TEXT NOT NULL,
        correlation_id TEXT NOT NULL,
        causation_id TEXT,
        traceparent TEXT,
        tracestate TEXT,
        headers TEXT NOT NULL,
        payload TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        available_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        failed_at INTEGER,
        ${FAILURE_COLUMNS.join(',\n        ')},
        ${FIRST_DUE_COLUMN},
        lease_owner TEXT,
        lease_token INTEGER,
        created_at INTEGER NOT NULL,
        published_at INTEGER,
        ${LEASED_UNTIL_COLUMN}
      )`,
      `CREATE INDEX IF NOT EXISTS ${ix('due_ix')} ON ${outbox} (available_at, seq) WHERE state = 'pending'`,
      `CREATE INDEX IF NOT EXISTS ${ix('key_ix')} ON ${outbox} (key_hash, seq) WHERE state IN ('pending', 'halted')`,
      `CREATE INDEX IF NOT EXISTS ${ix('failed_ix')} ON ${outbox} (seq) WHERE state IN ('dead', 'halted')`,
      `CREATE INDEX IF NOT EXISTS ${ix('published_ix')} ON ${outbox} (published_at) WHERE state = 'published'`,
      `CREATE TABLE IF NOT EXISTS ${this.table('inbox')} (
        message_id TEXT NOT NULL,
        consumer TEXT NOT NULL,
        processed_at INTEGER NOT NULL,
        PRIMARY KEY (message_id, consumer)
      )`,
      `CREATE INDEX IF NOT EXISTS ${this.quote(`${n.inbox}_processed_ix`)} ON ${this.table('inbox')} (processed_at)`,
      `CREATE TABLE IF NOT EXISTS ${this.table('inboxStarts')} (
        message_id TEXT NOT NULL,
        consumer TEXT NOT NULL,
        starts INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (message_id, consumer)
      )`,
      `CREATE INDEX IF NOT EXISTS ${this.quote(`${n.inboxStarts}_updated_ix`)} ON ${this.table('inboxStarts')} (updated_at)`,
      ...haltSql(this, n.prefix).schema(),
      `CREATE TABLE IF NOT EXISTS ${this.table('meta')} (name TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL)`,
      `INSERT OR IGNORE INTO ${this.table('meta')} (name, value) VALUES ('schema_version', ${SCHEMA_VERSION}), ('lease_token', 0)`,
    ];
  }

  upgradeStatements(from: number): string[] {
    // Version 4 -> 5: the failure columns, one ALTER each (SQLite adds one column per
    // statement, without a rewrite); a racing caller's duplicate is {@link alreadyUpgraded}.
    const failureColumns = from >= 5 ? [] : FAILURE_COLUMNS.map((column) => `ALTER TABLE ${this.table('outbox')} ADD COLUMN ${column}`);
    // Version 5 -> 6: first_due_at (a duplicate is {@link alreadyUpgraded} too), then its backfill.
    const firstDue = from >= 6 ? [] : [`ALTER TABLE ${this.table('outbox')} ADD COLUMN ${FIRST_DUE_COLUMN}`, firstDueBackfillSql(this)];
    // Version 6 -> 7: leased_until (a duplicate is {@link alreadyUpgraded}), then the backfill
    // of the leases taken under 6.
    const leasedUntil = from >= 7 ? [] : [`ALTER TABLE ${this.table('outbox')} ADD COLUMN ${LEASED_UNTIL_COLUMN}`, leaseBackfillSql(this)];
    // Version 2 -> 3: the inbox halt tables. 1 -> 2 and 3 -> 4 changed nothing here.
    return [...(from >= 3 ? [] : haltSql(this, this.#names.prefix).schema()), ...failureColumns, ...firstDue, ...leasedUntil];
  }

  alreadyUpgraded(error: unknown): boolean {
    return error instanceof Error && /duplicate column name/i.test(error.message);
  }

  dropStatements(): string[] {
    return (['outbox', 'inbox', 'inboxStarts', 'inboxHalts', 'inboxHeld', 'inboxParked', 'meta'] as const).map((name) => `DROP TABLE IF EXISTS ${this.table(name)}`);
  }

  async lockKeys<Tx>(runner: SqlExecutor<Tx>, trx: Tx): Promise<void> {
    // No key lock (see the class comment), but the busy timeout and the write lock before
    // the insert, as in the store's own transactions. In a unit of work that already
    // wrote, this is a no-op; in one that only read, it fails as the insert would.
    await runner.prologue(trx);
  }

  async claimHeads<Tx>(runner: SqlExecutor<Tx>, query: ClaimQuery, done?: CompletionQuery<Tx>): Promise<ClaimResult> {
    return runner.transaction(async (trx) => {
      // One writer at a time (BEGIN IMMEDIATE): the completion, then the claim, which sees it.
      const completion = done === undefined ? undefined : await completeRows(this, runner, done, trx, done.beforeCommit !== undefined);
      const completed = completion?.count;
      const token = await this.nextToken(runner, trx);
      // Two statements where one would do: RETURNING sees leased_until after the UPDATE wrote
      // it, so the rows' ages are read first. The write lock is held (BEGIN IMMEDIATE), so
      // nothing changes in between; both run in-process.
      const heads = await runner.all(headsSql(this, `o.seq, ${ageSql(this, 'o')}`, ''), [query.limit], trx);
      if (heads.length === 0) {
        await done?.beforeCommit?.(trx, completion?.ids ?? []);
        return { token, rows: [], ...(completed === undefined ? {} : { completed }) };
      }
      const ages = new Map(heads.map((row) => [String(row['seq']), row['age_ms']]));
      const updated = await runner.all(
        `UPDATE ${this.table('outbox')} SET lease_owner = ?, lease_token = ?, leased_until = ${this.plusMs(NOW_MS)} ` +
          `WHERE seq IN (?) RETURNING ${ROW_COLUMNS.join(', ')}`,
        [query.owner, token.toString(), query.leaseMs, [...ages.keys()]],
        trx,
      );
      const rows = updated.map((row) => ({ ...row, age_ms: ages.get(String(row['seq'])) }));
      await done?.beforeCommit?.(trx, completion?.ids ?? []);
      return { token, rows, ...(completed === undefined ? {} : { completed }) };
    });
  }

  async nextToken<Tx>(runner: SqlExecutor<Tx>, trx: Tx): Promise<bigint> {
    const rows = await runner.all(`UPDATE ${this.table('meta')} SET value = value + 1 WHERE name = 'lease_token' RETURNING value`, [], trx);
    if (rows.length !== 1) throw new Error(`the lease token counter row is missing from ${this.table('meta')}`);
    return toBigInt(rows[0]?.['value']);
  }

  async insertInboxRecord<Tx>(runner: SqlExecutor<Tx>, trx: Tx, messageId: string, consumer: string): Promise<boolean> {
    const result = await runner.run(
      `INSERT INTO ${this.table('inbox')} (message_id, consumer, processed_at) VALUES (?, ?, ${NOW_MS}) ON CONFLICT (message_id, consumer) DO NOTHING`,
      [messageId, consumer],
      trx,
    );
    return result.affectedRows === 1;
  }

  async recordStart<Tx>(runner: SqlExecutor<Tx>, messageId: string, consumer: string): Promise<number> {
    const rows = await runner.all(
      `INSERT INTO ${this.table('inboxStarts')} (message_id, consumer, starts, updated_at) VALUES (?, ?, 1, ${NOW_MS}) ` +
        'ON CONFLICT (message_id, consumer) DO UPDATE SET starts = starts + 1, updated_at = excluded.updated_at RETURNING starts',
      [messageId, consumer],
    );
    return toNumber(rows[0]?.['starts']);
  }

  pruneBatchSql(table: CourierObject, column: string, publishedOnly: boolean): string {
    const name = this.table(table);
    const state = publishedOnly ? `state = 'published' AND ` : '';
    return `DELETE FROM ${name} WHERE rowid IN (SELECT rowid FROM ${name} WHERE ${state}${column} < (${NOW_MS} - ?) ORDER BY ${column} LIMIT ?)`;
  }
}
