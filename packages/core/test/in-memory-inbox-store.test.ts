import { describe, expect, it } from 'vitest';
import { ClosedError, InMemoryDatabase, InMemoryInboxStore } from '@courier/core';

function setup() {
  const clock = { now: 5_000 };
  const db = new InMemoryDatabase({ now: () => clock.now });
  const inbox = new InMemoryInboxStore({ database: db });
  const effects: string[] = [];
  return { clock, db, inbox, effects };
}

describe('InMemoryInboxStore', () => {
  it('lets racing first runs both run work, commits only the first and rolls the other back', async () => {
    const { inbox, effects } = setup();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let started = 0;
    const run = (name: string) =>
      inbox.run('m1', 'payments', async (tx) => {
        started += 1;
        tx.onCommit(() => effects.push(name));
        await gate;
        return name;
      });
    const first = run('first');
    const second = run('second');
    await new Promise((resolve) => setImmediate(resolve));
    expect(started).toBe(2);
    release();
    expect(await first).toEqual({ duplicate: false, value: 'first' });
    expect(await second).toEqual({ duplicate: true });
    expect(effects).toEqual(['first']);
  });

  it('never waits on a frozen run', async () => {
    const { inbox } = setup();
    void inbox.run('m1', 'payments', () => new Promise<never>(() => undefined));
    expect(await inbox.run('m1', 'payments', async () => 'took over')).toEqual({ duplicate: false, value: 'took over' });
  });

  it('rejects with a retriable StorageError during an outage, committing nothing', async () => {
    const { db, inbox, effects } = setup();
    const running = inbox.run('m1', 'c', async (tx) => {
      tx.onCommit(() => effects.push('x'));
      db.setAvailable(false);
    });
    await expect(running).rejects.toMatchObject({ name: 'StorageError', retriable: true });
    await expect(inbox.recordStart('m1', 'c')).rejects.toMatchObject({ retriable: true });
    db.setAvailable(true);
    expect(effects).toEqual([]);
    expect(await inbox.run('m1', 'c', async () => 1)).toEqual({ duplicate: false, value: 1 });
  });

  it('clears the start count when a run commits or the record is forgotten', async () => {
    const { inbox } = setup();
    await inbox.recordStart('m1', 'c');
    await inbox.recordStart('m1', 'c');
    await inbox.run('m1', 'c', async () => undefined);
    await inbox.forget('m1', 'c');
    expect(await inbox.recordStart('m1', 'c')).toBe(1);
    await inbox.forget('m1', 'c');
    expect(await inbox.recordStart('m1', 'c')).toBe(1);
  });

  it('prunes by commit time on the database clock', async () => {
    const { clock, inbox } = setup();
    await inbox.run('old', 'c', async () => undefined);
    clock.now += 1_000;
    await inbox.run('new', 'c', async () => undefined);
    expect(await inbox.prune(1_001)).toBe(0);
    expect(await inbox.prune(1_000)).toBe(1);
    expect(await inbox.run('old', 'c', async () => 'again')).toEqual({ duplicate: false, value: 'again' });
    expect(await inbox.run('new', 'c', async () => 'again')).toEqual({ duplicate: true });
  });

  it('rejects every call after close', async () => {
    const { inbox } = setup();
    await inbox.close();
    await inbox.close();
    await expect(inbox.run('m', 'c', async () => undefined)).rejects.toBeInstanceOf(ClosedError);
  });
});
