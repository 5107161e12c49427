import type { CourierTableNames } from '../courier-tables.js';
import { toBigInt, toNumber, type SqlExecutor } from '../executor.js';
import { haltSql } from './inbox-halts-sql.js';
import { ageSql, completeSql, failureColumnsSql, firstDueBackfillSql, firstDueColumnSql, headsSql, leaseBackfillSql, leasedUntilColumnSql, qualifiedColumns, SCHEMA_VERSION, unleasedSql, type ClaimQuery, type ClaimResult, type CompletionQuery, type CourierObject, type SqlDialect } from './sql-dialect.js';

/**
 * PostgreSQL 12+ adapter.
 *
 * - Per-key append lock: `pg_advisory_xact_lock(namespace, hash)`, released by the
 *   transaction's end, taken just before the insert that draws the `bigserial`; so rows of
 *   one key get sequences in commit order and none is visible before an earlier one.
 * - Claim: one statement per batch (token from a sequence, head-of-key candidates locked
 *   `FOR UPDATE SKIP LOCKED`, the lease written, the rows returned). The heads are found by
 *   one of two scans, chosen from what the previous claim saw: the due rows in claim order,
 *   each probed for an earlier row of its key (many keys), or one key-index descent per key
 *   (the due rows belong to few keys); both take exactly the same heads.
 * - Partial indexes keep every hot query on pending / failed / published rows only, so
 *   the size of the published history does not slow the claim.
 */
/**
 * Autovacuum by a fixed number of dead rows instead of PostgreSQL's default share of the
 * table (20% + 50 rows): every message leaves two dead versions (lease, then published) and
 * their entries at the front of the due index, which each claim walks until a vacuum removes
 * them — on a large outbox the default waits for hundreds of thousands (docs/operations.md,
 * "keep it vacuumed"; bench scenario 3). Set only when the table is created, so a DBA's own
 * tuning of an existing table is never overwritten.
 */
/** The version 5 outbox columns (see `failureColumnsSql`). */
const FAILURE_COLUMNS = failureColumnsSql({ text64: 'varchar(64)', text200: 'varchar(200)', timestamp: 'timestamptz' });
const FIRST_DUE_COLUMN = firstDueColumnSql('timestamptz');
const LEASED_UNTIL_COLUMN = leasedUntilColumnSql('timestamptz');

/**
 * The outbox's fill factor (schema version 7): its pages are written half full, so the version
 * a claim writes (the lease: columns no index reads) fits on the row's own page and is a HOT
 * update — no index entry, no other page touched. Rows are appended in sequence order and
 * claimed a page at a time, so a page needs room for about as many lease versions as it holds
 * rows; at 80 one lease in four was HOT, at 50 96 %, at 30 all for no further gain
 * (bench/README.md, "The HOT lease, measured first"). A backlog's heap is about twice as
 * large while it is pending; vacuum makes a drained page's space reusable.
 */
export const OUTBOX_FILLFACTOR = 50;

const OUTBOX_STORAGE_PARAMETERS = `fillfactor = ${OUTBOX_FILLFACTOR}, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000`;

export class PostgresDialect implements SqlDialect {
  readonly name = 'postgresql' as const;
  readonly now = 'now()';
  readonly insertNow = 'clock_timestamp()';
  readonly fromEpochMs = 'to_timestamp(?::float8 / 1000)';
  readonly greatest = 'GREATEST';
  readonly integerParam = '?::int4';
  readonly lockSkipLocked = ' FOR UPDATE OF o SKIP LOCKED';
  readonly lockForUpdate = ' FOR UPDATE';
  readonly readCommitted = false;
  readonly #names: CourierTableNames;
  /**
   * Which head scan the next claim runs: false, the due rows in claim order, each probed for
   * an earlier row of its key (cheap while heads are dense among the due rows, as with many
   * keys); true, one index descent per key (cheap while the due rows belong to few keys).
   * Only the cost differs, never the rows a claim may take; each claim's statement says
   * whether the other scan would have been cheaper. Shared by the relay loops of this store.
   */
  #sparseHeads = false;

  constructor(names: CourierTableNames) {
    this.#names = names;
  }

  quote(identifier: string): string {
    return `"${identifier}"`;
  }

  table(name: CourierObject): string {
    const quoted = this.quote(this.#names[name]);
    return this.#names.schema === undefined ? quoted : `${this.quote(this.#names.schema)}.${quoted}`;
  }

  plusMs(expression: string): string {
    return `(${expression} + (?::float8 * interval '1 millisecond'))`;
  }

  epochMs(expression: string): string {
    return `floor(extract(epoch from ${expression}) * 1000)`;
  }

  schemaStatements(): string[] {
    const n = this.#names;
    const outbox = this.table('outbox');
    const inbox = this.table('inbox');
    const starts = this.table('inboxStarts');
    const meta = this.table('meta');
    const ix = (suffix: string) => this.quote(`${n.outbox}_${suffix}`);
    return [
      ...(n.schema === undefined ? [] : [`CREATE SCHEMA IF NOT EXISTS ${this.quote(n.schema)}`]),
      `CREATE TABLE IF NOT EXISTS ${outbox} (
        seq bigserial PRIMARY KEY,
        message_id varchar(200) NOT NULL,
        message_type varchar(200) NOT NULL,
        message_version integer NOT NULL,
        topic varchar(249) NOT NULL,
        msg_key varchar(1024),
        key_hash char(32),
        occurred_at varchar(32) NOT NULL,
        correlation_id varchar(200) NOT NULL,
        causation_id varchar(200),
        traceparent varchar(55),
        tracestate varchar(512),
        headers text NOT NULL,
        payload text NOT NULL,
        state varchar(9) NOT NULL DEFAULT 'pending',
        available_at timestamptz NOT NULL,
        attempts integer NOT NULL DEFAULT 0,
        last_error text,
        failed_at timestamptz,
        ${FAILURE_COLUMNS.join(',\n        ')},
        ${FIRST_DUE_COLUMN},
        lease_owner varchar(200),
        lease_token bigint,
        created_at timestamptz NOT NULL DEFAULT now(),
        published_at timestamptz,
        ${LEASED_UNTIL_COLUMN},
        CONSTRAINT ${ix('message_id_uq')} UNIQUE (message_id)
      ) WITH (${OUTBOX_STORAGE_PARAMETERS})`,
      // The claim's range scan: due pending rows in claim order; scheduled rows sit past
      // now() and are not visited; in-flight rows (leased_until in the future) are, and are
      // skipped by their lease (at most the relay's loops × batch of them, on pages the scan
      // reads anyway): the lease moves no key of this index, so it is a HOT update.
      `CREATE INDEX IF NOT EXISTS ${ix('due_ix')} ON ${outbox} (available_at, seq) WHERE state = 'pending'`,
      // The head-of-key probe and listHalted's held count.
      `CREATE INDEX IF NOT EXISTS ${ix('key_ix')} ON ${outbox} (key_hash, seq) WHERE state IN ('pending', 'halted')`,
      `CREATE INDEX IF NOT EXISTS ${ix('failed_ix')} ON ${outbox} (seq) WHERE state IN ('dead', 'halted')`,
      `CREATE INDEX IF NOT EXISTS ${ix('published_ix')} ON ${outbox} (published_at) WHERE state = 'published'`,
      `CREATE SEQUENCE IF NOT EXISTS ${this.table('tokenSequence')}`,
      `CREATE TABLE IF NOT EXISTS ${inbox} (
        message_id varchar(200) NOT NULL,
        consumer varchar(200) NOT NULL,
        processed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (message_id, consumer)
      )`,
      `CREATE INDEX IF NOT EXISTS ${this.quote(`${n.inbox}_processed_ix`)} ON ${inbox} (processed_at)`,
      `CREATE TABLE IF NOT EXISTS ${starts} (
        message_id varchar(200) NOT NULL,
        consumer varchar(200) NOT NULL,
        starts integer NOT NULL,
        updated_at timestamptz NOT NULL,
        PRIMARY KEY (message_id, consumer)
      )`,
      `CREATE INDEX IF NOT EXISTS ${this.quote(`${n.inboxStarts}_updated_ix`)} ON ${starts} (updated_at)`,
      ...haltSql(this, n.prefix).schema(),
      `CREATE TABLE IF NOT EXISTS ${meta} (name varchar(64) PRIMARY KEY, value bigint NOT NULL)`,
      `INSERT INTO ${meta} (name, value) VALUES ('schema_version', ${SCHEMA_VERSION}) ON CONFLICT (name) DO NOTHING`,
    ];
  }

  upgradeStatements(from: number): string[] {
    // Version 4 -> 5: the failure columns; nullable without a default, so adding them only
    // changes the catalog (no table rewrite), and every row written before reads NULL.
    const failureColumns = from >= 5 ? [] : [`ALTER TABLE ${this.table('outbox')} ${FAILURE_COLUMNS.map((column) => `ADD COLUMN IF NOT EXISTS ${column}`).join(', ')}`];
    // Version 5 -> 6: first_due_at, the same kind of catalog-only change, then its backfill.
    const firstDue = from >= 6 ? [] : [`ALTER TABLE ${this.table('outbox')} ADD COLUMN IF NOT EXISTS ${FIRST_DUE_COLUMN}`, firstDueBackfillSql(this)];
    // Version 6 -> 7: leased_until (catalog only), the backfill of the leases taken under 6,
    // and the fill factor — which applies to pages written from then on, not to the pages
    // the table has (a VACUUM FULL or pg_repack rewrites those, if wanted).
    const leasedUntil =
      from >= 7
        ? []
        : [`ALTER TABLE ${this.table('outbox')} ADD COLUMN IF NOT EXISTS ${LEASED_UNTIL_COLUMN}`, leaseBackfillSql(this), `ALTER TABLE ${this.table('outbox')} SET (fillfactor = ${OUTBOX_FILLFACTOR})`];
    // Version 2 -> 3: the inbox halt tables. 1 -> 2 and 3 -> 4 changed nothing here.
    return [...(from >= 3 ? [] : haltSql(this, this.#names.prefix).schema()), ...failureColumns, ...firstDue, ...leasedUntil];
  }

  dropStatements(): string[] {
    return [
      ...haltSql(this, this.#names.prefix).drop(),
      `DROP TABLE IF EXISTS ${this.table('outbox')}`,
      `DROP SEQUENCE IF EXISTS ${this.table('tokenSequence')}`,
      `DROP TABLE IF EXISTS ${this.table('inbox')}`,
      `DROP TABLE IF EXISTS ${this.table('inboxStarts')}`,
      `DROP TABLE IF EXISTS ${this.table('meta')}`,
    ];
  }

  async lockKeys<Tx>(runner: SqlExecutor<Tx>, trx: Tx, keyHashes: readonly string[]): Promise<void> {
    const keys = lockKeysOf(keyHashes);
    if (keys.length === 0) return;
    if (keys.length === 1) {
      // count(): the lock function returns void, a column type some data layers cannot read (Prisma's raw queries).
      await runner.all('SELECT count(pg_advisory_xact_lock(?, ?))', [this.#names.lockNamespace, keys[0]], trx);
      return;
    }
    // Sorted, so two transactions appending the same keys queue instead of deadlocking.
    await runner.all('SELECT count(pg_advisory_xact_lock(?, k)) FROM (SELECT unnest(ARRAY[?]::int4[]) AS k ORDER BY 1) AS s', [this.#names.lockNamespace, keys], trx);
  }

  keyLockCondition(keyHashes: readonly string[]): { sql: string; params: unknown[] } | undefined {
    const keys = lockKeysOf(keyHashes);
    if (keys.length === 0) return undefined;
    // An uncorrelated scalar subquery: PostgreSQL runs it once, as an InitPlan, when the
    // WHERE is first tested — before the statement's first row is projected, and with it
    // the row's nextval() default. count() >= 0 is always true; the count only forces
    // every lock to be taken (in sorted order) before the subquery returns.
    // One key (most producing transactions): no array, unnest or sort to plan and run —
    // the server's work for a keyed append's INSERT was about twice a plain INSERT's
    // (bench/README.md, session prod3).
    if (keys.length === 1) return { sql: '(SELECT count(pg_advisory_xact_lock(?, ?))) >= 0', params: [this.#names.lockNamespace, keys[0]] };
    return {
      sql: '(SELECT count(pg_advisory_xact_lock(?, k)) FROM (SELECT unnest(ARRAY[?]::int4[]) AS k ORDER BY 1) AS s) >= 0',
      params: [this.#names.lockNamespace, keys],
    };
  }

  async claimHeads<Tx>(runner: SqlExecutor<Tx>, query: ClaimQuery, done?: CompletionQuery<Tx>): Promise<ClaimResult> {
    const outbox = this.table('outbox');
    const completing = done !== undefined && done.sequences.length > 0;
    const sparse = this.#sparseHeads;
    const limit = query.limit;
    // With a completion: one statement still. A data-modifying CTE (the UPDATE marking the
    // rows published, or the DELETE of publishedRows 'delete') runs whether or not it is
    // referenced; the claim's snapshot predates it and still shows the rows pending, so the
    // head test counts the rows it completes as published: a key whose last in-flight rows it
    // completes has its next row claimed at once (on a backlog of few keys, no empty claim in
    // between). The completed rows hold a live lease (leased_until in the future), so they
    // are never candidates.
    const completed = completing ? 'SELECT seq FROM done' : undefined;
    const sql =
      (sparse ? 'WITH RECURSIVE ' : 'WITH ') +
      (completing ? `done AS (${completeSql(this, done.publishedRows)} RETURNING seq, message_id), ` : '') +
      `token AS MATERIALIZED (SELECT nextval('${this.table('tokenSequence')}') AS value), ` +
      // The age is read in the candidates, before the UPDATE writes the lease.
      (sparse
        ? `${sparseHeadsSql(outbox, limit, completed)}, candidates AS (SELECT o.seq, ${ageSql(this, 'o')} FROM ${outbox} o ` +
          `WHERE o.seq = ANY (ARRAY(SELECT seq FROM keyed UNION ALL SELECT seq FROM keyless)) AND o.state = 'pending' AND o.available_at <= now() AND ${unleasedSql('o.', 'now()')} ` +
          `ORDER BY o.available_at, o.seq LIMIT ?${this.lockSkipLocked}), `
        : `candidates AS (${headsSql(this, `o.seq, ${ageSql(this, 'o')}`, this.lockSkipLocked, completed)}), `) +
      // Only columns no index reads: a HOT update where the page has room (OUTBOX_FILLFACTOR).
      `claimed AS (UPDATE ${outbox} u SET lease_owner = ?, lease_token = token.value, leased_until = ${this.plusMs('now()')} ` +
      `FROM candidates, token WHERE u.seq = candidates.seq RETURNING ${qualifiedColumns('u')}, candidates.age_ms) ` +
      // The LEFT JOIN returns the token even when nothing was due.
      `SELECT token.value AS claim_token, ${completing ? '(SELECT count(*) FROM done)' : '0'} AS completed_count, ` +
      `${sparse ? sparseOverflowSql(limit) : denseShortSql(outbox, limit)} AS switch_scan, ` +
      // With the fault hook, the ids the completion changed (what the hook is told).
      `${completing && done.beforeCommit ? "(SELECT coalesce(array_agg(message_id), '{}') FROM done) AS completed_ids, " : ''}claimed.* FROM token LEFT JOIN claimed ON true`;
    const params = [limit, query.owner, query.leaseMs];
    const values = completing ? [[...done.sequences], done.token, ...params] : params;
    const hook = done?.beforeCommit;
    const rows = hook
      ? await runner.transaction(async (trx) => {
          const claimed = await runner.all(sql, values, trx);
          const ids = claimed[0]?.['completed_ids'];
          await hook(trx, Array.isArray(ids) ? ids.map(String) : []);
          return claimed;
        })
      : await runner.all(sql, values);
    const first = rows[0];
    if (!first) throw new Error('the claim statement returned no token row');
    if (first['switch_scan'] === true) this.#sparseHeads = !sparse;
    return {
      token: toBigInt(first['claim_token']),
      rows: rows.filter((row) => row['seq'] !== null && row['seq'] !== undefined),
      ...(done ? { completed: toNumber(first['completed_count']) } : {}),
    };
  }

  async nextToken<Tx>(runner: SqlExecutor<Tx>, trx: Tx): Promise<bigint> {
    const rows = await runner.all(`SELECT nextval('${this.table('tokenSequence')}') AS value`, [], trx);
    return toBigInt(rows[0]?.['value']);
  }

  async insertInboxRecord<Tx>(runner: SqlExecutor<Tx>, trx: Tx, messageId: string, consumer: string): Promise<boolean> {
    // ON CONFLICT waits for a racing uncommitted insert of the same pair, then does nothing
    // if that one committed: the loser sees a duplicate without aborting its transaction.
    const result = await runner.run(
      `INSERT INTO ${this.table('inbox')} (message_id, consumer, processed_at) VALUES (?, ?, now()) ON CONFLICT (message_id, consumer) DO NOTHING`,
      [messageId, consumer],
      trx,
    );
    return result.affectedRows === 1;
  }

  async recordStart<Tx>(runner: SqlExecutor<Tx>, messageId: string, consumer: string): Promise<number> {
    const rows = await runner.all(
      `INSERT INTO ${this.table('inboxStarts')} AS s (message_id, consumer, starts, updated_at) VALUES (?, ?, 1, now()) ` +
        `ON CONFLICT (message_id, consumer) DO UPDATE SET starts = s.starts + 1, updated_at = now() RETURNING s.starts`,
      [messageId, consumer],
    );
    return toNumber(rows[0]?.['starts']);
  }

  pruneBatchSql(table: CourierObject, column: string, publishedOnly: boolean): string {
    const name = this.table(table);
    const state = publishedOnly ? `state = 'published' AND ` : '';
    // ctid = ANY(ARRAY(...)) plans as a TID scan; SKIP LOCKED leaves rows another
    // transaction holds to a later batch instead of waiting for them.
    return (
      `DELETE FROM ${name} WHERE ctid = ANY (ARRAY(SELECT ctid FROM ${name} WHERE ${state}${column} < (now() - (?::float8 * interval '1 millisecond')) ` +
      `ORDER BY ${column} LIMIT ? FOR UPDATE SKIP LOCKED))`
    );
  }
}

/**
 * Keys (and keyless rows) the sparse head scan visits per claim, as a multiple of the claim's
 * limit. Past it the scan may have missed heads (it still returns only true heads), and says
 * so: the next claim goes back to the dense scan, which is complete.
 */
const SPARSE_REACH = 4;

/**
 * Due rows, as a multiple of the limit, that a dense claim must have passed over while coming
 * back short before the next claim tries the sparse scan: the dense scan then probed every
 * one of them for an earlier row of its key.
 */
const DENSE_WINDOW = 2;

/**
 * The sparse head scan's CTEs (inside `WITH RECURSIVE`): `keyed`, the first row still pending
 * or halted of each key (one descent of the key index per key, a loose index scan; a halted
 * or not-yet-due first row makes the caller's filter drop the key, as the dense scan's probe
 * does), and `keyless`, the oldest keyless rows still pending (each is its own head). Rows of
 * `completed` (the statement's own completion) count as published, as in `headsSql`. Each is
 * cut at `SPARSE_REACH` × limit; {@link sparseOverflowSql} says when a cut may have hidden a head.
 */
function sparseHeadsSql(outbox: string, limit: number, completed: string | undefined): string {
  const reach = SPARSE_REACH * limit;
  const notCompleted = completed === undefined ? '' : ` AND k.seq NOT IN (${completed})`;
  const firstRow = (after: string) =>
    `SELECT k.key_hash, k.seq FROM ${outbox} k WHERE ${after} AND k.state IN ('pending', 'halted')${notCompleted} ORDER BY k.key_hash, k.seq LIMIT 1`;
  return (
    `keys AS ((${firstRow('k.key_hash IS NOT NULL')}) UNION ALL ` +
    `SELECT n.key_hash, n.seq FROM keys p CROSS JOIN LATERAL (${firstRow('k.key_hash > p.key_hash')}) n), ` +
    `keyed AS MATERIALIZED (SELECT seq FROM keys LIMIT ${reach}), ` +
    `keyless AS MATERIALIZED (SELECT k.seq FROM ${outbox} k WHERE k.key_hash IS NULL AND k.state IN ('pending', 'halted')${notCompleted} ` +
    `ORDER BY k.key_hash, k.seq LIMIT ${reach})`
  );
}

/** True when a cut of the sparse scan may have hidden heads: the next claim scans densely. */
function sparseOverflowSql(limit: number): string {
  const reach = SPARSE_REACH * limit;
  return `((SELECT count(*) FROM keyed) >= ${reach} OR (SELECT count(*) FROM keyless) >= ${reach})`;
}

/**
 * True when the dense scan came back short with at least `DENSE_WINDOW` × limit rows due (it
 * probed them all and found few heads: the due rows belong to few keys); counted only then.
 */
function denseShortSql(outbox: string, limit: number): string {
  const window = DENSE_WINDOW * limit;
  return (
    `CASE WHEN (SELECT count(*) FROM claimed) < ${limit} THEN (SELECT count(*) FROM (SELECT 1 FROM ${outbox} w ` +
    `WHERE w.state = 'pending' AND w.available_at <= now() AND ${unleasedSql('w.', 'now()')} ORDER BY w.available_at, w.seq LIMIT ${window}) AS due) >= ${window} ELSE false END`
  );
}

/**
 * The second int of each key's two-int advisory lock, deduplicated and sorted. Two-int
 * advisory locks live in a key space of their own (apart from the one-bigint form
 * applications tend to use); the namespace (first int) keeps outboxes apart.
 */
function lockKeysOf(keyHashes: readonly string[]): number[] {
  return [...new Set(keyHashes.map((hash) => Number.parseInt(hash.slice(0, 8), 16) | 0))].sort((a, b) => a - b);
}
