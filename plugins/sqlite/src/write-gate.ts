import { classifyDriverError } from '@courier/sql-engine';

/**
 * How long a transaction of this package waits for SQLite's write lock, in total, before it
 * fails with the last `SQLITE_BUSY` (as the engine's `SQLITE_BUSY_TIMEOUT_MS`: a loaded
 * 2-core machine with three processes on one file needed more than 5 s).
 */
export const WRITE_LOCK_WAIT_MS = 30_000;

/**
 * One queue of write transactions per connection owner (a better-sqlite3 `Database`, a
 * libsql `Client`), in this process.
 *
 * Why: both drivers run SQLite synchronously on the event loop's thread. A transaction
 * that holds the write lock across an `await` while another transaction of the same
 * process asks for it cannot be waited out by SQLite's busy handler: the handler sleeps
 * on the very thread the holder needs to reach its COMMIT, so the wait always runs to
 * the busy timeout and then fails. The queue makes transactions of one process take turns
 * without blocking the thread; the busy handling below is only for other processes.
 */
export class WriteGate {
  #tail: Promise<void> = Promise.resolve();

  /** Runs `work` once every transaction queued before it has finished; the queue moves on whether it resolves or throws. */
  run<T>(work: () => Promise<T>): Promise<T> {
    const result = this.#tail.then(work);
    this.#tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}

const GATES = new WeakMap<object, WriteGate>();

/** The {@link WriteGate} of `owner`, shared by every store and helper of this package in the process. */
export function gateOf(owner: object): WriteGate {
  let gate = GATES.get(owner);
  if (gate === undefined) {
    gate = new WriteGate();
    GATES.set(owner, gate);
  }
  return gate;
}

/**
 * Calls `begin` (which takes SQLite's write lock at once: `BEGIN IMMEDIATE`, with the
 * connection's busy timeout at 0 so it never sleeps on the thread) until it succeeds,
 * waiting between attempts with timers (1 ms doubling to 50 ms), so the event loop keeps
 * running while another process holds the lock. Gives up after {@link WRITE_LOCK_WAIT_MS}
 * with the last `SQLITE_BUSY`, which the engine classifies as retriable.
 */
export async function beginWithRetry<T>(begin: () => T | Promise<T>): Promise<T> {
  const deadline = Date.now() + WRITE_LOCK_WAIT_MS;
  let pause = 1;
  for (;;) {
    try {
      return await begin();
    } catch (error) {
      if (!isBusy(error) || Date.now() >= deadline) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(pause * 2, 50);
  }
}

/** `SQLITE_BUSY` (another connection holds the lock), as either driver reports it. */
export function isBusy(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current instanceof Error && !seen.has(current); current = current.cause) {
    seen.add(current);
    const code = (current as { code?: unknown; rawCode?: unknown }).code;
    if (typeof code === 'string' && code.startsWith('SQLITE_BUSY')) return true;
    if (/database is locked|SQLITE_BUSY/.test(current.message)) return true;
  }
  return classifyDriverError(error) === 'transient' && /locked|busy/i.test(String((error as Error)?.message));
}

/** better-sqlite3 and libsql bind numbers, bigints, strings, buffers and null only. */
export function sqliteValue(value: unknown): unknown {
  if (value === undefined) return null;
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (value instanceof Date) return value.toISOString();
  return value;
}

/** A short name for what a caller passed, for error messages. */
export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'undefined';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}

/**
 * Outbox writes started in a transaction and not yet finished, by the connection owner's
 * transaction object, so the transaction this package runs waits for them before its COMMIT
 * (a `publish` the caller did not await is still part of it) and rolls back if one failed.
 */
const PENDING = new WeakMap<object, Set<Promise<void>>>();

/** Records `write` as started in the transaction `key` stands for; its outcome is reported by {@link settleWrites}. */
export function trackWrite(key: object, write: Promise<void>): void {
  let writes = PENDING.get(key);
  if (writes === undefined) {
    writes = new Set();
    PENDING.set(key, writes);
  }
  writes.add(write);
  // Reported by settleWrites (or by the caller's own await): never an unhandled rejection.
  write.catch(() => undefined);
}

/** Waits for every write started under `key` and forgets them; throws the first one's error. */
export async function settleWrites(key: object): Promise<void> {
  const writes = PENDING.get(key);
  if (writes === undefined) return;
  PENDING.delete(key);
  const outcomes = await Promise.allSettled(writes);
  const failed = outcomes.find((outcome) => outcome.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
}
