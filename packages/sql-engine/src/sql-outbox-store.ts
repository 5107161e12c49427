import { createHash } from 'node:crypto';
import {
  acceptEnvelope,
  ConfigError,
  CourierError,
  decodeEnvelope,
  noopLogger,
  payloadBytes,
  StorageError,
  type ClaimedBatch,
  type AppendResult,
  type AsyncAppendFlag,
  type ClaimOptions,
  type CompleteOptions,
  type CompleteAndClaimOptions,
  type CompletedAndClaimed,
  type DeadOutboxRecord,
  type Envelope,
  type HaltedKey,
  type ListOptions,
  type Logger,
  type OutboxAppend,
  type OutboxFailure,
  type OutboxLease,
  type OutboxRecord,
  type OutboxStats,
  type OutboxStore,
  type PendingCompletion,
  type PortLimits,
} from '@courier/core';
import { claimFollowers } from './claim-followers.js';
import { ageSql, completeRows, dueAtSql, headsSql, qualifiedColumns, unleasedSql, type ClaimQuery, type ClaimResult, type CompletionQuery, type DialectName, type PublishedRows, type SqlDialect } from './dialects/sql-dialect.js';
import { toBigInt, toNullableString, toNumber, type SqlRow } from './executor.js';
import { OutboxWakeups, type ListenSource, type PostgresWakeupConfig } from './outbox-wakeups.js';
import { pruneInBatches, throwIfAborted, type SqlStoreCore } from './sql-store-core.js';
import { driverMessage, toStorageError } from './storage-errors.js';

/** The options of {@link SqlOutboxStore} a user sets (through an adapter's config). */
export interface SqlOutboxStoreOptions {
  /** PostgreSQL wake-ups (LISTEN/NOTIFY); `false` turns both off. Ignored elsewhere. */
  readonly wakeups?: PostgresWakeupConfig | false;
  /** Where the store reports background problems (a lost LISTEN connection, a pipelined claim's second step failing). Default silent. */
  readonly logger?: Logger;
  /**
   * What `complete` and `completeAndClaim` do with the rows they complete. Default `'keep'`.
   *
   * - `'keep'`: mark them published (`state = 'published'`, `published_at`); they stay until
   *   `prune(olderThanMs)` deletes them, as an operator's record of what was published.
   * - `'delete'`: delete them in the same statement, instead of the UPDATE. On PostgreSQL this
   *   saves the completion's new row version (payload included) and its index entries
   *   (primary key, `message_id_uq`, `published_ix`) and leaves nothing for `prune` to do
   *   (bench/README.md, "Deleting published rows at completion").
   *
   * Either way the completion takes exactly the rows still pending under the caller's lease
   * (a stale or forged lease completes nothing, a dead or halted row is never touched) and
   * returns their count; per-key order is unchanged, since a key's next row waits only for
   * earlier rows still pending or halted, and a row that is gone is no longer one of them.
   *
   * Trade-offs of `'delete'`:
   * - **messageId uniqueness ends at publication.** The unique key covers only rows in the
   *   table, so once a message is published and its row deleted, appending a message with the
   *   same messageId succeeds and publishes it again (with `'keep'` the same happens once
   *   `prune` removed the row: the window is the retention instead of zero). Producers that
   *   derive ids deterministically to make retries idempotent must not rely on the outbox to
   *   refuse a late retry; the consumers' inbox still deduplicates it for as long as it keeps
   *   the record.
   * - **No published history in the table**: nothing to query for "was X published, when,
   *   by which relay". `stats()` is the same in both modes (it never counted published rows:
   *   pending, in flight, dead, halted keys); the relay's `published` counter and traces
   *   remain the record of publication.
   * - `prune` still deletes published rows older than the cutoff: rows kept before the
   *   store was switched to `'delete'` (or by another store instance in `'keep'` on the same
   *   tables, which works side by side); otherwise it finds none.
   * - `listDead`, `replay`, `purge`, `listHalted` and `resume` act on dead and halted rows
   *   only, which a completion never deletes: they are unaffected.
   */
  readonly publishedRows?: PublishedRows;
}

/**
 * How the engine writes rows a join collected: the adapter's {@link OutboxJoin} calls these.
 * `write` runs in the caller's transaction `tx` (key locks, then the inserts; errors become
 * `StorageError`s, a duplicate messageId `DUPLICATE_MESSAGE_ID`), holding the INSERT to
 * `guard` when one is given; `writeAlone` does the same in a transaction of its own (for a
 * data layer that hands rows over after its commit); `committed` is called once rows
 * committed (wakes relays).
 */
export interface OutboxWriter<Tx> {
  write(rows: readonly OutboxPendingRow[], tx: Tx, guard?: InsertGuard): Promise<void>;
  writeAlone(rows: readonly OutboxPendingRow[]): Promise<void>;
  committed(): void;
}

/**
 * A condition the database must find true for a write to happen, checked by the write's own
 * INSERT (`INSERT … SELECT … WHERE <sql>`), so it costs no statement of its own: mysql2's
 * "this connection is inside a transaction" (`@@in_transaction`), which only the server knows.
 *
 * Guarantees: when the condition is false nothing is written and the write rejects with
 * `refused()`'s error, unchanged. Where the dialect cannot carry a condition in the INSERT
 * (MySQL/MariaDB with several rows: no multi-row SELECT source both spell alike) it is checked
 * by a `SELECT` of its own first, in the same transaction, which also takes the key locks
 * (one statement in place of the lock statement such an append sends anyway).
 * Only the first INSERT of a write carries it: once it wrote, the condition held.
 */
export interface InsertGuard {
  /** A boolean SQL expression without placeholders, evaluated once per write in `tx`'s session. */
  readonly sql: string;
  /** The error the write rejects with when the condition is false (a `ConfigError` naming the fix, say). */
  refused(): CourierError;
}

/**
 * How an adapter joins the caller's unit of work `Unit` (an EntityManager, a `pg` client in
 * `BEGIN`, a Kysely `Transaction`): `resolve` checks that `unit` can carry rows (else a
 * `ConfigError` naming the fix, never a silent autocommit) before any message is validated,
 * and `add` hands it validated rows, which must then be written with the
 * {@link OutboxWriter} in `unit`'s transaction — committed with it or not at all.
 */
export interface OutboxJoin<Unit, Target, A extends AppendResult = void> {
  resolve(unit: Unit): Target;
  /**
   * Hands validated rows to the unit of work. A join that queues them (MikroORM, written at
   * its flush) returns nothing; a join that writes at once returns the writer's promise,
   * which the caller must await before committing, and sets {@link asyncAppend}.
   */
  add(target: Target, rows: OutboxPendingRow[]): A;
  /** True when `add` writes at once and returns a promise; the store declares the same (`OutboxEngine.asyncAppend`). */
  readonly asyncAppend?: AsyncAppendFlag<A>;
}

/** What {@link SqlOutboxStore} is built from: an adapter's core and join, and the user's options. */
export interface SqlOutboxStoreConfig<Unit, Tx, Target, A extends AppendResult = void> extends SqlOutboxStoreOptions {
  readonly core: SqlStoreCore<Tx>;
  /** Builds the adapter's join over the engine's writer. */
  readonly join: (writer: OutboxWriter<Tx>) => OutboxJoin<Unit, Target, A>;
  /** Where PostgreSQL LISTEN connections come from, if the adapter has one (without it relays in other processes poll). */
  readonly listenSource?: ListenSource | undefined;
}

/** A validated row `append` hands to the join, written in the caller's transaction. */
export interface OutboxPendingRow {
  readonly envelope: Envelope;
  readonly keyHash: string | null;
  readonly delayMs: number;
  readonly notBeforeMs: number | null;
}

const INSERT_COLUMNS =
  'message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, causation_id, traceparent, tracestate, headers, payload, state, attempts, available_at, first_due_at, created_at';
// Keep each INSERT well under MySQL's default max_allowed_packet (16-64 MiB).
const MAX_INSERT_BYTES = 4 * 1024 * 1024;
const DEFAULT_LIST_LIMIT = 100;
const DEFAULT_PRUNE_BATCH = 1_000;

/**
 * The SQL outbox on any adapter: one store for PostgreSQL, MySQL/MariaDB and SQLite, with
 * the dialect SQL in small dialects; the adapter supplies the executor ({@link SqlStoreCore})
 * and how to join the caller's unit of work ({@link OutboxJoin}).
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(unit, …)` joins `unit` through the adapter's {@link OutboxJoin}: the rows are
 *   written in the caller's transaction, or not at all (see the adapter for what a unit is
 *   and which ones it refuses with a `ConfigError`).
 * - A transaction takes the key locks of all its rows in one sorted pass at its commit,
 *   however many flushes appended them, so producers never deadlock on each other.
 * - Appends of one (topic, key) are serialised by a transaction-scoped lock taken right
 *   before the insert, so sequence order is commit order and no row is claimable before an
 *   earlier-committed row of its key (SQLite's single writer gives the same for free).
 * - `claim` compares only with the database clock, returns due head-of-key rows under a
 *   lease with a strictly increasing fencing token; concurrent claims never share a row
 *   (`FOR UPDATE SKIP LOCKED`; SQLite has one writer). `complete`, `fail` and `release`
 *   change only rows whose current lease token is the caller's. `completeAndClaim` does a
 *   `complete` and a head claim in one transaction (one statement on PostgreSQL). A
 *   completion marks its rows published or, with `publishedRows: 'delete'`, deletes them
 *   (same rows, same count; see {@link SqlOutboxStoreOptions.publishedRows}).
 * - With `perKey > 1` the heads are claimed exactly as with `perKey: 1` (with the
 *   completion, if any); only when they leave room in the batch and some are keyed, a
 *   second short transaction adds the rows right behind each head that is still held by
 *   the lease (contiguous, pending, due, not locked elsewhere, at most `perKey - 1` per key)
 *   under the same lease. The batch is one lease, sorted by sequence. If that second step
 *   fails, the batch is returned with its heads only (the failure is logged): the first
 *   step has committed and stays valid. MySQL/MariaDB instead claim heads and followers in
 *   one transaction that takes the token's counter row first (InnoDB deadlocked between
 *   the two steps of different relays under load; see `#claimRunsInnoDb`).
 * - Payload and headers are stored as text, byte for byte.
 * - Database errors become `StorageError` (retriable for lost connections, deadlocks, lock
 *   and statement timeouts, serialization failures); a missing or outdated schema is a
 *   `StorageError` with code `SCHEMA_MISSING` that says how to create it.
 */
export class SqlOutboxStore<Unit, Tx, Target = unknown, A extends AppendResult = void> implements OutboxStore<Unit, A> {
  /** True when the adapter's join writes at append (its `append` returns a promise to await before committing). */
  readonly asyncAppend: AsyncAppendFlag<A>;
  /** The SQL family in use. */
  readonly dialect: DialectName;
  /** What a completion does with its rows: see {@link SqlOutboxStoreOptions.publishedRows}. */
  readonly publishedRows: PublishedRows;
  /** The column sizes (`varchar(n)` counts characters), the same on every dialect: the bus refuses longer fields at `publish()`. */
  readonly limits: PortLimits = Object.freeze({ id: { chars: 200 }, type: { chars: 200 }, topic: { chars: 249 }, key: { chars: 1024 } });
  readonly #core: SqlStoreCore<Tx>;
  readonly #join: OutboxJoin<Unit, Target, A>;
  readonly #wakeups: OutboxWakeups;
  readonly #logger: Logger;

  constructor(config: SqlOutboxStoreConfig<Unit, Tx, Target, A>) {
    const publishedRows = config.publishedRows ?? 'keep';
    if (publishedRows !== 'keep' && publishedRows !== 'delete') {
      throw new ConfigError(`'publishedRows' must be 'keep' or 'delete', got ${JSON.stringify(publishedRows)}`);
    }
    this.publishedRows = publishedRows;
    this.#core = config.core;
    this.dialect = this.#core.dialect.name;
    this.#logger = config.logger ?? noopLogger;
    this.#wakeups = new OutboxWakeups({
      runner: this.#core.runner,
      channel: this.dialect === 'postgresql' ? this.#core.names.channel : undefined,
      config: config.wakeups,
      logger: this.#logger,
      source: this.dialect === 'postgresql' ? config.listenSource : undefined,
    });
    this.#join = config.join({
      write: (rows, tx, guard) => this.#insert(rows, tx, guard),
      writeAlone: (rows) => this.#core.runner.transaction((tx) => this.#insert(rows, tx)),
      committed: () => this.#wakeups.signal(),
    });
    this.asyncAppend = (this.#join.asyncAppend === true) as AsyncAppendFlag<A>;
  }

  /**
   * Hands `messages` to the adapter's join for `tx`'s unit of work, which writes them in its
   * transaction. Validates everything first and hands over nothing on error
   * (`ConfigError` from the join for a unit that cannot carry the rows, then
   * `SerializationError` for a malformed envelope, `ConfigError` for a bad schedule). A
   * duplicate messageId makes the write fail with a `StorageError` of code
   * `DUPLICATE_MESSAGE_ID`. With a join that writes at once ({@link asyncAppend}) every
   * failure, a refusal included, comes as the returned promise's rejection.
   */
  append(tx: Unit, messages: readonly OutboxAppend[]): A {
    if (this.asyncAppend !== true) return this.#append(tx, messages);
    try {
      return this.#append(tx, messages);
    } catch (error) {
      return Promise.reject(error as Error) as A;
    }
  }

  #append(tx: Unit, messages: readonly OutboxAppend[]): A {
    this.#core.assertOpen();
    const target = this.#join.resolve(tx);
    const rows: OutboxPendingRow[] = [];
    const problems: string[] = [];
    for (let index = 0; index < messages.length; index += 1) {
      const message = messages[index]!;
      // An envelope core's publish built and checked is taken as it is; any other is
      // validated in full (SerializationError listing every problem).
      const envelope = acceptEnvelope(message.envelope);
      const delayMs = message.delayMs ?? 0;
      if (typeof delayMs !== 'number' || !Number.isFinite(delayMs) || delayMs < 0) {
        problems.push(`'messages[${index}].delayMs' must be a finite number of 0 or more, got ${String(delayMs)}`);
      }
      let notBeforeMs: number | null = null;
      if (message.notBefore !== undefined) {
        notBeforeMs = message.notBefore instanceof Date ? message.notBefore.getTime() : Number.NaN;
        if (Number.isNaN(notBeforeMs)) problems.push(`'messages[${index}].notBefore' must be a valid Date`);
      }
      rows.push({ envelope, keyHash: keyHash(envelope.topic, envelope.key), delayMs: Math.round(delayMs), notBeforeMs });
    }
    if (problems.length > 0) throw new ConfigError(problems);
    return this.#join.add(target, rows);
  }

  /**
   * Claims up to `limit` due head-of-key rows (up to `perKey` contiguous rows per key) under
   * a new lease, returned sorted by sequence. `perKey > 1`: heads first, then rows behind
   * them in a second transaction under the same lease (MySQL/MariaDB: in the same one; see
   * the class comment).
   */
  async claim(options: ClaimOptions): Promise<ClaimedBatch> {
    return this.#claim(options, undefined);
  }

  /**
   * `complete(done.lease, done.sequences)` and `claim(options)` in one transaction (on
   * PostgreSQL one statement): the completion and the claim of the heads both commit or
   * neither does, and `options.beforeCommit` runs once, between them and that COMMIT. With
   * `perKey > 1`, the rows behind the heads are then added in a second transaction under
   * the same lease (never claimed without their head; on MySQL/MariaDB in the same
   * transaction; see the class comment). The claim
   * sees the completion on every dialect (PostgreSQL's one statement counts the rows it
   * completes as published), so it may take the next row of a key it completed at once.
   */
  async completeAndClaim(done: PendingCompletion, options: CompleteAndClaimOptions): Promise<CompletedAndClaimed> {
    const token = done.lease.token.toString();
    const sequences = done.sequences.map(String);
    const hook = options.beforeCommit;
    // With the fault hook: the same statements, in a transaction held open while the hook
    // runs, so a test can kill the process after the combined statement and before COMMIT.
    // The dialect hands over the ids of the rows its completion changed (read before it on
    // the dialects that cannot return them: a deleting completion leaves nothing after it).
    const beforeCommit = hook
      ? async (_trx: Tx, completedIds: readonly string[]) => {
          await hook('complete-before-commit', { messageIds: completedIds });
          throwIfAborted(options.signal, 'claim');
        }
      : undefined;
    const batch = await this.#claim(options, { token, sequences, publishedRows: this.publishedRows, ...(beforeCommit ? { beforeCommit } : {}) });
    return { ...batch, completed: batch.completed ?? 0 };
  }

  async #claim(options: ClaimOptions, done: CompletionQuery<Tx> | undefined): Promise<ClaimedBatch & { completed?: number }> {
    const problems: string[] = [];
    if (typeof options.owner !== 'string' || options.owner.length === 0 || options.owner.length > 200) {
      problems.push(`'owner' must be a non-empty string of at most 200 characters`);
    }
    if (!Number.isSafeInteger(options.limit) || options.limit < 1) problems.push(`'limit' must be an integer of 1 or more`);
    if (!(options.leaseMs > 0) || !Number.isFinite(options.leaseMs)) problems.push(`'leaseMs' must be more than 0`);
    if (!Number.isSafeInteger(options.perKey) || options.perKey < 1) problems.push(`'perKey' must be an integer of 1 or more`);
    if (problems.length > 0) throw new ConfigError(problems);
    return this.#core.operation('claim', options.signal, async () => {
      const { dialect, runner } = this.#core;
      const query = { owner: options.owner, limit: options.limit, leaseMs: Math.ceil(options.leaseMs) };
      // The heads (and the completion, and its fault hook) in the dialect's one-statement
      // claim, whatever perKey: the followers are a second step, under the same lease —
      // except on InnoDB, where a pipelined claim is one transaction (see #claimRunsInnoDb).
      const inOneTransaction = options.perKey > 1 && dialect.name === 'mysql';
      const result = inOneTransaction ? await this.#claimRunsInnoDb(query, options.perKey, done) : await dialect.claimHeads(runner, query, done);
      const records = result.rows.map((row) => toRecord(row));
      if (!inOneTransaction && options.perKey > 1 && records.length < options.limit) records.push(...(await this.#claimFollowers(query, options, result.token, records)));
      records.sort((a, b) => (a.sequence < b.sequence ? -1 : a.sequence > b.sequence ? 1 : 0));
      return { lease: { owner: options.owner, token: result.token }, records, ...(result.completed === undefined ? {} : { completed: result.completed }) };
    });
  }

  /**
   * MySQL/MariaDB's pipelined claim (`perKey > 1`): one transaction, heads first (locked,
   * SKIP LOCKED), then up to `perKey - 1` rows right behind each keyed head while they are
   * pending and due. Locks are taken in one order (the token's counter row, then rows) and
   * every row updated is locked first, so two such claims never wait for each other in a
   * cycle. Kept for InnoDB instead of the two-step claim (heads, then `claimFollowers`):
   * there a head claim (rows, then the counter row) and a follower step of another relay
   * deadlocked under load (CI, 1 deadlock in a 4 s soak of 3 claimers at load ~7), and the
   * two-step claim measured no gain on MariaDB (1,417 vs 1,535 rows/s, within the noise).
   */
  async #claimRunsInnoDb(query: ClaimQuery, perKey: number, done: CompletionQuery<Tx> | undefined): Promise<ClaimResult> {
    const { dialect, runner } = this.#core;
    const outbox = dialect.table('outbox');
    return runner.transaction(
      async (trx) => {
        // The token first: its counter row (MySQL/MariaDB, SQLite) is the first lock of every
        // pipelined claim, so they take turns and lock rows in one order. A head scan holds
        // locks on index entries of rows it passed over; taken after the rows, the token row
        // let a claim updating its followers wait for such an entry held by a claim that in
        // turn waited for the token row (InnoDB deadlock). Still greater than the token of
        // any lease it supersedes: that claim committed before this one could lock its rows,
        // and drew its token before this one got the counter.
        const token = await dialect.nextToken(runner, trx);
        // The completion right after the token (so the token row stays the first lock): it
        // touches only rows of its own lease, which every claim skips, and the heads see it.
        const completion = done === undefined ? undefined : await completeRows(dialect, runner, done, trx, done.beforeCommit !== undefined);
        const completed = completion?.count;
        const heads = await runner.all(headsSql(dialect, 'o.seq, o.key_hash', dialect.lockSkipLocked), [query.limit], trx);
        const chosen: string[] = heads.map((row) => String(row['seq']));
        const keyed = heads.filter((row) => row['key_hash'] !== null && row['key_hash'] !== undefined);
        if (keyed.length > 0 && chosen.length < query.limit) {
          // One ordered, LIMITed index range per head (key_hash, then seq): no sort, no
          // visit of the key's published history.
          const parts = keyed.map(
            (_, index) =>
              `SELECT * FROM (SELECT seq, key_hash, CASE WHEN available_at <= ${dialect.now} AND ${unleasedSql('', dialect.now)} THEN 1 ELSE 0 END AS due FROM ${outbox} ` +
              `WHERE key_hash = ? AND state = 'pending' AND seq > ? ORDER BY seq LIMIT ?) AS run${index}`,
          );
          const followers = await runner.all(
            parts.join(' UNION ALL '),
            keyed.flatMap((row) => [String(row['key_hash']), String(row['seq']), perKey - 1]),
            trx,
          );
          // A halted row behind the head (halted while pipelined) ends the run there.
          const halted = await runner.all(`SELECT key_hash, seq FROM ${outbox} WHERE key_hash IN (?) AND state = 'halted'`, [keyed.map((row) => String(row['key_hash']))], trx);
          const firstHalted = new Map<string, bigint>();
          for (const row of halted) {
            const key = String(row['key_hash']);
            const seq = toBigInt(row['seq']);
            const known = firstHalted.get(key);
            if (known === undefined || seq < known) firstHalted.set(key, seq);
          }
          const ordered = followers
            .map((row) => ({ key: String(row['key_hash']), seq: toBigInt(row['seq']), due: toNumber(row['due']) === 1 }))
            .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0));
          const stopped = new Set<string>();
          const runs = new Map<string, string[]>();
          let room = query.limit - chosen.length;
          for (const row of ordered) {
            if (room === 0) break;
            if (stopped.has(row.key)) continue;
            const halt = firstHalted.get(row.key);
            if (!row.due || (halt !== undefined && row.seq > halt)) {
              stopped.add(row.key);
              continue;
            }
            runs.set(row.key, [...(runs.get(row.key) ?? []), row.seq.toString()]);
            room -= 1;
          }
          // Lock what we update: the followers were read without locks. Ascending seq,
          // skipping rows held elsewhere, so the UPDATE below never waits; a run ends at its
          // first row not locked here, still pending and due, so it stays contiguous.
          const wanted = [...runs.values()].flat();
          if (wanted.length > 0) {
            const locked = await runner.all(
              `SELECT o.seq FROM ${outbox} o WHERE o.seq IN (?) AND o.state = 'pending' AND o.available_at <= ${dialect.now} AND ${unleasedSql('o.', dialect.now)} ORDER BY o.seq${dialect.lockSkipLocked}`,
              [wanted],
              trx,
            );
            const lockedSeqs = new Set(locked.map((row) => String(row['seq'])));
            for (const run of runs.values()) {
              for (const seq of run) {
                if (!lockedSeqs.has(seq)) break;
                chosen.push(seq);
              }
            }
          }
        }
        const outcome = completed === undefined ? {} : { completed };
        if (chosen.length === 0) {
          await done?.beforeCommit?.(trx, completion?.ids ?? []);
          return { token, rows: [], ...outcome };
        }
        // Read before the UPDATE writes the lease (an expired one is what the age counts from).
        // Every chosen row is locked by this transaction, so the UPDATE finds them as read.
        const rows = await runner.all(`SELECT ${qualifiedColumns('o')}, ${ageSql(dialect, 'o')} FROM ${outbox} o WHERE o.seq IN (?)`, [chosen], trx);
        await runner.run(
          `UPDATE ${outbox} SET lease_owner = ?, lease_token = ?, leased_until = ${dialect.plusMs(dialect.now)} WHERE seq IN (?)`,
          [query.owner, token.toString(), query.leaseMs, chosen],
          trx,
        );
        await done?.beforeCommit?.(trx, completion?.ids ?? []);
        return { token, rows, ...outcome };
      },
      { readCommitted: dialect.readCommitted },
    );
  }

  /**
   * Ordered pipelining: up to `perKey - 1` rows right behind each keyed head the claim
   * just leased, under its lease (see `claimFollowers`). The heads' claim has committed
   * (with its completion), so a failure here must not undo or hide it: it is logged and
   * the batch goes out with its heads alone (the followers stay due for the next claim);
   * an abort skips this step the same way.
   */
  async #claimFollowers(query: ClaimQuery, options: ClaimOptions, token: bigint, heads: readonly OutboxRecord[]): Promise<OutboxRecord[]> {
    const keyed = heads.flatMap((record) => (record.envelope.key === null ? [] : [record.sequence.toString()]));
    if (keyed.length === 0 || options.signal?.aborted) return [];
    try {
      const rows = await claimFollowers(this.#core.dialect, this.#core.runner, query, { heads: keyed, token, room: options.limit - heads.length, perKey: options.perKey });
      return rows.map((row) => toRecord(row));
    } catch (error) {
      this.#logger.warn('outbox claim: claiming the rows behind the heads failed; the batch has its heads only', {
        error: toStorageError(error, 'claim', this.#core.schemaHint).message,
      });
      return [];
    }
  }

  /**
   * Completes rows held by `lease`: marks them published, or deletes them with
   * `publishedRows: 'delete'`; only rows still pending under `lease` (a stale or forged lease
   * completes nothing), and returns how many. With `beforeCommit`, the completion runs in a
   * transaction and the hook is called (with the completed rows' ids) after it and before
   * COMMIT; if the hook throws, nothing changes.
   */
  async complete(lease: OutboxLease, sequences: readonly bigint[], options: CompleteOptions = {}): Promise<number> {
    return this.#core.operation('complete', options.signal, async () => {
      const { dialect, runner } = this.#core;
      if (sequences.length === 0) return 0;
      const done = { token: lease.token.toString(), sequences: sequences.map(String), publishedRows: this.publishedRows };
      const hook = options.beforeCommit;
      // Without the hook, one statement and its own commit (no BEGIN/COMMIT round trips).
      if (!hook) return (await completeRows(dialect, runner, done, undefined)).count;
      return runner.transaction(
        async (trx) => {
          const completed = await completeRows(dialect, runner, done, trx, true);
          await hook('complete-before-commit', { messageIds: completed.ids ?? [] });
          throwIfAborted(options.signal, 'complete');
          return completed.count;
        },
        { readCommitted: dialect.readCommitted },
      );
    });
  }

  /** Records failures of rows held by `lease`: counts an attempt, then reschedules (database clock), kills or halts each. */
  async fail(lease: OutboxLease, failures: readonly OutboxFailure[], options: { signal?: AbortSignal } = {}): Promise<number> {
    return this.#core.operation('fail', options.signal, async () => {
      const { dialect, runner } = this.#core;
      if (failures.length === 0) return 0;
      const outbox = dialect.table('outbox');
      // The code and name describe the last failure, as last_error does; first_failed_at is
      // kept from the first failure until a replay clears it.
      const common =
        `attempts = attempts + 1, last_error = ?, error_code = ?, error_name = ?, failed_at = ${dialect.now}, ` +
        `first_failed_at = COALESCE(first_failed_at, ${dialect.now}), lease_owner = NULL, lease_token = NULL, leased_until = NULL`;
      const where = `WHERE seq = ? AND state = 'pending' AND lease_token = ?`;
      return runner.transaction(
        async (trx) => {
          let changed = 0;
          for (const failure of failures) {
            const result =
              failure.outcome === 'retry'
                ? await runner.run(`UPDATE ${outbox} SET ${common}, available_at = ${dialect.plusMs(dialect.now)} ${where}`, [
                    failure.error,
                    failure.code ?? null,
                    failure.errorName ?? null,
                    Math.max(0, Math.round(failure.delayMs)),
                    failure.sequence.toString(),
                    lease.token.toString(),
                  ], trx)
                : await runner.run(`UPDATE ${outbox} SET ${common}, state = ? ${where}`, [
                    failure.error,
                    failure.code ?? null,
                    failure.errorName ?? null,
                    failure.outcome === 'dead' ? 'dead' : 'halted',
                    failure.sequence.toString(),
                    lease.token.toString(),
                  ], trx);
            changed += result.affectedRows;
          }
          return changed;
        },
        { readCommitted: dialect.readCommitted },
      );
    });
  }

  /** Gives rows held by `lease` back without counting an attempt, due after `delayMs` (database clock). */
  async release(lease: OutboxLease, sequences: readonly bigint[], delayMs = 0): Promise<number> {
    const changed = await this.#core.operation('release', undefined, async () => {
      const { dialect, runner } = this.#core;
      if (sequences.length === 0) return 0;
      const result = await runner.run(
        `UPDATE ${dialect.table('outbox')} SET available_at = ${dialect.plusMs(dialect.now)}, lease_owner = NULL, lease_token = NULL, leased_until = NULL ` +
          `WHERE seq IN (?) AND state = 'pending' AND lease_token = ?`,
        [Math.max(0, Math.round(delayMs)), sequences.map(String), lease.token.toString()],
      );
      return result.affectedRows;
    });
    if (changed > 0) this.#wakeups.signal();
    return changed;
  }

  /**
   * Extends the lease of rows still held by `lease` to `leaseMs` from now (database clock):
   * one UPDATE by primary key, fenced by the lease token, so rows another relay re-claimed
   * are not touched. Returns how many it extended.
   */
  async renew(lease: OutboxLease, sequences: readonly bigint[], leaseMs: number, options: { signal?: AbortSignal } = {}): Promise<number> {
    if (!(leaseMs > 0) || !Number.isFinite(leaseMs)) throw new ConfigError(`'leaseMs' must be more than 0`);
    return this.#core.operation('renew', options.signal, async () => {
      const { dialect, runner } = this.#core;
      if (sequences.length === 0) return 0;
      // The lease's end is `leased_until` (a claim writes it there), so extending it keeps
      // the rows from every claim until then, exactly as the claim did.
      const result = await runner.run(
        `UPDATE ${dialect.table('outbox')} SET leased_until = ${dialect.plusMs(dialect.now)} WHERE seq IN (?) AND state = 'pending' AND lease_token = ?`,
        [Math.ceil(leaseMs), [...new Set(sequences.map(String))], lease.token.toString()],
      );
      return result.affectedRows;
    });
  }

  /**
   * Calls `listener` soon after a commit appended rows (in this process immediately; from
   * other processes through LISTEN/NOTIFY on PostgreSQL), and after `release`, `replay`
   * and `resume` made rows claimable. Resolves with a function that stops listening.
   * Signals may be coalesced or spurious; relays still poll as a safety net.
   */
  async watch(listener: () => void): Promise<() => Promise<void>> {
    this.#core.assertOpen();
    return this.#wakeups.watch(listener);
  }

  /**
   * Counts: `pending` includes rows in flight; `inFlight` are pending rows under a live lease;
   * `dead` rows; `haltedKeys`. Published rows are not counted, so the figures are the same
   * whether completions keep them or delete them (`publishedRows`).
   */
  async stats(): Promise<OutboxStats> {
    return this.#core.operation('stats', undefined, async () => {
      const { dialect, runner } = this.#core;
      const outbox = dialect.table('outbox');
      const [pending] = await runner.all(
        `SELECT COUNT(*) AS pending, ` +
          `SUM(CASE WHEN lease_token IS NOT NULL AND leased_until > ${dialect.now} THEN 1 ELSE 0 END) AS in_flight, ` +
          `${dialect.epochMs(dialect.now)} - ${dialect.epochMs(`MIN(CASE WHEN ${backlogSql(dialect)} THEN ${firstDueSql(dialect)} END)`)} AS oldest_age ` +
          `FROM ${outbox} WHERE state = 'pending'`,
      );
      const [failed] = await runner.all(
        `SELECT SUM(CASE WHEN state = 'dead' THEN 1 ELSE 0 END) AS dead, ` +
          `COUNT(DISTINCT CASE WHEN state = 'halted' THEN key_hash END) + SUM(CASE WHEN state = 'halted' AND key_hash IS NULL THEN 1 ELSE 0 END) AS halted_keys ` +
          `FROM ${outbox} WHERE state IN ('dead', 'halted')`,
      );
      return {
        pending: toNumber(pending?.['pending']),
        oldestPendingAgeMs: Math.max(0, toNumber(pending?.['oldest_age'])),
        inFlight: toNumber(pending?.['in_flight']),
        dead: toNumber(failed?.['dead']),
        haltedKeys: toNumber(failed?.['halted_keys']),
      };
    });
  }

  /**
   * Deletes published rows published at least `olderThanMs` ago (database clock), in
   * statements of at most `batchSize` rows (default 1000) that each commit on their own,
   * skipping rows another transaction holds; producers never wait for it. With
   * `publishedRows: 'delete'` completions leave no published rows, so it deletes only those
   * kept earlier (before the switch, or by a `'keep'` store on the same tables).
   */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    const batchSize = options.batchSize ?? DEFAULT_PRUNE_BATCH;
    if (!Number.isSafeInteger(batchSize) || batchSize < 1) throw new ConfigError(`'batchSize' must be an integer of 1 or more`);
    if (!Number.isFinite(olderThanMs) || olderThanMs < 0) throw new ConfigError(`'olderThanMs' must be a finite number of 0 or more`);
    return this.#core.operation('prune', options.signal, () =>
      pruneInBatches(this.#core, 'outbox', 'published_at', true, olderThanMs, batchSize, options.signal),
    );
  }

  /** Lists dead rows in sequence order (keyset pagination with `after`). */
  async listDead(options: ListOptions = {}): Promise<readonly DeadOutboxRecord[]> {
    return this.#core.operation('listDead', undefined, async () => {
      const { dialect, runner } = this.#core;
      const params: unknown[] = [];
      let where = `o.state = 'dead'`;
      if (options.after !== undefined) {
        where += ' AND o.seq > ?';
        params.push(options.after.toString());
      }
      if (options.topic !== undefined) {
        where += ' AND o.topic = ?';
        params.push(options.topic);
      }
      params.push(listLimit(options.limit));
      const rows = await runner.all(
        `SELECT ${qualifiedColumns('o')}, ${failureColumns(dialect, 'o')} FROM ${dialect.table('outbox')} o ` +
          `WHERE ${where} ORDER BY o.seq LIMIT ?`,
        params,
      );
      return rows.map((row) => toDeadRecord(row));
    });
  }

  /** Makes dead or halted rows pending again, due now, with the same messageId and zero attempts. */
  async replay(sequences: readonly bigint[]): Promise<number> {
    const changed = await this.#core.operation('replay', undefined, async () => {
      const { dialect, runner } = this.#core;
      if (sequences.length === 0) return 0;
      const result = await runner.run(
        `UPDATE ${dialect.table('outbox')} SET ${resetColumns(dialect.now)} WHERE seq IN (?) AND state IN ('dead', 'halted')`,
        [sequences.map(String)],
      );
      return result.affectedRows;
    });
    if (changed > 0) this.#wakeups.signal();
    return changed;
  }

  /** Deletes dead rows; rows in any other state (halted included) are left alone. */
  async purge(sequences: readonly bigint[]): Promise<number> {
    return this.#core.operation('purge', undefined, async () => {
      const { dialect, runner } = this.#core;
      if (sequences.length === 0) return 0;
      const result = await runner.run(`DELETE FROM ${dialect.table('outbox')} WHERE seq IN (?) AND state = 'dead'`, [sequences.map(String)]);
      return result.affectedRows;
    });
  }

  /** Lists halted keys ordered by their head's sequence, with the count of pending rows held behind each head. */
  async listHalted(options: ListOptions = {}): Promise<readonly HaltedKey[]> {
    return this.#core.operation('listHalted', undefined, async () => {
      const { dialect, runner } = this.#core;
      const outbox = dialect.table('outbox');
      const params: unknown[] = [];
      let where = `h.state = 'halted' AND h.key_hash IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ${outbox} x WHERE x.key_hash = h.key_hash AND x.state = 'halted' AND x.seq < h.seq)`;
      if (options.after !== undefined) {
        where += ' AND h.seq > ?';
        params.push(options.after.toString());
      }
      if (options.topic !== undefined) {
        where += ' AND h.topic = ?';
        params.push(options.topic);
      }
      params.push(listLimit(options.limit));
      const rows = await runner.all(
        `SELECT ${qualifiedColumns('h')}, ${failureColumns(dialect, 'h')}, ` +
          `(SELECT COUNT(*) FROM ${outbox} p WHERE p.key_hash = h.key_hash AND p.state = 'pending' AND p.seq > h.seq) AS held ` +
          `FROM ${outbox} h WHERE ${where} ORDER BY h.seq LIMIT ?`,
        params,
      );
      return rows.map((row) => {
        const head = toDeadRecord(row);
        return { topic: head.envelope.topic, key: head.envelope.key ?? '', head, held: toNumber(row['held']) };
      });
    });
  }

  /** Resumes a halted key: `retry` makes its halted head pending with zero attempts, `park` marks it dead. */
  async resume(topic: string, key: string, action: 'retry' | 'park'): Promise<number> {
    if (action !== 'retry' && action !== 'park') throw new ConfigError(`'action' must be 'retry' or 'park', got ${JSON.stringify(action)}`);
    const changed = await this.#core.operation('resume', undefined, async () => {
      const { dialect, runner } = this.#core;
      const set = action === 'retry' ? resetColumns(dialect.now) : `state = 'dead'`;
      const result = await runner.run(`UPDATE ${dialect.table('outbox')} SET ${set} WHERE key_hash = ? AND topic = ? AND msg_key = ? AND state = 'halted'`, [
        keyHash(topic, key),
        topic,
        key,
      ]);
      return result.affectedRows;
    });
    if (changed > 0 && action === 'retry') this.#wakeups.signal();
    return changed;
  }

  /** Creates the Courier tables, indexes and seed rows that are missing (idempotent). Prefer the migrations in production. */
  async ensureSchema(): Promise<void> {
    await this.#core.ensureSchema();
  }

  /** Throws a `StorageError` with code `SCHEMA_MISSING` (and the remedy) unless the schema is present at this release's version. */
  async checkSchema(): Promise<void> {
    this.#core.assertOpen();
    await this.#core.checkSchema();
  }

  /**
   * Refuses new calls, waits for in-flight ones, stops wake-ups (closing the LISTEN
   * connection). Does not close the caller's database handle. Idempotent. Rows already
   * handed to a join are still written by it (MikroORM: by the unit of work's flush).
   */
  async close(): Promise<void> {
    await this.#core.close();
    await this.#wakeups.close();
  }

  /** Same as {@link SqlOutboxStore.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #insert(rows: readonly OutboxPendingRow[], trx: Tx, guard?: InsertGuard): Promise<void> {
    const { dialect, runner } = this.#core;
    try {
      const keyHashes = rows.flatMap((row) => (row.keyHash === null ? [] : [row.keyHash]));
      // The locks come first: the sequence is drawn by the insert, after them, so a later
      // appender of the same key always draws a greater one. Where the dialect can, they
      // ride in the first INSERT (one round trip less per producing transaction, while the
      // transaction holds its entity changes' row locks); otherwise a statement of their own.
      let locks = dialect.keyLockCondition?.(keyHashes, rows.length);
      // The guard rides in the first INSERT where that INSERT can be an INSERT … SELECT; else
      // (MySQL/MariaDB, several rows) a SELECT of its own, which also takes the key locks
      // (the dialect's one-row condition, which a SELECT carries as an INSERT does): the
      // append stays at two statements, and nothing is locked or written when it is false.
      let check = guard;
      let locked = false;
      if (guard !== undefined && locks === undefined && rows.length > 1 && dialect.name === 'mysql') {
        const withLocks = dialect.keyLockCondition?.(keyHashes, 1);
        const [row] = await runner.all(`SELECT CASE WHEN (${guard.sql})${withLocks === undefined ? '' : ` AND ${withLocks.sql}`} THEN 1 ELSE 0 END AS ok`, withLocks?.params ?? [], trx);
        if (Number(row?.['ok']) !== 1) throw guard.refused();
        check = undefined;
        locked = withLocks !== undefined;
      }
      if (locks === undefined && !locked) await dialect.lockKeys(runner, trx, keyHashes);
      let chunk: OutboxPendingRow[] = [];
      let bytes = 0;
      for (const row of rows) {
        const size = payloadBytes(row.envelope) + 1024;
        if (chunk.length > 0 && bytes + size > MAX_INSERT_BYTES) {
          await this.#insertChunk(chunk, trx, locks, check);
          locks = undefined;
          check = undefined;
          chunk = [];
          bytes = 0;
        }
        chunk.push(row);
        bytes += size;
      }
      if (chunk.length > 0) await this.#insertChunk(chunk, trx, locks, check);
    } catch (error) {
      throw this.#appendError(error);
    }
  }

  /**
   * Inserts `rows`; with `locks` or `guard`, as `INSERT … SELECT … WHERE <guard> AND <locks>`,
   * which takes the locks before drawing any sequence, and writes nothing when the guard is false.
   */
  async #insertChunk(rows: readonly OutboxPendingRow[], trx: Tx, locks?: { readonly sql: string; readonly params: readonly unknown[] }, guard?: InsertGuard): Promise<void> {
    const { dialect, runner } = this.#core;
    const params: unknown[] = [];
    const tuples: string[] = [];
    const version = dialect.integerParam ?? '?';
    for (const row of rows) {
      const e = row.envelope;
      params.push(
        e.messageId,
        e.type,
        e.version,
        e.topic,
        e.key,
        row.keyHash,
        e.occurredAt,
        e.correlationId,
        e.causationId,
        e.traceparent,
        e.tracestate,
        JSON.stringify(e.headers),
        e.payload,
      );
      let available = dialect.insertNow;
      const availableParams: number[] = [];
      if (row.delayMs > 0) {
        available = dialect.plusMs(dialect.insertNow);
        availableParams.push(row.delayMs);
      }
      if (row.notBeforeMs !== null) {
        available = `${dialect.greatest}(${available}, ${dialect.fromEpochMs})`;
        availableParams.push(row.notBeforeMs);
      }
      // first_due_at (schema version 6): when the row first becomes due, kept while it is
      // retried or released (stats' oldest pending age counts from it).
      params.push(...availableParams, ...availableParams);
      tuples.push(`?, ?, ${version}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ${available}, ${available}, ${dialect.insertNow}`);
    }
    const outbox = dialect.table('outbox');
    if (locks === undefined && guard === undefined) {
      await runner.run(`INSERT INTO ${outbox} (${INSERT_COLUMNS}) VALUES (${tuples.join('), (')})`, params, trx);
      return;
    }
    // One row (most appends): a SELECT of the row itself, no VALUES list in FROM to plan as
    // a subquery; with the one-key lock PostgreSQL planned and ran it in ~90 µs against
    // ~150 µs (EXPLAIN medians, bench/README.md, session prod3).
    // Several rows: a VALUES list in FROM keeps them in their order (a Values Scan, as in
    // INSERT … VALUES); its untyped literals become text, which every text column takes.
    // MySQL 5.7 wants a FROM before a WHERE; DUAL is MySQL's and MariaDB's table of one row.
    const source = tuples.length === 1 ? `SELECT ${tuples[0]}${dialect.name === 'mysql' ? ' FROM DUAL' : ''}` : `SELECT * FROM (VALUES (${tuples.join('), (')})) AS v`;
    // The guard first: when it is false, the locks are not needed.
    const conditions = [...(guard === undefined ? [] : [`(${guard.sql})`]), ...(locks === undefined ? [] : [locks.sql])];
    const result = await runner.run(`INSERT INTO ${outbox} (${INSERT_COLUMNS}) ${source} WHERE ${conditions.join(' AND ')}`, [...params, ...(locks?.params ?? [])], trx);
    // The guard is one value for the whole statement: false, nothing was written.
    if (guard !== undefined && result.affectedRows === 0) throw guard.refused();
    // The lock condition is always true; a row it filtered out would be lost without a trace.
    if (result.affectedRows !== rows.length) throw new Error(`outbox insert wrote ${result.affectedRows} of ${rows.length} rows`);
  }

  #appendError(error: unknown): unknown {
    const mapped = toStorageError(error, 'append', this.#core.schemaHint);
    if (mapped.code !== 'DUPLICATE_MESSAGE_ID') return mapped;
    // The outbox's only unique key is the messageId.
    const detail = driverMessage(error);
    return new StorageError(`a messageId appended in this unit of work is already in the outbox; every message needs a unique id (${detail})`, {
      code: 'DUPLICATE_MESSAGE_ID',
      retriable: false,
      cause: error,
    });
  }
}

/** Order and lock key of (topic, key): 128 bits of SHA-256, hex; null for keyless messages. */
export function keyHash(topic: string, key: string | null): string | null {
  if (key === null) return null;
  return createHash('sha256').update(topic).update('\u0000').update(key).digest('hex').slice(0, 32);
}

/**
 * When a pending row first became due: `first_due_at` (schema version 6: its insert or
 * delay/notBefore, kept across retries and releases, reset by a replay). A row written
 * without it (by a process older than version 6, or straight into the table) falls back to
 * the later of its insert and when it was last due ({@link dueAtSql}) — for a row never
 * claimed, exactly when it became due.
 */
function firstDueSql(dialect: Pick<SqlDialect, 'greatest'>): string {
  return `COALESCE(first_due_at, ${dialect.greatest}(created_at, ${dueAtSql('')}))`;
}

/**
 * Which pending rows are backlog for `stats().oldestPendingAgeMs`, as the in-memory store
 * counts: a failing row (in a retry's backoff or being tried again), or one under no live
 * lease that is due (waiting, released, its lease expired). A first attempt in flight is
 * `inFlight`, not backlog; a delayed row not yet due counts nothing.
 */
function backlogSql(dialect: Pick<SqlDialect, 'now' | 'greatest'>): string {
  return `(attempts > 0 OR (${unleasedSql('', dialect.now)} AND ${firstDueSql(dialect)} <= ${dialect.now}))`;
}

function resetColumns(now: string): string {
  return (
    `state = 'pending', attempts = 0, last_error = NULL, error_code = NULL, error_name = NULL, failed_at = NULL, first_failed_at = NULL, ` +
    // A replay starts the row's age again (as the in-memory store's).
    `available_at = ${now}, first_due_at = ${now}, lease_owner = NULL, lease_token = NULL, leased_until = NULL`
  );
}

/** The columns {@link toDeadRecord} reads besides the row's, for a dead or halted row aliased `alias`. */
function failureColumns(dialect: Pick<SqlDialect, 'epochMs'>, alias: string): string {
  return (
    `${alias}.state, ${alias}.last_error, ${alias}.error_code, ${alias}.error_name, ` +
    `${dialect.epochMs(`${alias}.failed_at`)} AS failed_at_ms, ${dialect.epochMs(`${alias}.first_failed_at`)} AS first_failed_at_ms`
  );
}

function listLimit(limit: number | undefined): number {
  const value = limit ?? DEFAULT_LIST_LIMIT;
  if (!Number.isSafeInteger(value) || value < 1) throw new ConfigError(`'limit' must be an integer of 1 or more`);
  return value;
}

/** No headers, as the column holds them for most rows: read without a parse per row. */
const NO_HEADERS_TEXT = '{}';

/** The headers column parsed; undefined for none, which `decodeEnvelope` reads as its shared empty headers. */
function headersOf(text: string | null): unknown {
  return text === null || text === NO_HEADERS_TEXT ? undefined : JSON.parse(text);
}

function envelopeOf(row: SqlRow): Envelope {
  return decodeEnvelope({
    messageId: toNullableString(row['message_id']),
    type: toNullableString(row['message_type']),
    version: toNumber(row['message_version']),
    topic: toNullableString(row['topic']),
    occurredAt: toNullableString(row['occurred_at']),
    key: toNullableString(row['msg_key']),
    correlationId: toNullableString(row['correlation_id']),
    causationId: toNullableString(row['causation_id']),
    traceparent: toNullableString(row['traceparent']),
    tracestate: toNullableString(row['tracestate']),
    headers: headersOf(toNullableString(row['headers'])),
    payload: toNullableString(row['payload']),
  });
}

function toRecord(row: SqlRow): OutboxRecord {
  const age = row['age_ms'];
  const sequence = toBigInt(row['seq']);
  const envelope = envelopeOf(row);
  const attempts = toNumber(row['attempts']);
  if (age === null || age === undefined) return { sequence, envelope, attempts };
  // One object per claimed record, not a copy with `ageMs` spread in: the relay holds every
  // record of its in-flight batches, so what each one allocates outlives scavenges.
  // A clock step back on the database could make the age negative; the port promises not.
  return { sequence, envelope, attempts, ageMs: Math.max(0, toNumber(age)) };
}

function toDeadRecord(row: SqlRow): DeadOutboxRecord {
  const failedAt = row['failed_at_ms'];
  const firstFailedAt = row['first_failed_at_ms'];
  return {
    sequence: toBigInt(row['seq']),
    envelope: envelopeOf(row),
    state: row['state'] === 'halted' ? 'halted' : 'dead',
    attempts: toNumber(row['attempts']),
    lastError: toNullableString(row['last_error']),
    failedAt: failedAt === null || failedAt === undefined ? null : new Date(toNumber(failedAt)),
    code: toNullableString(row['error_code']),
    errorName: toNullableString(row['error_name']),
    firstFailedAt: firstFailedAt === null || firstFailedAt === undefined ? null : new Date(toNumber(firstFailedAt)),
  };
}
