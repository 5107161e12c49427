import { setTimeout as sleep } from 'node:timers/promises';
import {
  boundReasonText,
  ConfigError,
  type Envelope,
  type InboxDrainClaim,
  type InboxHaltedKey,
  type InboxHalts,
  type InboxListParkedOptions,
  type InboxParkedMessage,
  type InboxResult,
  type InboxResumeAction,
  type InboxRunOptions,
  type InboxStats,
  type InboxStore,
  inboxStatsFromCounts,
  type PortLimits,
  StorageError,
} from '@courier/core';
import { haltId, haltSql, type HaltSql } from './dialects/inbox-halts-sql.js';
import type { DialectName } from './dialects/sql-dialect.js';
import { toBigInt, toNumber, type SqlRow } from './executor.js';
import { pruneInBatches, throwIfAborted, type SqlStoreCore } from './sql-store-core.js';
import { isLockConflict, toStorageError } from './storage-errors.js';

/**
 * How an adapter runs an inbox handler in a transaction of its data layer: `run` opens one,
 * calls `work` with the user's unit (`ctx.tx`: an EntityManager, a `pg` client, a Kysely
 * `Transaction`) and the executor's `Tx` for the same transaction, commits when `work`
 * resolves (flushing what the data layer defers to its commit) and rolls back when it
 * throws, rethrowing the error unchanged.
 */
export interface InboxTransactions<Unit, Tx> {
  run<T>(work: (unit: Unit, tx: Tx) => Promise<T>): Promise<T>;
}

/** What {@link SqlInboxStore} is built from: an adapter's core and how it runs handler transactions. */
export interface SqlInboxStoreConfig<Unit, Tx> {
  readonly core: SqlStoreCore<Tx>;
  readonly transactions: InboxTransactions<Unit, Tx>;
}

const DEFAULT_PRUNE_BATCH = 1_000;
// Whole-transaction attempts of a run whose record insert lost a lock conflict (before work ran).
const LOCK_CONFLICT_ATTEMPTS = 10;

/**
 * The idempotent SQL inbox on any adapter (PostgreSQL, MySQL/MariaDB, SQLite).
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite):
 * - `run` opens a transaction through the adapter's {@link InboxTransactions}, inserts the
 *   (messageId, consumer) row first, then runs `work` with the adapter's unit of that
 *   transaction; what `work` wrote (and appended to the outbox) commits together with the
 *   record.
 * - A pair recorded by a committed run is reported as `{ duplicate: true }` without
 *   running `work`. Racing first runs meet at the primary key: the insert of the second
 *   waits for the first's transaction and sees the duplicate once it commits, so exactly
 *   one runs `work` to commit. If the first run rolls back, one waiter records the pair and
 *   runs `work`, the others see its record; a waiter that loses a deadlock there (InnoDB)
 *   starts its transaction over by itself (work has not run), up to 10 times.
 * - If `work` throws, its error propagates unchanged and nothing (record, effects, outbox
 *   rows) is committed. Database errors of the store's own statements, the final flush and
 *   the commit become `StorageError`s.
 * - `recordStart` counts in a short transaction of its own, committed before the handler
 *   starts, so a message that kills its process is still counted after a restart.
 * - Halts (`InboxHalts`, for ordered subscriptions with `poison: 'halt'`; schema version 3):
 *   a `run` with `hold` reads the key's halt row with a share lock in the run's own
 *   transaction and, when halted, inserts the message as held (once per (consumer,
 *   messageId)) instead of running `work`; every drain step locks the halt row for update
 *   and checks the drainer's lease on the database clock; `lift` counts held rows only
 *   after that lock, so it never strands a message held concurrently.
 */
export class SqlInboxStore<Unit, Tx> implements InboxStore<Unit>, InboxHalts {
  /** The SQL family in use. */
  readonly dialect: DialectName;
  /** The column sizes (`varchar(200)` counts characters), the same on every dialect: the bus refuses longer consumer names at `subscribe`. */
  readonly limits: PortLimits = Object.freeze({ id: { chars: 200 }, consumer: { chars: 200 } });
  readonly #core: SqlStoreCore<Tx>;
  readonly #transactions: InboxTransactions<Unit, Tx>;
  readonly #halt: HaltSql;

  constructor(config: SqlInboxStoreConfig<Unit, Tx>) {
    this.#core = config.core;
    this.#transactions = config.transactions;
    this.dialect = this.#core.dialect.name;
    this.#halt = haltSql(this.#core.dialect, this.#core.names.prefix);
  }

  /** Runs `work` once per (messageId, consumer), in one transaction with the inbox record (see the class guarantees). */
  async run<T>(messageId: string, consumer: string, work: (tx: Unit) => Promise<T>, options: InboxRunOptions = {}): Promise<InboxResult<T>> {
    checkPair(messageId, consumer);
    this.#core.assertOpen();
    throwIfAborted(options.signal, 'run');
    const core = this.#core;
    return core.track(
      (async (): Promise<InboxResult<T>> => {
        try {
          await core.checkSchema();
        } catch (error) {
          throw toStorageError(error, 'run', core.schemaHint);
        }
        for (let attempt = 1; ; attempt += 1) {
          // Errors of work() propagate unchanged; everything else is the store's.
          let workStarted = false;
          let workFailed = false;
          try {
            return await this.#transactions.run(async (unit, trx) => {
              await core.runner.prologue(trx);
              if (options.hold) {
                const { topic, key, envelope } = options.hold;
                const halted = options.hold.consumer ?? consumer;
                if (await this.#holdIfHalted(trx, haltId(halted, topic, key), halted, envelope)) return { duplicate: false, held: true } as const;
              }
              const recorded = await core.dialect.insertInboxRecord(core.runner, trx, messageId, consumer);
              if (!recorded) return { duplicate: true } as const;
              workStarted = true;
              try {
                const value = await work(unit);
                return { duplicate: false, value } as const;
              } catch (error) {
                workFailed = true;
                throw error;
              }
            });
          } catch (error) {
            if (workFailed) throw error;
            // InnoDB: runs queued behind an uncommitted record all hold a shared lock on it
            // once its transaction rolls back, and all but one die in a deadlock when they
            // insert. Nothing ran yet, so the run starts over: it inserts, or meets the
            // winner's record and reports the duplicate, as documented.
            if (!workStarted && attempt < LOCK_CONFLICT_ATTEMPTS && isLockConflict(error)) {
              await sleep(Math.random() * 10 * attempt, undefined, { signal: options.signal }).catch(() => undefined);
              throwIfAborted(options.signal, 'run');
              continue;
            }
            throw toStorageError(error, 'run', core.schemaHint);
          }
        }
      })(),
    );
  }

  /** Counts one more start of (messageId, consumer) in its own short transaction and returns the total so far. */
  async recordStart(messageId: string, consumer: string): Promise<number> {
    checkPair(messageId, consumer);
    return this.#core.operation('recordStart', undefined, () => this.#core.dialect.recordStart(this.#core.runner, messageId, consumer));
  }

  /** Removes the record (and its start count) so the message can be explicitly reprocessed. Returns whether a record existed. */
  async forget(messageId: string, consumer: string): Promise<boolean> {
    checkPair(messageId, consumer);
    return this.#core.operation('forget', undefined, async () => {
      const { dialect, runner } = this.#core;
      return runner.transaction(async (trx) => {
        const removed = await runner.run(`DELETE FROM ${dialect.table('inbox')} WHERE message_id = ? AND consumer = ?`, [messageId, consumer], trx);
        await runner.run(`DELETE FROM ${dialect.table('inboxStarts')} WHERE message_id = ? AND consumer = ?`, [messageId, consumer], trx);
        return removed.affectedRows > 0;
      });
    });
  }

  /**
   * Deletes records (and start counts) older than `olderThanMs` (database clock) in
   * statements of at most `batchSize` rows, each committed on its own. The deduplication
   * window ends there: a message redelivered after its record is pruned runs again.
   */
  async prune(olderThanMs: number, options: { batchSize?: number; signal?: AbortSignal } = {}): Promise<number> {
    const batchSize = options.batchSize ?? DEFAULT_PRUNE_BATCH;
    if (!Number.isSafeInteger(batchSize) || batchSize < 1) throw new ConfigError(`'batchSize' must be an integer of 1 or more`);
    if (!Number.isFinite(olderThanMs) || olderThanMs < 0) throw new ConfigError(`'olderThanMs' must be a finite number of 0 or more`);
    return this.#core.operation('prune', options.signal, async () => {
      const records = await pruneInBatches(this.#core, 'inbox', 'processed_at', false, olderThanMs, batchSize, options.signal);
      await pruneInBatches(this.#core, 'inboxStarts', 'updated_at', false, olderThanMs, batchSize, options.signal);
      return records;
    });
  }

  /**
   * Per consumer: records, the age of the oldest (database clock), dead-letter marks and
   * replays — one `SELECT … GROUP BY consumer` outside any transaction, which blocks no
   * `run`. Cost: it reads every inbox record once (no index leads with the consumer, and
   * a count has to visit each row anyway), so it grows with the deduplication window that
   * `prune` bounds; gauges read it at most once a minute by default.
   */
  async stats(options: { signal?: AbortSignal } = {}): Promise<InboxStats> {
    return this.#core.operation('stats', options.signal, async () => {
      const { dialect, runner } = this.#core;
      const rows = await runner.all(
        `SELECT consumer, COUNT(*) AS records, ${dialect.epochMs(dialect.now)} - ${dialect.epochMs('MIN(processed_at)')} AS oldest_age ` +
          `FROM ${dialect.table('inbox')} GROUP BY consumer`,
      );
      return inboxStatsFromCounts(rows.map((row) => ({ name: text(row['consumer']), records: toNumber(row['records']), oldestAgeMs: Math.max(0, toNumber(row['oldest_age'])) })));
    });
  }

  /**
   * Creates the halt of (consumer, topic, key) with `envelope` as its head, or holds `envelope` behind an existing one.
   * `error` (here, in `rehalt` and `settleHead`) is stored bounded and sanitised (`boundReasonText`), whoever passes it:
   * PostgreSQL text cannot hold U+0000, and a failed halt would bring the message back for ever.
   */
  async halt(consumer: string, topic: string, key: string, envelope: Envelope, error: string): Promise<'halted' | 'held'> {
    checkPair(envelope.messageId, consumer);
    const id = haltId(consumer, topic, key);
    return this.#inTransaction('halt', async (trx) => {
      for (;;) {
        if (await this.#holdIfHalted(trx, id, consumer, envelope)) return 'held';
        const { prefix, suffix } = this.#halt.insertIgnore;
        const inserted = await this.#core.runner.run(
          `${prefix} ${this.#table('inboxHalts')} (halt_id, consumer, topic, msg_key, head_id, head_envelope, head_error, halted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ${this.#core.dialect.now})${suffix}`,
          [id, consumer, topic, key, envelope.messageId, JSON.stringify(envelope), boundReasonText(error)],
          trx,
        );
        if (inserted.affectedRows > 0) return 'halted';
        // Another halt of the key committed in between: hold behind it (next round).
      }
    });
  }

  /** Every halt (of `consumer`, when given), oldest first, with the number of messages held behind each. */
  async listHalted(options: { readonly consumer?: string; readonly limit?: number } = {}): Promise<readonly InboxHaltedKey[]> {
    const { dialect, runner } = this.#core;
    const where = options.consumer === undefined ? '' : 'WHERE h.consumer = ? ';
    const rows = await this.#core.operation('listHalted', undefined, () =>
      runner.all(
        `SELECT h.consumer, h.topic, h.msg_key, h.head_envelope, h.head_error, h.resumed, ${dialect.epochMs('h.halted_at')} AS halted_ms, ` +
          `(SELECT count(*) FROM ${this.#table('inboxHeld')} d WHERE d.halt_id = h.halt_id) AS held_count ` +
          `FROM ${this.#table('inboxHalts')} h ${where}ORDER BY h.halted_at, h.halt_id LIMIT ?`,
        [...(options.consumer === undefined ? [] : [options.consumer]), options.limit ?? 1_000],
      ),
    );
    return rows.map((row) => ({
      consumer: text(row['consumer']),
      topic: text(row['topic']),
      key: text(row['msg_key']),
      head: headOf(row),
      haltedAt: new Date(toNumber(row['halted_ms'])),
      held: toNumber(row['held_count']),
      resumed: row['resumed'] === null || row['resumed'] === undefined ? null : (text(row['resumed']) as InboxResumeAction),
    }));
  }

  /** Marks a halted (not yet resumed) key for draining with `action`; 1 when it did. */
  async resumeHalted(consumer: string, topic: string, key: string, action: InboxResumeAction): Promise<number> {
    if (action !== 'retry' && action !== 'park') throw new ConfigError(`'action' must be 'retry' or 'park'`);
    return this.#core.operation('resumeHalted', undefined, async () => {
      const result = await this.#core.runner.run(`UPDATE ${this.#table('inboxHalts')} SET resumed = ? WHERE halt_id = ? AND resumed IS NULL`, [
        action,
        haltId(consumer, topic, key),
      ]);
      return result.affectedRows;
    });
  }

  /** Gives `owner` one resumed halt of `consumer` whose drain lease is free, its own, or expired (database clock). */
  async claimResumed(consumer: string, owner: string, leaseMs: number): Promise<InboxDrainClaim | undefined> {
    const { dialect, runner } = this.#core;
    return this.#inTransaction('claimResumed', async (trx) => {
      const skip = dialect.name === 'sqlite' ? '' : ' FOR UPDATE SKIP LOCKED';
      const [row] = await runner.all(
        `SELECT halt_id, topic, msg_key, resumed, head_envelope, head_error FROM ${this.#table('inboxHalts')} ` +
          `WHERE consumer = ? AND resumed IS NOT NULL AND (drain_owner IS NULL OR drain_owner = ? OR drain_until <= ${dialect.now}) ORDER BY halted_at LIMIT 1${skip}`,
        [consumer, owner],
        trx,
      );
      if (!row) return undefined;
      await runner.run(`UPDATE ${this.#table('inboxHalts')} SET drain_owner = ?, drain_until = ${dialect.plusMs(dialect.now)}, lease_ms = ? WHERE halt_id = ?`, [owner, leaseMs, leaseMs, row['halt_id']], trx);
      return { consumer, topic: text(row['topic']), key: text(row['msg_key']), action: text(row['resumed']) as InboxResumeAction, head: headOf(row) };
    });
  }

  /** Renews `owner`'s drain lease on a halt it still holds (the step every drain call takes first); false when the claim is lost. */
  async renewDrain(consumer: string, topic: string, key: string, owner: string): Promise<boolean> {
    return this.#owned('renewDrain', consumer, topic, key, owner, async () => true, false);
  }

  /** Removes the head of a halt `owner` drains, keeping it as parked when asked. */
  async settleHead(consumer: string, topic: string, key: string, owner: string, options: { readonly parked: boolean; readonly error?: string }): Promise<boolean> {
    return this.#owned('settleHead', consumer, topic, key, owner, async (trx, row, id) => {
      const head = headOf(row);
      if (head && options.parked) {
        await this.#core.runner.run(
          `INSERT INTO ${this.#table('inboxParked')} (consumer, message_id, envelope, error, parked_at) VALUES (?, ?, ?, ?, ${this.#core.dialect.now})`,
          [consumer, head.envelope.messageId, JSON.stringify(head.envelope), boundReasonText(options.error ?? head.error)],
          trx,
        );
      }
      await this.#core.runner.run(`UPDATE ${this.#table('inboxHalts')} SET head_id = NULL, head_envelope = NULL, head_error = NULL WHERE halt_id = ?`, [id], trx);
      return true;
    }, false);
  }

  /** The oldest `limit` messages held behind a halt `owner` drains. */
  async listHeld(consumer: string, topic: string, key: string, owner: string, limit: number): Promise<readonly Envelope[]> {
    return this.#owned('listHeld', consumer, topic, key, owner, async (trx, _row, id) => {
      const rows = await this.#core.runner.all(`SELECT envelope FROM ${this.#table('inboxHeld')} WHERE halt_id = ? ORDER BY seq LIMIT ?`, [id, limit], trx);
      return rows.map((held) => JSON.parse(text(held['envelope'])) as Envelope);
    }, []);
  }

  /** Removes one held message of a halt `owner` drains. */
  async drop(consumer: string, topic: string, key: string, messageId: string, owner: string): Promise<boolean> {
    return this.#owned('drop', consumer, topic, key, owner, async (trx, _row, id) => {
      const result = await this.#core.runner.run(`DELETE FROM ${this.#table('inboxHeld')} WHERE halt_id = ? AND consumer = ? AND message_id = ?`, [id, consumer, messageId], trx);
      return result.affectedRows > 0;
    }, false);
  }

  /** Halts a key `owner` drains again, at `envelope` (taken out of the held messages), and gives up the claim. */
  async rehalt(consumer: string, topic: string, key: string, envelope: Envelope, error: string, owner: string): Promise<boolean> {
    return this.#owned('rehalt', consumer, topic, key, owner, async (trx, _row, id) => {
      const { dialect, runner } = this.#core;
      await runner.run(`DELETE FROM ${this.#table('inboxHeld')} WHERE halt_id = ? AND consumer = ? AND message_id = ?`, [id, consumer, envelope.messageId], trx);
      await runner.run(
        `UPDATE ${this.#table('inboxHalts')} SET head_id = ?, head_envelope = ?, head_error = ?, halted_at = ${dialect.now}, resumed = NULL, drain_owner = NULL, drain_until = NULL WHERE halt_id = ?`,
        [envelope.messageId, JSON.stringify(envelope), boundReasonText(error), id],
        trx,
      );
      return true;
    }, false);
  }

  /** Deletes a halt `owner` drains when its head is settled and nothing is held behind it. */
  async lift(consumer: string, topic: string, key: string, owner: string): Promise<boolean> {
    return this.#owned('lift', consumer, topic, key, owner, async (trx, row, id) => {
      if (headOf(row) !== null) return false;
      // After the row lock: a hold that was inserting behind the halt has committed by now,
      // and this statement (READ COMMITTED, or SQLite's write lock) sees its row.
      const [count] = await this.#core.runner.all(`SELECT count(*) AS n FROM ${this.#table('inboxHeld')} WHERE halt_id = ?`, [id], trx);
      if (toNumber(count?.['n']) > 0) return false;
      const result = await this.#core.runner.run(`DELETE FROM ${this.#table('inboxHalts')} WHERE halt_id = ?`, [id], trx);
      return result.affectedRows > 0;
    }, false);
  }

  /** Heads parked by a resume, oldest first (by `seq`), after `options.after` when given. */
  async listParked(options: InboxListParkedOptions = {}): Promise<readonly InboxParkedMessage[]> {
    const { dialect, runner } = this.#core;
    const conditions: string[] = [];
    const params: unknown[] = [];
    if (options.consumer !== undefined) {
      conditions.push('consumer = ?');
      params.push(options.consumer);
    }
    if (options.after !== undefined) {
      conditions.push('seq > ?');
      params.push(options.after.toString());
    }
    const where = conditions.length === 0 ? '' : `WHERE ${conditions.join(' AND ')} `;
    const rows = await this.#core.operation('listParked', undefined, () =>
      runner.all(`SELECT seq, consumer, envelope, error, ${dialect.epochMs('parked_at')} AS parked_ms FROM ${this.#table('inboxParked')} ${where}ORDER BY seq LIMIT ?`, [...params, options.limit ?? 1_000]),
    );
    return rows.map((row) => ({
      consumer: text(row['consumer']),
      envelope: JSON.parse(text(row['envelope'])) as Envelope,
      error: text(row['error']),
      parkedAt: new Date(toNumber(row['parked_ms'])),
      seq: toBigInt(row['seq']),
    }));
  }

  /** How many heads are parked, by one count ({@link InboxHalts.countParked}). */
  async countParked(options: { readonly consumer?: string } = {}): Promise<number> {
    const where = options.consumer === undefined ? '' : ' WHERE consumer = ?';
    const rows = await this.#core.operation('countParked', undefined, () =>
      this.#core.runner.all(`SELECT count(*) AS n FROM ${this.#table('inboxParked')}${where}`, options.consumer === undefined ? [] : [options.consumer]),
    );
    return toNumber(rows[0]?.['n']);
  }

  /** In the halt's transaction: holds `envelope` when (its) halt row exists, locking it for share; whether it did. */
/**
   * Makes a parked head the head of a halt of its key resumed with `retry`, or holds it
   * behind the key's halt, in one transaction ({@link InboxHalts.replayParked}). The DELETE
   * decides between two concurrent replays: the second waits for the first's row lock and
   * then deletes nothing.
   */
  async replayParked(consumer: string, messageId: string): Promise<'resumed' | 'held' | false> {
    return this.#inTransaction('replayParked', async (trx) => {
      const { dialect, runner } = this.#core;
      const parked = this.#table('inboxParked');
      const [row] = await runner.all(`SELECT envelope, error FROM ${parked} WHERE consumer = ? AND message_id = ? ORDER BY seq LIMIT 1`, [consumer, messageId], trx);
      if (!row) return false;
      const removed = await runner.run(`DELETE FROM ${parked} WHERE consumer = ? AND message_id = ?`, [consumer, messageId], trx);
      if (removed.affectedRows === 0) return false;
      const envelope = JSON.parse(text(row['envelope'])) as Envelope;
      if (envelope.key === null) throw new StorageError(`parked head '${messageId}' has no key; only a keyed message halts and is parked`);
      const id = haltId(consumer, envelope.topic, envelope.key);
      for (;;) {
        if (await this.#holdIfHalted(trx, id, consumer, envelope)) return 'held';
        const { prefix, suffix } = this.#halt.insertIgnore;
        const inserted = await runner.run(
          `${prefix} ${this.#table('inboxHalts')} (halt_id, consumer, topic, msg_key, head_id, head_envelope, head_error, halted_at, resumed) VALUES (?, ?, ?, ?, ?, ?, ?, ${dialect.now}, 'retry')${suffix}`,
          [id, consumer, envelope.topic, envelope.key, envelope.messageId, JSON.stringify(envelope), text(row['error'])],
          trx,
        );
        if (inserted.affectedRows > 0) return 'resumed';
        // A halt of the key committed in between: hold behind it (next round).
      }
    });
  }

  /** Deletes a parked head for good ({@link InboxHalts.purgeParked}). */
  async purgeParked(consumer: string, messageId: string): Promise<boolean> {
    return this.#core.operation('purgeParked', undefined, async () => {
      const removed = await this.#core.runner.run(`DELETE FROM ${this.#table('inboxParked')} WHERE consumer = ? AND message_id = ?`, [consumer, messageId]);
      return removed.affectedRows > 0;
    });
  }

  async #holdIfHalted(trx: Tx, id: string, consumer: string, envelope: Envelope): Promise<boolean> {
    const { dialect, runner } = this.#core;
    const rows = await runner.all(`SELECT head_id FROM ${this.#table('inboxHalts')} WHERE halt_id = ?${this.#halt.forShare}`, [id], trx);
    if (rows.length === 0) return false;
    if (rows[0]?.['head_id'] !== null && text(rows[0]?.['head_id']) === envelope.messageId) return true;
    const { prefix, suffix } = this.#halt.insertIgnore;
    await runner.run(
      `${prefix} ${this.#table('inboxHeld')} (halt_id, consumer, message_id, envelope, held_at) VALUES (?, ?, ?, ?, ${dialect.now})${suffix}`,
      [id, consumer, envelope.messageId, JSON.stringify(envelope)],
      trx,
    );
    return true;
  }

  /** Runs `step` with the halt row locked for update when `owner` still holds its drain lease (renewing it); else resolves `otherwise`. */
  async #owned<T>(name: string, consumer: string, topic: string, key: string, owner: string, step: (trx: Tx, row: SqlRow, id: string) => Promise<T>, otherwise: T): Promise<T> {
    const id = haltId(consumer, topic, key);
    const { dialect, runner } = this.#core;
    return this.#inTransaction(name, async (trx) => {
      const [row] = await runner.all(
        `SELECT head_envelope, head_error, lease_ms FROM ${this.#table('inboxHalts')} WHERE halt_id = ? AND drain_owner = ? AND drain_until > ${dialect.now}${this.#halt.forUpdate}`,
        [id, owner],
        trx,
      );
      if (!row) return otherwise;
      await runner.run(`UPDATE ${this.#table('inboxHalts')} SET drain_until = ${dialect.plusMs(dialect.now)} WHERE halt_id = ?`, [toNumber(row['lease_ms']), id], trx);
      return step(trx, row, id);
    });
  }

  #inTransaction<T>(name: string, work: (trx: Tx) => Promise<T>): Promise<T> {
    return this.#core.operation(name, undefined, () => this.#core.runner.transaction(work, { readCommitted: this.#core.dialect.readCommitted }));
  }

  #table(name: 'inboxHalts' | 'inboxHeld' | 'inboxParked'): string {
    return this.#core.dialect.table(name);
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

  /** Refuses new calls and waits for in-flight runs. Does not close the caller's database handle. Idempotent. */
  async close(): Promise<void> {
    await this.#core.close();
  }

  /** Same as {@link SqlInboxStore.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function checkPair(messageId: string, consumer: string): void {
  const problems: string[] = [];
  if (typeof messageId !== 'string' || messageId.length === 0 || messageId.length > 200) problems.push(`'messageId' must be a non-empty string of at most 200 characters`);
  if (typeof consumer !== 'string' || consumer.length === 0 || consumer.length > 200) problems.push(`'consumer' must be a non-empty string of at most 200 characters`);
  if (problems.length > 0) throw new ConfigError(problems);
}

/** A column read back as a string (MySQL returns binary columns as Buffers). */
function text(value: unknown): string {
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

function headOf(row: SqlRow): { envelope: Envelope; error: string } | null {
  const envelope = row['head_envelope'];
  if (envelope === null || envelope === undefined) return null;
  return { envelope: JSON.parse(text(envelope)) as Envelope, error: text(row['head_error']) };
}
