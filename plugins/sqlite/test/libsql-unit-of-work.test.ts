import { ConfigError, InMemoryBroker, createBus, defineMessage } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { withLibsqlTransaction } from '../src/index.js';
import { createLibsqlFixture, type LibsqlFixture } from './support/fixture.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });
let counter = 0;
const fixtures: LibsqlFixture[] = [];

async function setup(): Promise<LibsqlFixture> {
  counter += 1;
  const fixture = await createLibsqlFixture({ testId: `l${process.pid.toString(16)}u${Date.now().toString(16)}${counter}` });
  fixtures.push(fixture);
  return fixture;
}

afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function pending(fixture: LibsqlFixture): Promise<string[]> {
  const batch = await fixture.outbox.claim({ owner: 'inspector', limit: 100, leaseMs: 60_000, perKey: 100 });
  return batch.records.map((record) => record.envelope.messageId);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('@courier/sqlite libsql: what joining a transaction means', () => {
  it('refuses the Client (it would autocommit) and a committed transaction with a ConfigError naming the fix, writing nothing', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    const refusal = await bus.outbox(f.client as never).publish(Placed, {}).catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(ConfigError);
    expect((refusal as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((refusal as Error).message).toContain('withTransaction');
    const tx = await f.client.transaction('write');
    await tx.commit();
    const ended = await bus.outbox(tx).publish(Placed, {}).catch((error: unknown) => error);
    tx.close();
    expect(ended).toBeInstanceOf(ConfigError);
    expect((ended as ConfigError).code).toBe('UNIT_OF_WORK_ENDED');
    expect(await pending(f)).toEqual([]);
  });

  it('withLibsqlTransaction commits the publish with the business write, and a throw rolls both back', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    await withLibsqlTransaction(f.client, async (tx) => {
      await f.recordEffect(tx, 'kept');
      await bus.outbox(tx).publish(Placed, {}, { messageId: 'kept-1' });
    });
    const failure = await withLibsqlTransaction(f.client, async (tx) => {
      await f.recordEffect(tx, 'lost');
      await bus.outbox(tx).publish(Placed, {}, { messageId: 'lost-1' });
      throw new Error('business rule');
    }).catch((error: unknown) => error);
    expect((failure as Error).message).toBe('business rule');
    expect(await f.readEffects()).toEqual(['kept']);
    expect(await pending(f)).toEqual(['kept-1']);
  });

  it('withLibsqlTransaction waits for a publish that was not awaited before its COMMIT, and rolls back when that write failed', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    await withLibsqlTransaction(f.client, async (db) => {
      await f.recordEffect(db, 'kept');
      void bus.outbox(db).publish(Placed, {}, { messageId: 'unawaited-1' });
    });
    const failure = await withLibsqlTransaction(f.client, async (db) => {
      await f.recordEffect(db, 'lost');
      // A duplicate: the write fails. Not awaited (its own rejection is caught here, unobserved).
      bus.outbox(db).publish(Placed, {}, { messageId: 'unawaited-1' }).catch(() => undefined);
    }).catch((error: unknown) => error);
    expect((failure as { code?: unknown }).code).toBe('DUPLICATE_MESSAGE_ID');
    expect(await f.readEffects()).toEqual(['kept']);
    expect(await pending(f)).toEqual(['unawaited-1']);
  });

  it('store transactions of one process wait for a write transaction held across an await (the queue, and timers on SQLITE_BUSY), instead of failing or blocking the event loop', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    // Each libsql transaction has a pooled connection of its own: without the queue the
    // claims would begin beside the held transaction and get SQLITE_BUSY at once.
    const held = withLibsqlTransaction(f.client, async (tx) => {
      await bus.outbox(tx).publish(Placed, {}, { messageId: 'held-1' });
      await sleep(300);
    });
    const claims = Promise.all([1, 2, 3].map((n) => f.outbox.claim({ owner: `relay-${n}`, limit: 10, leaseMs: 60_000, perKey: 1 })));
    await held;
    expect((await claims).flatMap((batch) => batch.records.map((r) => r.envelope.messageId))).toEqual(['held-1']);
    // The application's own client.transaction('write'), outside the queue: the claim waits
    // with timers (the event loop keeps running, so the holder can commit).
    const own = await f.client.transaction('write');
    const started = Date.now();
    const claim = f.outbox.claim({ owner: 'relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    await sleep(300);
    await own.commit();
    own.close();
    await claim;
    const waited = Date.now() - started;
    expect(waited).toBeGreaterThanOrEqual(250);
    expect(waited).toBeLessThan(4_000);
  });
});
