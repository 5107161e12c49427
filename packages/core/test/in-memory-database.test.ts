import { describe, expect, it } from 'vitest';
import { CourierError, InMemoryDatabase, StorageError } from '@courier/core';

describe('InMemoryDatabase', () => {
  it('applies staged writes at commit and discards them when the work throws', async () => {
    const db = new InMemoryDatabase();
    const applied: string[] = [];
    await db.transaction(async (tx) => tx.onCommit(() => applied.push('kept')));
    await expect(
      db.transaction(async (tx) => {
        tx.onCommit(() => applied.push('lost'));
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    expect(applied).toEqual(['kept']);
  });

  it('runs prepare checks before any write; a failing check applies nothing and rolls back', async () => {
    const db = new InMemoryDatabase();
    const applied: string[] = [];
    const tx = db.begin();
    tx.onCommit(() => applied.push('a'));
    tx.onPrepare(() => {
      throw new Error('unique key taken');
    });
    await expect(tx.commit()).rejects.toThrow('unique key taken');
    expect(applied).toEqual([]);
    expect(tx.state).toBe('rolled-back');
  });

  it('runs afterCommit callbacks after the writes and ignores their errors', async () => {
    const db = new InMemoryDatabase();
    const order: string[] = [];
    const tx = db.begin();
    tx.afterCommit(() => {
      order.push('after');
      throw new Error('ignored');
    });
    tx.onCommit(() => order.push('write'));
    await tx.commit();
    expect(order).toEqual(['write', 'after']);
  });

  it('refuses an ended transaction with UNIT_OF_WORK_ENDED and says what to do', async () => {
    const db = new InMemoryDatabase();
    const tx = db.begin();
    await tx.commit();
    expect(tx.ended).toBe(true);
    expect(() => tx.onCommit(() => undefined)).toThrowError(CourierError);
    expect(() => tx.onCommit(() => undefined)).toThrowError(/already committed.*db\.transaction\(\)/);
    await expect(tx.commit()).rejects.toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    await expect(tx.rollback()).rejects.toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    const rolledBack = db.begin();
    await rolledBack.rollback();
    await rolledBack.rollback();
    expect(() => rolledBack.onPrepare(() => undefined)).toThrowError(/already rolled back/);
  });

  it('simulates an outage: begin throws and open transactions fail at commit, retriably', async () => {
    const db = new InMemoryDatabase({ name: 'orders' });
    const open = db.begin();
    const applied: string[] = [];
    open.onCommit(() => applied.push('x'));
    db.setAvailable(false);
    expect(() => db.begin()).toThrowError(StorageError);
    await expect(open.commit()).rejects.toMatchObject({ code: 'STORAGE', retriable: true });
    expect(open.state).toBe('rolled-back');
    expect(applied).toEqual([]);
    db.setAvailable(true);
    await db.transaction(async (tx) => tx.onCommit(() => applied.push('y')));
    expect(applied).toEqual(['y']);
  });

  it('uses the injected clock', () => {
    let now = 1_000;
    const db = new InMemoryDatabase({ now: () => now });
    expect(db.now()).toBe(1_000);
    now = 2_000;
    expect(db.now()).toBe(2_000);
  });
});
