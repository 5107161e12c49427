import { CourierError, StorageError } from '../errors.js';

/** Arguments of {@link InMemoryDatabase}. */
export interface InMemoryDatabaseConfig {
  /** The database clock in epoch milliseconds; every due and lease comparison uses it. Default `Date.now`. */
  readonly now?: () => number;
  /** Name used in error messages. Default `'in-memory'`. */
  readonly name?: string;
}

/** Lifecycle of an {@link InMemoryTransaction}. */
export type InMemoryTransactionState = 'active' | 'committed' | 'rolled-back';

/**
 * A tiny transactional store for unit tests: the unit of work shared by
 * {@link InMemoryOutboxStore}, {@link InMemoryInboxStore} and the user's own effects.
 *
 * Guarantees: a commit is applied synchronously, so it is atomic with respect to every
 * other operation; `now()` is the single database clock; while unavailable (see
 * {@link InMemoryDatabase.setAvailable}) new units of work, commits and every store
 * operation fail with a retriable `StorageError`, as during a database restart.
 */
export class InMemoryDatabase {
  readonly #now: () => number;
  readonly #name: string;
  #available = true;
  #nextTransactionId = 1;

  constructor(config: InMemoryDatabaseConfig = {}) {
    this.#now = config.now ?? Date.now;
    this.#name = config.name ?? 'in-memory';
  }

  /** The database clock, in epoch milliseconds. */
  now(): number {
    return this.#now();
  }

  /** False while an outage is simulated. */
  get available(): boolean {
    return this.#available;
  }

  /**
   * Simulates a database outage (`false`) or its end (`true`). While unavailable, every
   * store operation and every commit rejects with a retriable `StorageError`; units of
   * work still open when it began fail at commit and are rolled back.
   */
  setAvailable(available: boolean): void {
    this.#available = available;
  }

  /** Throws a retriable `StorageError` naming `operation` when an outage is simulated. */
  assertAvailable(operation: string): void {
    if (!this.#available) {
      throw new StorageError(`database '${this.#name}' is unavailable; '${operation}' failed (retry after it is back)`, {
        retriable: true,
      });
    }
  }

  /**
   * Opens a unit of work; the caller must `commit()` or `rollback()` it.
   * Throws a retriable `StorageError` during a simulated outage.
   */
  begin(): InMemoryTransaction {
    this.assertAvailable('begin');
    const id = this.#nextTransactionId;
    this.#nextTransactionId += 1;
    return new InMemoryTransaction(this, id);
  }

  /**
   * Runs `work` in a new unit of work: commits when it resolves, rolls back when it
   * throws (rethrowing its error), and rejects if the commit fails (nothing is applied).
   */
  async transaction<T>(work: (tx: InMemoryTransaction) => Promise<T>): Promise<T> {
    const tx = this.begin();
    let value: T;
    try {
      value = await work(tx);
    } catch (error) {
      if (tx.state === 'active') await tx.rollback();
      throw error;
    }
    await tx.commit();
    return value;
  }
}

/**
 * A unit of work of an {@link InMemoryDatabase}: writes are staged into it and applied
 * atomically at commit.
 *
 * Guarantees: at `commit()` every `onPrepare` check runs first (any throw aborts the
 * commit, applies nothing and rolls back), then every `onCommit` write runs
 * synchronously in registration order, then `afterCommit` callbacks run (their errors
 * are ignored). A transaction that has committed or rolled back is ended: staging into
 * it or committing it throws `CourierError` code `UNIT_OF_WORK_ENDED`.
 */
export class InMemoryTransaction {
  /** The database this unit of work belongs to. */
  readonly database: InMemoryDatabase;
  /** Unique per database, increasing in begin order. */
  readonly id: number;
  #state: InMemoryTransactionState = 'active';
  readonly #prepare: (() => void)[] = [];
  readonly #writes: (() => void)[] = [];
  readonly #after: (() => void)[] = [];

  /** Use {@link InMemoryDatabase.begin} or {@link InMemoryDatabase.transaction}. */
  constructor(database: InMemoryDatabase, id: number) {
    this.database = database;
    this.id = id;
  }

  /** `active` until committed or rolled back. */
  get state(): InMemoryTransactionState {
    return this.#state;
  }

  /** True once committed or rolled back. */
  get ended(): boolean {
    return this.#state !== 'active';
  }

  /** Throws `CourierError` code `UNIT_OF_WORK_ENDED` when the transaction has ended. */
  assertActive(operation = 'use'): void {
    if (this.#state !== 'active') {
      throw new CourierError(
        'UNIT_OF_WORK_ENDED',
        `transaction '${this.id}' has already ${this.#state === 'committed' ? 'committed' : 'rolled back'}; '${operation}' needs a live one (open a new unit of work with db.transaction() or db.begin())`,
      );
    }
  }

  /** Registers a check run at commit before any write is applied; throwing aborts the commit (e.g. a unique key taken). */
  onPrepare(check: () => void): void {
    this.assertActive('onPrepare');
    this.#prepare.push(check);
  }

  /** Stages a write applied synchronously at commit, atomically with every other staged write. */
  onCommit(write: () => void): void {
    this.assertActive('onCommit');
    this.#writes.push(write);
  }

  /** Registers a notification run after a successful commit (errors are ignored). */
  afterCommit(callback: () => void): void {
    this.assertActive('afterCommit');
    this.#after.push(callback);
  }

  /**
   * Applies every staged write atomically. Rejects (and rolls back, applying nothing)
   * when a prepare check throws or the database is unavailable.
   */
  async commit(): Promise<void> {
    this.assertActive('commit');
    try {
      this.database.assertAvailable('commit');
      for (const check of this.#prepare) check();
    } catch (error) {
      this.#end('rolled-back');
      throw error;
    }
    // Writes run synchronously with no await in between, so no other operation can
    // observe half a commit.
    for (const write of this.#writes) write();
    const after = [...this.#after];
    this.#end('committed');
    for (const callback of after) {
      try {
        callback();
      } catch {
        // A notification failing must not turn a committed unit of work into an error.
      }
    }
  }

  /** Discards every staged write. A no-op when already rolled back; throws `UNIT_OF_WORK_ENDED` after a commit. */
  async rollback(): Promise<void> {
    if (this.#state === 'rolled-back') return;
    this.assertActive('rollback');
    this.#end('rolled-back');
  }

  #end(state: InMemoryTransactionState): void {
    this.#state = state;
    this.#prepare.length = 0;
    this.#writes.length = 0;
    this.#after.length = 0;
  }
}

/**
 * Returns `tx` as a live {@link InMemoryTransaction} of `database`, or throws
 * `CourierError` code `UNIT_OF_WORK_REQUIRED` (not one of this database's transactions)
 * or `UNIT_OF_WORK_ENDED` (already committed or rolled back). For in-memory stores.
 */
export function requireTransaction(tx: unknown, database: InMemoryDatabase, operation: string): InMemoryTransaction {
  if (!(tx instanceof InMemoryTransaction)) {
    throw new CourierError(
      'UNIT_OF_WORK_REQUIRED',
      `'${operation}' needs an InMemoryTransaction, got ${tx === null ? 'null' : typeof tx}; pass the tx from db.transaction() or db.begin()`,
    );
  }
  if (tx.database !== database) {
    throw new CourierError(
      'UNIT_OF_WORK_REQUIRED',
      `'${operation}' got a transaction of another InMemoryDatabase; use one database for the stores and the unit of work`,
    );
  }
  tx.assertActive(operation);
  return tx;
}

/** Throws `CourierError` code `ABORTED` when `signal` is aborted. */
export function throwIfAborted(signal: AbortSignal | undefined, operation: string): void {
  if (signal?.aborted) {
    throw new CourierError('ABORTED', `'${operation}' was aborted`, { cause: signal.reason });
  }
}
