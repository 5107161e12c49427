import {
  type AppendResult,
  type AsyncAppendFlag,
  ConfigError,
  decodeEnvelope,
  describeError,
  noopLogger,
  type ClaimedBatch,
  type ClaimOptions,
  type CompleteOptions,
  type DeadOutboxRecord,
  type HaltedKey,
  type ListOptions,
  type Logger,
  type OutboxAppend,
  type OutboxFailure,
  type OutboxLease,
  type OutboxRecord,
  type OutboxStats,
  type OutboxStore,
  type PortLimits,
} from '@courier/core';
import { keyHash, qualifiedColumns, resolveTableNames, type CourierTablesConfig } from '@courier/sql-engine';
import pg from 'pg';
import { LogicalReplicationService, PgoutputPlugin, type Pgoutput } from 'pg-logical-replication';
import { assertSlotName, ensureReplicationSlot, readSlotStats, type ReplicationSlotStats } from './replication-slot.js';

/** Configuration of {@link PgLogicalOutboxStore}. */
export interface PgLogicalOutboxStoreConfig<Tx, A extends AppendResult = void> {
  /**
   * The PostgreSQL outbox store the bus would otherwise use (`MikroOrmOutboxStore`, …), on
   * the database `connection` points at. Appends, completions, failures, releases, renewals,
   * operator commands and the sweep's claims go to it unchanged.
   */
  readonly store: OutboxStore<Tx, A>;
  /** How to reach the same database (a `pg` client config): one replication connection and a small pool for the claims by sequence. */
  readonly connection: pg.ClientConfig;
  /** The logical replication slot (lower-case letters, digits, `_`); created if missing. One reader at a time. */
  readonly slot: string;
  /** The publication of the outbox table (inserts only); created if missing. Default `<slot>_pub`. */
  readonly publication?: string;
  /** The table names the wrapped store uses (`tablePrefix`, `schema`), to find the outbox table. */
  readonly tables?: CourierTablesConfig;
  /**
   * While the slot is streamed: how often a claim with nothing from the log falls back to the
   * wrapped store's own claim, for rows the log does not announce as due — delayed
   * (`notBefore`), retried, released, replayed or resumed rows, and rows whose lease another
   * relay let lapse. Default 5,000 ms. While the slot is not streamed (another relay reads it,
   * or it is reconnecting) every claim is the wrapped store's own, as a polling relay's.
   */
  readonly sweepIntervalMs?: number;
  /** Delay before reconnecting the slot after it was lost or refused (doubles up to 5 s). Default 200 ms. */
  readonly reconnectDelayMs?: number;
  readonly logger?: Logger;
}

/** A WAL transaction that inserted outbox rows, until every one of them is settled. */
interface LoggedTransaction {
  /** The LSN to acknowledge once it is settled (its commit's end). */
  readonly endLsn: bigint;
  /** Rows not yet settled: waiting to be claimed, or claimed here and not yet completed, failed or released. */
  readonly open: Set<bigint>;
  readonly receivedAt: number;
}

/** A row announced by the log, waiting for a claim. */
interface LoggedRow {
  readonly sequence: bigint;
  readonly keyHash: string | null;
  readonly transaction: LoggedTransaction;
  /** Claims by sequence that could not take the row (see `PARK_TRIES`). */
  tries: number;
  /** When the row, found due later (leased elsewhere, delayed), was due by the last claim's reading; absent before. */
  dueAt?: number;
}

/** A row claimed here (by sequence or by a sweep) and not yet completed, failed or released. */
interface HeldRow {
  readonly keyHash: string | null;
  transaction: LoggedTransaction | undefined;
}

const DEFAULT_SWEEP_INTERVAL_MS = 5_000;
const DEFAULT_RECONNECT_DELAY_MS = 200;
const MAX_RECONNECT_DELAY_MS = 5_000;
/**
 * Claims by sequence a row announced by the log gets before it is left to the sweep, when it
 * is not yet visible (the WAL sender can send a commit a moment before the committing backend
 * has left the process array), leased by another relay, or blocked by an earlier row of its
 * key held elsewhere. Tried again after 5 ms, doubling up to `PARK_MAX_DELAY_MS` (about 10 s
 * in all); a row due later (leased, delayed) every `DUE_RECHECK_MS` until due, uncounted; meanwhile its key is blocked here and the slot is not
 * acknowledged past it. Dropping such rows at once sent whole keys to the sweep: a bench drain
 * of 10,000 rows over 64 keys fell to ~64 rows per sweep.
 */
const PARK_TRIES = 40;
const PARK_MAX_DELAY_MS = 250;
/** How often a parked row due later (leased by another relay, or delayed) is looked at again: one claim statement per second at most for such rows. */
const DUE_RECHECK_MS = 1_000;

/** What the claim by sequence says of a row it did not take. */
interface SeenRow {
  readonly seq: string;
  readonly pending: boolean;
  readonly dueInMs: number;
  readonly behindHalt: boolean;
}
/** How often the reader sends the server its confirmed position even when nothing moved, so a quiet stream is not timed out (`wal_sender_timeout`, 60 s by default). */
const STATUS_INTERVAL_MS = 10_000;
/** 2000-01-01T00:00:00Z, the epoch of the replication protocol's timestamps. */
const POSTGRES_EPOCH_MS = Date.UTC(2000, 0, 1);

/**
 * An outbox store whose claims come from PostgreSQL's write-ahead log: a relay built on it
 * (`createBus({ outbox: new PgLogicalOutboxStore({ store, … }) })`) learns of committed rows
 * from a logical replication slot (`pgoutput`, a publication of the outbox table's inserts)
 * instead of scanning for them, and claims exactly those rows by sequence.
 *
 * Guarantees:
 * - **The outbox rows stay the source of truth.** A claim by sequence takes a row only while
 *   it is pending, due, not leased by anyone, and the head of its key (no earlier row of the
 *   key pending or halted) — the polling claim's conditions, with the same lease and fencing
 *   token — so completion, failure, retries, dead letters, halts, `stats`, pruning and every
 *   operator command work as with the wrapped store, and a polling relay on the same table
 *   never publishes a row this one holds (or the reverse). A row the claim does not take is
 *   left pending in the table, for a later sweep.
 * - **Nothing is skipped.** The slot is acknowledged up to a transaction's commit only once
 *   each of its outbox rows was completed, failed or released by the relay, or left pending
 *   in the table for the sweep; a crash at any instant resumes from the last acknowledged
 *   position and reads the rest again (at least once: the broker may see a message twice).
 *   Rows committed before the slot existed, delayed rows and retries are the sweep's.
 * - **Per-key order** as the polling relay keeps it: a key's rows in flight from this store
 *   are one run from its head, at most the claim's `perKey` (one unless the transport declares
 *   ordered pipelining); later rows of the key wait in memory for the run to settle, and every
 *   claim tests that nothing earlier of the key is pending elsewhere or halted. A key whose head
 *   cannot be taken blocks that key only.
 * - **One reader per slot.** PostgreSQL streams a slot to one connection at a time; another
 *   relay on the same slot is refused and keeps retrying, claiming meanwhile as a polling
 *   relay (fenced by leases as any two relays are), and takes the slot over within about a
 *   reconnect delay once the reader's connection is gone.
 * - `close()` stops the stream, ends the pool and closes the wrapped store; idempotent.
 */
export class PgLogicalOutboxStore<Tx, A extends AppendResult = void> implements OutboxStore<Tx, A> {
  /** The slot's name. With `slotStats()`, what `courier stats` looks for to show the slot (read only: it never creates it). */
  readonly slot: string;
  readonly publication: string;
  readonly limits?: PortLimits;
  /** The wrapped store's lease renewal, when it has one (the relay then keeps short leases while a batch is in hand). */
  readonly renew?: (lease: OutboxLease, sequences: readonly bigint[], leaseMs: number, options?: { signal?: AbortSignal }) => Promise<number>;
  readonly #store: OutboxStore<Tx, A>;
  readonly #connection: pg.ClientConfig;
  readonly #pool: pg.Pool;
  readonly #logger: Logger;
  readonly #sweepIntervalMs: number;
  readonly #reconnectDelayMs: number;
  readonly #outbox: string;
  readonly #outboxName: { readonly schema: string; readonly table: string };
  readonly #tokenSequence: string;
  readonly #listeners = new Set<() => void>();
  /** WAL transactions with rows not yet settled, in commit order. */
  readonly #transactions: LoggedTransaction[] = [];
  /** Rows announced by the log and not yet claimed, in commit order. */
  #waiting: LoggedRow[] = [];
  readonly #held = new Map<bigint, HeldRow>();
  readonly #keysHeld = new Map<string, number>();
  /** The transaction being received (between its begin and commit messages). */
  #receiving: { rows: { sequence: bigint; keyHash: string | null }[] } | undefined;
  #service: LogicalReplicationService | undefined;
  #streaming = false;
  #running: Promise<void> | undefined;
  #stopped = false;
  #closed: Promise<void> | undefined;
  #lastSweepAt = Number.NEGATIVE_INFINITY;
  #confirmedLsn = 0n;
  #lastStatusAt = 0;
  /** The highest position reported to the server as received (written) while rows were unsettled. */
  #reportedReceived = 0n;
  #wake: (() => void) | undefined;
  /** Rows a claim by sequence could not take yet, with when to try again (see `PARK_TRIES`). */
  #parked: { readonly row: LoggedRow; readonly wakeAt: number }[] = [];
  #parkTimer: NodeJS.Timeout | undefined;
  /** When `#parkTimer` fires. */
  #parkTimerAt = Number.POSITIVE_INFINITY;
  /**
   * One set per claim by sequence in flight: the rows this store settled (completed, failed,
   * released) while that claim's statement ran. Such a row may look leased to the claim —
   * by this store's own sweep, whose claim and completion both fell inside the statement's
   * round trip — and is no longer held here when the answer comes; parked as "leased
   * elsewhere" it blocked its key and the slot's acknowledgement for the whole lease.
   */
  readonly #settledDuringClaims = new Set<Set<bigint>>();
  #logged = 0;
  #swept = 0;

  constructor(config: PgLogicalOutboxStoreConfig<Tx, A>) {
    const problems: string[] = [];
    const check = (what: string, fn: () => void) => {
      try {
        fn();
      } catch (error) {
        problems.push(...((error as { problems?: string[] }).problems ?? [describeError(error)]));
      }
      void what;
    };
    check('slot', () => assertSlotName('slot', config.slot));
    const publication = config.publication ?? `${config.slot}_pub`;
    check('publication', () => assertSlotName('publication', publication));
    const sweep = config.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS;
    if (!(sweep > 0) || !Number.isFinite(sweep)) problems.push(`'sweepIntervalMs' must be a positive number`);
    const reconnect = config.reconnectDelayMs ?? DEFAULT_RECONNECT_DELAY_MS;
    if (!(reconnect > 0) || !Number.isFinite(reconnect)) problems.push(`'reconnectDelayMs' must be a positive number`);
    if (config.store === undefined || typeof config.store.claim !== 'function') problems.push(`'store' must be an outbox store`);
    if (problems.length > 0) throw new ConfigError(problems);
    const names = resolveTableNames(config.tables);
    const quote = (identifier: string) => `"${identifier}"`;
    const qualify = (name: string) => (names.schema === undefined ? quote(name) : `${quote(names.schema)}.${quote(name)}`);
    this.slot = config.slot;
    this.publication = publication;
    this.#store = config.store;
    if (config.store.limits) this.limits = config.store.limits;
    const store = config.store;
    if (store.renew) this.renew = (lease, sequences, leaseMs, options) => store.renew!(lease, sequences, leaseMs, options);
    this.#connection = config.connection;
    this.#pool = new pg.Pool({ ...config.connection, max: 4 });
    // An idle client's error (the server restarted) must not crash the process; the next query reconnects.
    this.#pool.on('error', (error) => this.#logger.warn('log-tail pool connection lost', { error: describeError(error) }));
    this.#logger = config.logger ?? noopLogger;
    this.#sweepIntervalMs = sweep;
    this.#reconnectDelayMs = reconnect;
    this.#outbox = qualify(names.outbox);
    this.#outboxName = { schema: names.schema ?? 'public', table: names.outbox };
    this.#tokenSequence = qualify(names.tokenSequence);
  }

  /**
   * Rows this store has claimed so far: `logged` by sequence from the slot's announcements,
   * `swept` through the wrapped store's own claim. A steady `swept` share under live traffic
   * means the log path is not keeping up (or the slot is not streamed here).
   */
  get claimed(): { readonly logged: number; readonly swept: number } {
    return { logged: this.#logged, swept: this.#swept };
  }

  /** Whether the slot is being streamed by this store now (false while another relay holds it, or while reconnecting). */
  get streaming(): boolean {
    return this.#streaming;
  }

  /**
   * The slot's lag and state from the server, plus how long the oldest transaction this
   * store has received but not yet acknowledged has waited (`unacknowledgedAgeMs`, 0 when
   * none): a gauge for the WAL the slot holds back. `undefined` when the server has no such
   * slot. One query on the store's pool; creates nothing, and does not start reading the slot.
   */
  async slotStats(): Promise<(ReplicationSlotStats & { readonly unacknowledgedAgeMs: number }) | undefined> {
    const stats = await readSlotStats(this.#pool, this.slot);
    if (!stats) return undefined;
    const oldest = this.#transactions[0];
    return { ...stats, unacknowledgedAgeMs: oldest ? Math.max(0, Date.now() - oldest.receivedAt) : 0 };
  }

  /** Whether `append` returns a promise: the wrapped store's answer (this store appends through it). */
  get asyncAppend(): AsyncAppendFlag<A> {
    return (this.#store.asyncAppend === true) as AsyncAppendFlag<A>;
  }

  /** Appends through the wrapped store, returning what it returns (a promise for a store that writes at once). */
  append(tx: Tx, messages: readonly OutboxAppend[]): A {
    return this.#store.append(tx, messages);
  }

  /**
   * Claims rows the log announced, by sequence (one statement for the whole batch, up to
   * `perKey` rows of a key as a run from its head), or — when none is waiting
   * and a sweep is due, or while the slot is not streamed here — through the wrapped store's
   * own claim. Starts reading the slot on first use.
   */
  async claim(options: ClaimOptions): Promise<ClaimedBatch> {
    this.#start();
    const chosen = this.#choose(options.limit, Math.max(1, Math.floor(options.perKey)));
    if (chosen.length > 0) return this.#claimLogged(chosen, options);
    const now = Date.now();
    if (this.#streaming && now - this.#lastSweepAt < this.#sweepIntervalMs) {
      return { lease: { owner: options.owner, token: 0n }, records: [] };
    }
    this.#lastSweepAt = now;
    const batch = await this.#store.claim(options);
    this.#swept += batch.records.length;
    for (const record of batch.records) this.#hold(record.sequence, keyHash(record.envelope.topic, record.envelope.key), undefined);
    this.#adoptSwept();
    return batch;
  }

  async complete(lease: OutboxLease, sequences: readonly bigint[], options?: CompleteOptions): Promise<number> {
    try {
      return await this.#store.complete(lease, sequences, options);
    } finally {
      this.#settle(sequences);
    }
  }

  async fail(lease: OutboxLease, failures: readonly OutboxFailure[], options?: { signal?: AbortSignal }): Promise<number> {
    try {
      return await this.#store.fail(lease, failures, options);
    } finally {
      this.#settle(failures.map((failure) => failure.sequence));
    }
  }

  async release(lease: OutboxLease, sequences: readonly bigint[], delayMs?: number): Promise<number> {
    try {
      return await this.#store.release(lease, sequences, delayMs);
    } finally {
      // Released rows are pending in the table again: the sweep publishes them.
      this.#lastSweepAt = Number.NEGATIVE_INFINITY;
      this.#settle(sequences);
    }
  }

  /**
   * Calls `listener` whenever the log announces committed outbox rows, or a row that waited
   * for its key's predecessor can be claimed. Starts reading the slot.
   */
  watch(listener: () => void): Promise<() => Promise<void>> {
    this.#listeners.add(listener);
    this.#start();
    return Promise.resolve(() => {
      this.#listeners.delete(listener);
      return Promise.resolve();
    });
  }

  stats(): Promise<OutboxStats> {
    return this.#store.stats();
  }

  prune(olderThanMs: number, options?: { batchSize?: number; signal?: AbortSignal }): Promise<number> {
    return this.#store.prune(olderThanMs, options);
  }

  listDead(options?: ListOptions): Promise<readonly DeadOutboxRecord[]> {
    return this.#store.listDead(options);
  }

  replay(sequences: readonly bigint[]): Promise<number> {
    this.#lastSweepAt = Number.NEGATIVE_INFINITY;
    return this.#store.replay(sequences);
  }

  purge(sequences: readonly bigint[]): Promise<number> {
    return this.#store.purge(sequences);
  }

  listHalted(options?: ListOptions): Promise<readonly HaltedKey[]> {
    return this.#store.listHalted(options);
  }

  resume(topic: string, key: string, action: 'retry' | 'park'): Promise<number> {
    this.#lastSweepAt = Number.NEGATIVE_INFINITY;
    return this.#store.resume(topic, key, action);
  }

  /** Stops reading the slot (what was not acknowledged is read again by the next reader), ends the pool, closes the wrapped store. Idempotent. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#stopped = true;
      clearTimeout(this.#parkTimer);
      this.#wake?.();
      const service = this.#service;
      this.#service = undefined;
      this.#streaming = false;
      await service?.destroy().catch(() => undefined);
      await this.#running;
      await this.#pool.end().catch(() => undefined);
      await this.#store.close?.();
    })();
    return this.#closed;
  }

  /**
   * Takes up to `limit` waiting rows: per key, a run of up to `perKey` of its waiting rows
   * in sequence order (the relay asks for more than one only when the transport keeps
   * order across a pipelined batch), and nothing of a key held or parked here; the rest
   * keep waiting in order. A key's run ends at its first row not taken, so no later row of
   * the key is chosen past it.
   */
  #choose(limit: number, perKey: number): LoggedRow[] {
    if (this.#waiting.length === 0) return [];
    const chosen: LoggedRow[] = [];
    const rest: LoggedRow[] = [];
    const runs = new Map<string, number>();
    const closed = new Set<string>();
    const parkedKeys = new Set(this.#parked.map((parked) => parked.row.keyHash));
    for (const row of this.#waiting) {
      const key = row.keyHash;
      const held = this.#held.get(row.sequence);
      if (held) {
        // A sweep here holds it already: it settles with that claim's completion.
        held.transaction ??= row.transaction;
        continue;
      }
      const blocked = key !== null && (closed.has(key) || this.#keysHeld.has(key) || parkedKeys.has(key) || (runs.get(key) ?? 0) >= perKey);
      if (chosen.length >= limit || blocked) {
        if (key !== null) closed.add(key);
        rest.push(row);
        continue;
      }
      if (key !== null) runs.set(key, (runs.get(key) ?? 0) + 1);
      chosen.push(row);
    }
    this.#waiting = rest;
    // Reserved from the choice on, once per row: a concurrent claim (the relay runs several
    // loops) must not choose the key's next row while these are still being claimed.
    for (const row of chosen) if (row.keyHash !== null) this.#reserveKey(row.keyHash);
    return chosen;
  }

  /**
   * The claim by sequence: one statement takes those of `rows` that are pending, due, not
   * leased and either heads of their key or right behind rows of their key it takes too,
   * under a new token from the store's token sequence, and says which rows it saw at all.
   * A key's rows are taken as a run from its head: a row is a candidate only when every
   * earlier pending or halted row of its key is among `rows` and due, and a candidate is
   * taken only when each of those earlier rows was taken too (one locked elsewhere, or no
   * longer due when locked, ends the run there). Rows the table owns (gone, published,
   * dead, behind a halt, due after the next sweep) are left to the sweep (settled here);
   * the others wait for another try.
   */
  async #claimLogged(rows: readonly LoggedRow[], options: ClaimOptions): Promise<ClaimedBatch> {
    const outbox = this.#outbox;
    const sql =
      `WITH token AS MATERIALIZED (SELECT nextval('${this.#tokenSequence}') AS value), ` +
      // The batch's rows that are pending and due (not leased): what may go out, key by key, as runs from each head.
      `due AS MATERIALIZED (SELECT d.seq, d.key_hash FROM ${outbox} d WHERE d.seq = ANY ($1::bigint[]) AND d.state = 'pending' AND d.available_at <= now() AND (d.leased_until IS NULL OR d.leased_until <= now())), ` +
      `bounds AS MATERIALIZED (SELECT key_hash, min(seq) AS lo, max(seq) AS hi FROM due WHERE key_hash IS NOT NULL GROUP BY key_hash), ` +
      // Where a key's run must stop: at its first due row when an earlier row of the key is pending (leased elsewhere, not due,
      // not in the batch) or halted; at a pending or halted row of the key inside the run that is not due in this batch.
      // One index range scan per key (the pending/halted key index), not one per row.
      `stops AS MATERIALIZED (SELECT key_hash, min(seq) AS seq FROM (` +
      `SELECT b.key_hash, b.lo AS seq FROM bounds b WHERE EXISTS (SELECT 1 FROM ${outbox} e WHERE e.key_hash = b.key_hash AND e.state IN ('pending', 'halted') AND e.seq < b.lo) ` +
      `UNION ALL SELECT g.key_hash, g.seq FROM bounds b JOIN ${outbox} g ON g.key_hash = b.key_hash AND g.seq > b.lo AND g.seq < b.hi AND g.state IN ('pending', 'halted') ` +
      `WHERE g.seq NOT IN (SELECT seq FROM due)) AS blocked GROUP BY key_hash), ` +
      `candidates AS MATERIALIZED (SELECT o.seq, o.key_hash, (floor(extract(epoch from now()) * 1000) - floor(extract(epoch from GREATEST(o.created_at, COALESCE(o.leased_until, o.available_at))) * 1000)) AS age_ms ` +
      `FROM ${outbox} o WHERE o.seq IN (SELECT seq FROM due) AND o.state = 'pending' AND o.available_at <= now() AND (o.leased_until IS NULL OR o.leased_until <= now()) ` +
      `AND NOT EXISTS (SELECT 1 FROM stops t WHERE t.key_hash = o.key_hash AND t.seq <= o.seq) ` +
      `ORDER BY o.seq FOR UPDATE OF o SKIP LOCKED), ` +
      // A run also stops at its first due row not locked here (another claim has it, or it was no longer due when locked).
      `unlocked AS (SELECT x.key_hash, min(x.seq) AS seq FROM due x WHERE x.key_hash IS NOT NULL AND x.seq NOT IN (SELECT seq FROM candidates) GROUP BY x.key_hash), ` +
      `runs AS (SELECT c.seq, c.age_ms FROM candidates c LEFT JOIN unlocked l ON l.key_hash = c.key_hash WHERE l.seq IS NULL OR c.seq < l.seq), ` +
      // Why a row was not taken (only those: the claimed rows need none): gone or no longer pending, behind a halted head, due later
      // (leased or delayed), or blocked by an earlier row of its key.
      `seen AS MATERIALIZED (SELECT coalesce(json_agg(json_build_object('seq', s.seq::text, 'pending', s.state = 'pending', ` +
      `'dueInMs', greatest(0, floor(extract(epoch from (greatest(s.available_at, s.leased_until) - now())) * 1000)), ` +
      `'behindHalt', EXISTS (SELECT 1 FROM ${outbox} h WHERE h.key_hash = s.key_hash AND h.state = 'halted' AND h.seq < s.seq))), '[]'::json) AS info ` +
      `FROM ${outbox} s WHERE s.seq = ANY ($1::bigint[]) AND s.seq NOT IN (SELECT seq FROM runs)), ` +
      `claimed AS (UPDATE ${outbox} u SET lease_owner = $2, lease_token = token.value, leased_until = now() + ($3::float8 * interval '1 millisecond') ` +
      `FROM runs, token WHERE u.seq = runs.seq RETURNING ${qualifiedColumns('u')}, runs.age_ms) ` +
      // The list of rows not taken comes once, on the first row: repeated on every row it cost a JSON parse per row of
      // the whole list (quadratic in the batch: the largest item, 1.4 of 5.8 busy seconds, in a pipelined drain's profile).
      `SELECT token.value::text AS claim_token, CASE WHEN row_number() OVER (ORDER BY claimed.seq) = 1 THEN (SELECT info FROM seen) END AS seen, claimed.* ` +
      `FROM token LEFT JOIN claimed ON true ORDER BY claimed.seq`;
    let result: pg.QueryResult<Record<string, unknown>>;
    const settledMeanwhile = new Set<bigint>();
    this.#settledDuringClaims.add(settledMeanwhile);
    try {
      result = await this.#pool.query(sql, [rows.map((row) => row.sequence.toString()), options.owner, Math.ceil(options.leaseMs)]);
    } catch (error) {
      // Nothing was claimed: the rows wait again, in order, for the next claim.
      for (const row of rows) if (row.keyHash !== null) this.#unreserveKey(row.keyHash);
      this.#waiting = [...rows, ...this.#waiting].sort((a, b) => (a.sequence < b.sequence ? -1 : 1));
      throw error;
    } finally {
      this.#settledDuringClaims.delete(settledMeanwhile);
    }
    const first = result.rows[0];
    const token = BigInt(String(first?.['claim_token']));
    const seen = new Map(((first?.['seen'] as SeenRow[] | null | undefined) ?? []).map((info) => [info.seq, info]));
    const records: OutboxRecord[] = [];
    for (const row of result.rows) {
      if (row['seq'] === null || row['seq'] === undefined) continue;
      records.push(toRecord(row));
    }
    this.#logged += records.length;
    const taken = new Set(records.map((record) => record.sequence));
    const left: bigint[] = [];
    const now = Date.now();
    for (const row of rows) {
      if (row.keyHash !== null) this.#unreserveKey(row.keyHash);
      if (taken.has(row.sequence)) {
        this.#hold(row.sequence, row.keyHash, row.transaction);
        continue;
      }
      const held = this.#held.get(row.sequence);
      if (held) {
        // Leased by a sweep of this store meanwhile: it settles with that claim's completion, not after a lease's wait.
        held.transaction ??= row.transaction;
        continue;
      }
      if (settledMeanwhile.has(row.sequence)) {
        // Claimed and settled by this store (its sweep) while the statement ran: the table has its outcome —
        // published, or pending again for the sweep (released, failed for a retry). Nobody else's lease to wait out.
        left.push(row.sequence);
        continue;
      }
      const info = seen.get(row.sequence.toString());
      // Gone, published, dead or halted, behind a halted head, or due only after the next sweep: the table keeps it.
      const tableOwns = info !== undefined && (!info.pending || info.behindHalt || info.dueInMs > this.#sweepIntervalMs);
      const dueInMs = info?.dueInMs ?? 0;
      // A row due later (leased elsewhere, or delayed) is looked at again every `DUE_RECHECK_MS`
      // until then: waiting for its lease to end kept a key blocked for the whole lease after the
      // relay holding its head had long completed it. Such looks count as a try only once the
      // due time last read has passed (a lease renewed or taken anew), as one wait for a lease did.
      const counts = dueInMs === 0 || now >= (row.dueAt ?? 0);
      if (dueInMs > 0) row.dueAt = now + dueInMs;
      if (tableOwns || (counts && ++row.tries > PARK_TRIES)) {
        left.push(row.sequence);
        continue;
      }
      // Not visible yet, leased by a relay that may die or finish, or blocked by an earlier row of
      // its key held elsewhere: tried again soon, its key blocked meanwhile so no later row overtakes it.
      this.#park(row, now + (dueInMs > 0 ? Math.min(dueInMs, DUE_RECHECK_MS) : Math.min(PARK_MAX_DELAY_MS, 5 * 2 ** row.tries)));
    }
    if (left.length > 0) {
      for (const sequence of left) this.#closeRow(sequence, this.#transactionOf(rows, sequence));
      this.#acknowledgeSettled();
    }
    return { lease: { owner: options.owner, token }, records };
  }

  /**
   * Rows a sweep of this store just claimed that the log announced too (waiting or parked
   * here): they settle with the sweep's completion. Left parked, they would block their key
   * until the sweep's lease ran out (they look leased by another relay).
   */
  #adoptSwept(): void {
    const adopt = (row: LoggedRow): boolean => {
      const held = this.#held.get(row.sequence);
      if (!held) return false;
      held.transaction ??= row.transaction;
      return true;
    };
    this.#waiting = this.#waiting.filter((row) => !adopt(row));
    this.#parked = this.#parked.filter((parked) => !adopt(parked.row));
  }

  #park(row: LoggedRow, wakeAt: number): void {
    this.#parked.push({ row, wakeAt });
    this.#scheduleParked();
  }

  /**
   * Sets the timer for the earliest parked row, moving it earlier when a row parked later is due
   * sooner: one timer set for a row parked until a lease ends (seconds) held back every row
   * parked after it for milliseconds — in pipelined drains, seconds of idle relay loops.
   */
  #scheduleParked(): void {
    if (this.#parked.length === 0) return;
    const first = Math.min(...this.#parked.map((parked) => parked.wakeAt));
    if (this.#parkTimer !== undefined) {
      if (this.#parkTimerAt <= first) return;
      clearTimeout(this.#parkTimer);
    }
    this.#parkTimerAt = first;
    this.#parkTimer = setTimeout(() => {
      this.#parkTimer = undefined;
      this.#parkTimerAt = Number.POSITIVE_INFINITY;
      const now = Date.now();
      const due = this.#parked.filter((parked) => parked.wakeAt <= now).map((parked) => parked.row);
      this.#parked = this.#parked.filter((parked) => parked.wakeAt > now);
      if (due.length > 0) {
        this.#waiting = [...due, ...this.#waiting].sort((a, b) => (a.sequence < b.sequence ? -1 : 1));
        this.#notify();
      }
      this.#scheduleParked();
    }, Math.max(0, first - Date.now()));
    this.#parkTimer.unref();
  }

  #transactionOf(rows: readonly LoggedRow[], sequence: bigint): LoggedTransaction | undefined {
    return rows.find((row) => row.sequence === sequence)?.transaction;
  }

  #hold(sequence: bigint, key: string | null, transaction: LoggedTransaction | undefined): void {
    const existing = this.#held.get(sequence);
    if (existing) {
      existing.transaction ??= transaction;
      return;
    }
    this.#held.set(sequence, { keyHash: key, transaction });
    if (key !== null) this.#reserveKey(key);
  }

  #reserveKey(key: string): void {
    this.#keysHeld.set(key, (this.#keysHeld.get(key) ?? 0) + 1);
  }

  #unreserveKey(key: string): void {
    const count = (this.#keysHeld.get(key) ?? 1) - 1;
    if (count <= 0) this.#keysHeld.delete(key);
    else this.#keysHeld.set(key, count);
  }

  /** Rows leave this store's hands (completed, failed, released, or the call's outcome unknown — the table has the truth either way). */
  #settle(sequences: readonly bigint[]): void {
    let freedKey = false;
    for (const sequence of sequences) {
      const held = this.#held.get(sequence);
      if (!held) continue;
      for (const settled of this.#settledDuringClaims) settled.add(sequence);
      this.#held.delete(sequence);
      if (held.keyHash !== null) {
        this.#unreserveKey(held.keyHash);
        freedKey = true;
      }
      if (held.transaction) this.#closeRow(sequence, held.transaction);
    }
    this.#acknowledgeSettled();
    // A row of a freed key may be waiting in memory: claim it now rather than at the next poll.
    if (freedKey && this.#waiting.length > 0) this.#notify();
  }

  #closeRow(sequence: bigint, transaction: LoggedTransaction | undefined): void {
    transaction?.open.delete(sequence);
  }

  /** Acknowledges the slot up to the last transaction of the settled prefix. */
  #acknowledgeSettled(): void {
    let lsn: bigint | undefined;
    while (this.#transactions.length > 0 && this.#transactions[0]!.open.size === 0) lsn = this.#transactions.shift()!.endLsn;
    if (lsn !== undefined) this.#acknowledge(lsn);
  }

  #acknowledge(lsn: bigint, force = false): void {
    if (lsn < this.#confirmedLsn || (lsn === this.#confirmedLsn && !force)) return;
    this.#confirmedLsn = lsn;
    this.#lastStatusAt = Date.now();
    // `lsn` is a position after the last byte to confirm (a commit's end, a keepalive's
    // position); pg-logical-replication's `acknowledge` takes the last byte and reports it + 1.
    // Passed as is, a keepalive between a transaction's last insert and its COMMIT confirmed
    // the commit record's first byte, and the next reader of the slot skipped the transaction.
    void this.#service?.acknowledge(formatLsn(lsn > 0n ? lsn - 1n : 0n)).catch(() => undefined);
  }

  #notify(): void {
    for (const listener of this.#listeners) listener();
  }

  #start(): void {
    if (this.#running || this.#stopped) return;
    this.#running = this.#run();
  }

  /** Keeps the slot streamed: ensure it, stream it until the connection ends, reconnect with backoff. Never rejects. */
  async #run(): Promise<void> {
    let delay = this.#reconnectDelayMs;
    while (!this.#stopped) {
      const startedAt = Date.now();
      try {
        const { createdSlot } = await ensureReplicationSlot(this.#pool, { slot: this.slot, publication: this.publication, table: this.#outbox });
        await this.#stream(createdSlot);
      } catch (error) {
        if (this.#stopped) break;
        if (error instanceof ConfigError) this.#logger.error('log-tail relay cannot read its slot; claiming as a polling relay', { slot: this.slot, error: error.message });
        else this.#logger.warn('log-tail slot not streamed; claiming as a polling relay until it is', { slot: this.slot, error: describeError(error) });
      }
      this.#streaming = false;
      // What was received but not settled is read again from the slot's confirmed position.
      this.#forgetStream();
      if (this.#stopped) break;
      if (Date.now() - startedAt > MAX_RECONNECT_DELAY_MS) delay = this.#reconnectDelayMs;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delay);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = undefined;
      delay = Math.min(MAX_RECONNECT_DELAY_MS, delay * 2);
    }
  }

  /** Streams the slot until the connection ends (resolves) or fails (rejects). */
  async #stream(createdSlot: boolean): Promise<void> {
    const service = new LogicalReplicationService(this.#connection, { acknowledge: { auto: false, timeoutSeconds: 0 } });
    this.#service = service;
    const plugin = new PgoutputPlugin({ protoVersion: 1, publicationNames: [this.publication] });
    const ended = new Promise<void>((resolve, reject) => {
      service.on('error', (error: Error) => reject(error));
      service.on('start', () => {
        this.#streaming = true;
        this.#confirmedLsn = 0n;
        // Rows committed while the slot was not streamed are in the log still, from the
        // confirmed position on; rows committed before it existed are not: a new slot sweeps at once.
        this.#lastSweepAt = createdSlot ? Number.NEGATIVE_INFINITY : Date.now();
        this.#logger.info('log-tail relay reads its slot', { slot: this.slot });
        this.#notify();
      });
      service.on('data', (lsn: string, message: Pgoutput.Message) => this.#receive(lsn, message));
      service.on('heartbeat', (lsn: string, _timestamp: number, shouldRespond: boolean) => this.#heartbeat(parseLsn(lsn), shouldRespond));
    });
    const subscribed = service.subscribe(plugin, this.slot);
    // Whichever settles second has nobody waiting for it.
    subscribed.catch(() => undefined);
    ended.catch(() => undefined);
    // `subscribed` resolves when the stream ends (closed here, or by the server); `ended` rejects on a connection error.
    await Promise.race([subscribed, ended]);
  }

  #receive(_lsn: string, message: Pgoutput.Message): void {
    switch (message.tag) {
      case 'begin':
        this.#receiving = { rows: [] };
        return;
      case 'insert': {
        const relation = message.relation;
        if (!this.#receiving || relation.name !== this.#outboxName.table || relation.schema !== this.#outboxName.schema) return;
        const row = message.new as Record<string, unknown>;
        const hash = row['key_hash'];
        this.#receiving.rows.push({ sequence: BigInt(String(row['seq'])), keyHash: typeof hash === 'string' ? hash : null });
        return;
      }
      case 'commit': {
        const received = this.#receiving;
        this.#receiving = undefined;
        const endLsn = parseLsn(message.commitEndLsn ?? '0/0');
        if (!received || received.rows.length === 0) {
          if (this.#transactions.length === 0) this.#acknowledge(endLsn);
          return;
        }
        const transaction: LoggedTransaction = { endLsn, open: new Set(received.rows.map((row) => row.sequence)), receivedAt: Date.now() };
        this.#transactions.push(transaction);
        for (const row of received.rows) {
          const held = this.#held.get(row.sequence);
          // Read again after a reconnect while still in flight here: it settles with its completion.
          if (held) held.transaction ??= transaction;
          else this.#waiting.push({ sequence: row.sequence, keyHash: row.keyHash, transaction, tries: 0 });
        }
        this.#notify();
        return;
      }
      default:
        return;
    }
  }

  /**
   * A keepalive: with nothing received left unsettled, everything before the server's
   * position is acknowledged (WAL of other tables is not held back by an idle outbox);
   * otherwise the confirmed position is repeated when the server asks, or every
   * `STATUS_INTERVAL_MS`, so the server does not time the reader out.
   */
  #heartbeat(lsn: bigint, shouldRespond: boolean): void {
    if (this.#transactions.length === 0 && this.#receiving === undefined) this.#acknowledge(lsn);
    else if (shouldRespond || lsn > this.#reportedReceived || Date.now() - this.#lastStatusAt > STATUS_INTERVAL_MS) this.#reportReceived(lsn);
  }

  /**
   * Tells the server the stream arrived up to `lsn` (written) without confirming anything
   * (flushed: none): PostgreSQL's shutdown waits for every WAL sender until its client reports
   * the last WAL sent as written or flushed, and a reader that repeated only its confirmed
   * position while rows were unsettled (the broker down, say) kept `pg_ctl stop -m fast` from
   * finishing. The slot advances only with the flushed position (`confirmed_flush_lsn`), which
   * this leaves where it was; the standby status update is the protocol's (pg_receivewal sends an
   * invalid flush position the same way). pg-logical-replication's `acknowledge` sends one
   * position for all three, so this writes the message on its connection itself.
   */
  #reportReceived(lsn: bigint): void {
    const connection = (this.#service as unknown as { _connection?: { sendCopyFromChunk(chunk: Buffer): void } } | undefined)?._connection;
    if (!connection) return;
    this.#reportedReceived = lsn > this.#reportedReceived ? lsn : this.#reportedReceived;
    this.#lastStatusAt = Date.now();
    const message = Buffer.alloc(34);
    message.write('r', 0, 'latin1');
    message.writeBigUInt64BE(this.#reportedReceived, 1); // written
    message.writeBigUInt64BE(0n, 9); // flushed: invalid, so the slot is not confirmed
    message.writeBigUInt64BE(0n, 17); // applied
    message.writeBigUInt64BE(BigInt(Date.now() - POSTGRES_EPOCH_MS) * 1000n, 25);
    message.writeUInt8(0, 33);
    connection.sendCopyFromChunk(message);
  }

  /** The stream ended: rows received but not claimed are read again by the next reader; rows held here keep settling. */
  #forgetStream(): void {
    this.#service = undefined;
    this.#reportedReceived = 0n;
    this.#waiting = [];
    this.#parked = [];
    clearTimeout(this.#parkTimer);
    this.#parkTimer = undefined;
    this.#parkTimerAt = Number.POSITIVE_INFINITY;
    this.#transactions.length = 0;
    this.#receiving = undefined;
    for (const held of this.#held.values()) held.transaction = undefined;
  }
}

function parseLsn(lsn: string): bigint {
  const [high, low] = lsn.split('/');
  return (BigInt(`0x${high ?? '0'}`) << 32n) | BigInt(`0x${low ?? '0'}`);
}

function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}

function toRecord(row: Record<string, unknown>): OutboxRecord {
  const text = (value: unknown): string | null => (value === null || value === undefined ? null : String(value));
  const envelope = decodeEnvelope({
    messageId: text(row['message_id']),
    type: text(row['message_type']),
    version: Number(row['message_version']),
    topic: text(row['topic']),
    occurredAt: text(row['occurred_at']),
    key: text(row['msg_key']),
    correlationId: text(row['correlation_id']),
    causationId: text(row['causation_id']),
    traceparent: text(row['traceparent']),
    tracestate: text(row['tracestate']),
    headers: JSON.parse(text(row['headers']) ?? '{}') as unknown,
    payload: text(row['payload']),
  });
  const age = row['age_ms'];
  const base = { sequence: BigInt(String(row['seq'])), envelope, attempts: Number(row['attempts']) };
  return age === null || age === undefined ? base : { ...base, ageMs: Math.max(0, Number(age)) };
}
