// Prisma hides the database's error code inside meta.driverAdapterError (P2010): the executor
// restates it so the engine sees what it sees from every driver. A real deadlock between two
// interactive transactions proves it: the engine must read it as a lock conflict (the inbox
// retries those) and as transient, not as a permanent failure.
import { classifyDriverError, isLockConflict } from '@courier/sql-engine';
import { describe, expect, it } from 'vitest';
import { PrismaDriverError, PrismaExecutor, type PrismaRawClient } from '../src/index.js';
import { FIXTURE_TRANSACTION_OPTIONS, openPrisma } from './support/fixture.js';

describe('Prisma errors as the engine reads them (PostgreSQL)', () => {
  it('a deadlock between two interactive transactions is a lock conflict and transient; a duplicate key is a duplicate', async () => {
    const prisma = await openPrisma('postgresql', 'prisma_errors');
    const executor = new PrismaExecutor<PrismaRawClient>(prisma, 'postgresql', undefined, FIXTURE_TRANSACTION_OPTIONS);
    const base = 700_000 + Math.floor(Math.random() * 100_000);
    try {
      let bothHoldOne!: () => void;
      const held = new Promise<void>((resolve) => (bothHoldOne = resolve));
      let holding = 0;
      const side = (first: number, second: number) =>
        executor.transaction(async (tx) => {
          await executor.all('SELECT count(pg_advisory_xact_lock(?))', [first], tx);
          holding += 1;
          if (holding === 2) bothHoldOne();
          await held;
          await executor.all('SELECT count(pg_advisory_xact_lock(?))', [second], tx);
        });
      const results = await Promise.allSettled([side(base, base + 1), side(base + 1, base)]);
      const failures = results.filter((result): result is PromiseRejectedResult => result.status === 'rejected').map((result) => result.reason as unknown);
      expect(failures).toHaveLength(1);
      const [deadlock] = failures;
      expect(deadlock).toBeInstanceOf(PrismaDriverError);
      expect((deadlock as PrismaDriverError).code).toBe('40P01');
      expect(isLockConflict(deadlock)).toBe(true);
      expect(classifyDriverError(deadlock)).toBe('transient');

      // A table of its own (not TEMP: the pool may run the next transaction on another connection).
      const table = `prisma_errors_dup_${base}`;
      await executor.run(`CREATE TABLE ${table} (id int PRIMARY KEY)`);
      const duplicate = await executor
        .transaction(async (tx) => {
          await executor.run(`INSERT INTO ${table} VALUES (?)`, [1], tx);
          await executor.run(`INSERT INTO ${table} VALUES (?)`, [1], tx);
        })
        .catch((error: unknown) => error);
      await executor.run(`DROP TABLE ${table}`);
      expect(classifyDriverError(duplicate)).toBe('duplicate');
      expect(executor.classifyError(duplicate)).toBe('duplicate');
    } finally {
      await prisma.$disconnect();
    }
  });
});
