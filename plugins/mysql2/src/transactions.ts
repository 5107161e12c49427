import type { Pool, PoolConnection } from 'mysql2/promise';

/**
 * Outbox writes started on a connection and not yet known to have finished, chained in
 * append order. Shared by every store of the process, so a transaction run by this package
 * waits for the writes of all of them before its COMMIT (or its ROLLBACK).
 */
export interface PendingWrites {
  /** Settles (never rejects) when every write started so far has finished. */
  tail: Promise<void>;
  /** The first write error; the transaction must not commit after it. */
  error?: { readonly value: unknown };
  /** Whether a write of this batch wrote rows (the relays are woken after the commit). */
  wrote: boolean;
  /** The wake-ups of the stores that wrote, called after the commit. */
  readonly committed: Set<() => void>;
}

/** Pending outbox writes by connection (see {@link PendingWrites}). */
export const PENDING = new WeakMap<PoolConnection, PendingWrites>();

/**
 * Connections whose transaction this package ran and ended: the promise wrapper mysql2
 * hands out per `getConnection()` is never handed out again, so a `publish` on one is
 * refused at once instead of autocommitting on whichever transaction runs there next.
 */
export const ENDED = new WeakSet<PoolConnection>();

/**
 * Waits for every outbox write started on `connection` and takes them off it, throwing the
 * first write's error (a `StorageError`, or the `ConfigError` of a connection in
 * autocommit). Call it before COMMIT when you run the transaction yourself and did not
 * await each `publish` — {@link withTransaction} does it for you. Returns the relays'
 * wake-up, to call once the transaction committed (optional: relays also poll).
 */
export async function settleAppends(connection: PoolConnection): Promise<() => void> {
  const pending = PENDING.get(connection);
  if (pending === undefined) return () => undefined;
  await pending.tail;
  if (PENDING.get(connection) === pending) PENDING.delete(connection);
  if (pending.error !== undefined) throw pending.error.value;
  return () => {
    if (pending.wrote) for (const wake of pending.committed) wake();
  };
}

/**
 * Runs `work` in a transaction of its own on a connection from `pool` and owns its
 * BEGIN/COMMIT: commits when `work` resolves, after every outbox write it started has
 * finished (so a `publish` not awaited is still part of the commit); rolls back when `work`
 * throws or a write failed, rethrowing that error, after the writes it started have
 * finished (so none lands after the ROLLBACK). The connection goes back to the pool
 * (destroyed instead when its rollback failed), and a later `publish` on it is refused.
 * Relays are woken after the commit.
 *
 * Use it where nothing in your code shows whether a `PoolConnection` is between BEGIN and
 * COMMIT; the outbox checks that too (see `Mysql2OutboxStore`).
 */
export async function withTransaction<T>(pool: Pool, work: (connection: PoolConnection) => Promise<T>): Promise<T> {
  return runInTransaction(await pool.getConnection(), work, false);
}

/**
 * Begins a transaction on `connection` (READ COMMITTED for it alone when asked), runs
 * `work`, waits for the outbox writes started on the connection, runs `beforeCommit`, then
 * commits — or rolls back when anything of that threw — and releases the connection to its
 * pool (destroys it when a rollback failed or the error was fatal to the connection).
 */
export async function runInTransaction<T>(
  connection: PoolConnection,
  work: (tx: PoolConnection) => Promise<T>,
  readCommitted: boolean,
  beforeCommit?: (tx: PoolConnection) => Promise<void>,
): Promise<T> {
  let healthy = true;
  try {
    // SET TRANSACTION without SESSION applies to the next transaction only, so the
    // connection goes back to the pool with the application's own default.
    if (readCommitted) await connection.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED');
    await connection.beginTransaction();
    let result: T;
    let wake: () => void;
    try {
      result = await work(connection);
      wake = await settleAppends(connection);
      await beforeCommit?.(connection);
    } catch (error) {
      // Writes still in flight would otherwise run after the ROLLBACK, in autocommit.
      await PENDING.get(connection)?.tail;
      try {
        await connection.rollback();
      } catch {
        healthy = false;
      }
      throw error;
    }
    await connection.commit();
    wake();
    return result;
  } catch (error) {
    // A failed BEGIN or COMMIT on a broken socket leaves the session unusable.
    healthy = healthy && !isFatal(error);
    throw error;
  } finally {
    PENDING.delete(connection);
    ENDED.add(connection);
    if (healthy) connection.release();
    else connection.destroy();
  }
}

function isFatal(error: unknown): boolean {
  return error !== null && typeof error === 'object' && (error as { fatal?: unknown }).fatal === true;
}
