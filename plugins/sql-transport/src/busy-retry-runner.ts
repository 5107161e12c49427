import { setTimeout as sleep } from 'node:timers/promises';
import type { Transaction } from '@mikro-orm/core';
import { isLockConflict } from '@courier/sql-engine';
import { SqlRunner } from '@courier/mikro-orm/sql-kit';

const FIRST_WAIT_MS = 5;
const LONGEST_WAIT_MS = 100;

/**
 * A `SqlRunner` that runs each transaction again when it lost a lock conflict before doing
 * anything (SQLite's `SQLITE_BUSY` at the statement that takes the write lock, a deadlock
 * or serialization failure elsewhere), waiting asynchronously between tries with jittered
 * backoff, for up to `patienceMs` in all. Transactions are re-run whole, so `work` must be
 * safe to run again (it only ever ran inside a transaction that rolled back).
 */
export class BusyRetryRunner extends SqlRunner {
  readonly #patienceMs: number;

  constructor(...[connection, prologue, patienceMs]: [...ConstructorParameters<typeof SqlRunner>, number]) {
    super(connection, prologue);
    this.#patienceMs = patienceMs;
  }

  override async transaction<T>(work: (trx: Transaction) => Promise<T>, options: { readCommitted?: boolean; writeLock?: boolean } = {}): Promise<T> {
    const deadline = Date.now() + this.#patienceMs;
    let wait = FIRST_WAIT_MS;
    for (;;) {
      try {
        return await super.transaction(work, options);
      } catch (error) {
        if (!isLockConflict(error) || Date.now() + wait > deadline) throw error;
        await sleep(wait * (0.5 + Math.random()));
        wait = Math.min(LONGEST_WAIT_MS, wait * 2);
      }
    }
  }
}
