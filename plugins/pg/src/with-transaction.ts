import { StorageError } from '@courier/core';
import type { Pool, PoolClient } from 'pg';
import { isConnectionError } from './pg-executor.js';
import { settleAppends } from './pending-appends.js';

/**
 * Runs `work` in a transaction on a client of `pool`: `BEGIN`, `work(client)`, then `COMMIT`
 * when it resolves or `ROLLBACK` when it throws (the error rethrown unchanged), and gives
 * the client back to the pool (destroyed when the connection broke).
 *
 * `await withTransaction(pool, async (client) => { await client.query(...); await bus.outbox(client).publish(...); })`
 *
 * Guarantees: before `COMMIT` it waits for every outbox append still being written on the
 * client (a `publish` the callback did not await); if one failed it rolls back and rejects
 * with that failure. A `COMMIT` that PostgreSQL answers with `ROLLBACK` (a statement of the
 * transaction failed and the callback swallowed the error) rejects with a `StorageError`
 * saying so. The business change and the messages commit together
 * or not at all, and the caller learns which.
 */
export async function withTransaction<T>(pool: Pool, work: (client: PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const control = async (sql: string) => {
    try {
      return await client.query(sql);
    } catch (error) {
      if (isConnectionError(error)) broken = error instanceof Error ? error : new Error(String(error));
      throw error;
    }
  };
  try {
    await control('BEGIN');
    let result: T;
    try {
      result = await work(client);
      await settleAppends(client);
    } catch (error) {
      await settleAppends(client).catch(() => undefined);
      await control('ROLLBACK').catch(() => undefined);
      throw error;
    }
    const commit = await control('COMMIT');
    if (commit.command === 'ROLLBACK') {
      throw new StorageError('the transaction was rolled back at COMMIT: one of its statements had failed (its error was caught inside the callback)', {
        retriable: false,
      });
    }
    return result;
  } finally {
    client.release(broken);
  }
}
