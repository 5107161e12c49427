import { ConfigError, InMemoryBroker, createBus, defineMessage } from '@courier/core';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { withTransaction } from '../src/index.js';
import { createBetterSqlite3Fixture, sqliteFile, type BetterSqlite3Fixture } from './support/fixture.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });
let counter = 0;
const fixtures: BetterSqlite3Fixture[] = [];
const extra: Database.Database[] = [];

async function setup(): Promise<BetterSqlite3Fixture> {
  counter += 1;
  const fixture = await createBetterSqlite3Fixture({ testId: `b${process.pid.toString(16)}u${Date.now().toString(16)}${counter}` });
  fixtures.push(fixture);
  return fixture;
}

afterEach(async () => {
  for (const db of extra.splice(0)) db.close();
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function pending(fixture: BetterSqlite3Fixture): Promise<string[]> {
  const batch = await fixture.outbox.claim({ owner: 'inspector', limit: 100, leaseMs: 60_000, perKey: 100 });
  return batch.records.map((record) => record.envelope.messageId);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('@courier/sqlite better-sqlite3: what joining a transaction means', () => {
  it('refuses a Database not in a transaction (it would autocommit) with a ConfigError naming the fix, writing nothing', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    const refusal = await bus.outbox(f.database).publish(Placed, {}).catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(ConfigError);
    expect((refusal as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((refusal as Error).message).toContain('withTransaction');
    expect(await pending(f)).toEqual([]);
  });

  it('refuses something that is not a Database, and a Database on another file', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    const notDb = await bus.outbox({} as never).publish(Placed, {}).catch((error: unknown) => error);
    expect(notDb).toBeInstanceOf(ConfigError);
    expect((notDb as Error).message).toContain('better-sqlite3 Database');
    const other = new Database(sqliteFile(`${f.tablePrefix}other`));
    extra.push(other);
    other.exec('BEGIN IMMEDIATE');
    const elsewhere = await bus.outbox(other).publish(Placed, {}).catch((error: unknown) => error);
    other.exec('ROLLBACK');
    expect(elsewhere).toBeInstanceOf(ConfigError);
    expect((elsewhere as Error).message).toContain('the outbox is in');
    expect(await pending(f)).toEqual([]);
  });

  it("better-sqlite3's synchronous db.transaction(fn) cannot carry an awaited write: the publish fails with a ConfigError, nothing is written", async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    let publish: Promise<unknown> | undefined;
    f.database.transaction(() => {
      publish = bus.outbox(f.database).publish(Placed, {});
    })();
    const refusal = await publish!.catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(ConfigError);
    expect(['UNIT_OF_WORK_ENDED', 'UNIT_OF_WORK_REQUIRED']).toContain((refusal as ConfigError).code);
    expect((refusal as Error).message).toContain('withTransaction');
    expect(await pending(f)).toEqual([]);
  });

  it('withTransaction commits the publish with the business write, and a throw rolls both back', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    await withTransaction(f.database, async (db) => {
      await f.recordEffect(db, 'kept');
      await bus.outbox(db).publish(Placed, {}, { messageId: 'kept-1' });
    });
    const failure = await withTransaction(f.database, async (db) => {
      await f.recordEffect(db, 'lost');
      await bus.outbox(db).publish(Placed, {}, { messageId: 'lost-1' });
      throw new Error('business rule');
    }).catch((error: unknown) => error);
    expect((failure as Error).message).toBe('business rule');
    expect(await f.readEffects()).toEqual(['kept']);
    expect(await pending(f)).toEqual(['kept-1']);
  });

  it('withTransaction waits for a publish that was not awaited before its COMMIT, and rolls back when that write failed', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    await withTransaction(f.database, async (db) => {
      await f.recordEffect(db, 'kept');
      void bus.outbox(db).publish(Placed, {}, { messageId: 'unawaited-1' });
    });
    const failure = await withTransaction(f.database, async (db) => {
      await f.recordEffect(db, 'lost');
      // A duplicate: the write fails. Not awaited (its own rejection is caught here, unobserved).
      bus.outbox(db).publish(Placed, {}, { messageId: 'unawaited-1' }).catch(() => undefined);
    }).catch((error: unknown) => error);
    expect((failure as { code?: unknown }).code).toBe('DUPLICATE_MESSAGE_ID');
    expect(await f.readEffects()).toEqual(['kept']);
    expect(await pending(f)).toEqual(['unawaited-1']);
  });

  it('a relay claim in the same process waits for a transaction held across an await instead of failing with SQLITE_BUSY, on the same and on a second connection', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    // Same connection: the claim queues behind withTransaction.
    const held = withTransaction(f.database, async (db) => {
      await bus.outbox(db).publish(Placed, {}, { messageId: 'same-1' });
      await sleep(300);
    });
    const claimed = f.outbox.claim({ owner: 'relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    await held;
    expect((await claimed).records.map((r) => r.envelope.messageId)).toEqual(['same-1']);
    // A second connection on the file (the application's own) holds the write lock across a
    // timer. SQLite's busy handler would sleep on the event loop's thread, so the holder could
    // never commit: the claim must wait with timers instead.
    const second = new Database(f.file, { timeout: 5_000 });
    extra.push(second);
    second.exec('BEGIN IMMEDIATE');
    const started = Date.now();
    const claim = f.outbox.claim({ owner: 'relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    await sleep(300);
    second.exec('COMMIT');
    await claim;
    const waited = Date.now() - started;
    expect(waited).toBeGreaterThanOrEqual(250);
    expect(waited).toBeLessThan(4_000);
  });
});
