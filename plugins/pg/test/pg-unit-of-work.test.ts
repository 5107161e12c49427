import { ConfigError, InMemoryBroker, StorageError, createBus, defineMessage } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { withTransaction } from '@courier/pg';
import { createPgFixture, type PgFixture } from './support/pg-fixture.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });
let counter = 0;
const fixtures: PgFixture[] = [];

async function setup(): Promise<PgFixture> {
  counter += 1;
  const fixture = await createPgFixture({ testId: `t${process.pid.toString(16)}u${Date.now().toString(16)}${counter}` });
  fixtures.push(fixture);
  return fixture;
}

afterEach(async () => {
  for (const fixture of fixtures.splice(0)) {
    await fixture.pool.query(`DROP TABLE IF EXISTS ${fixture.effectsTable}`).catch(() => undefined);
    await fixture.close();
  }
});

async function pending(fixture: PgFixture): Promise<string[]> {
  const batch = await fixture.outbox.claim({ owner: 'inspector', limit: 100, leaseMs: 60_000, perKey: 100 });
  return batch.records.map((record) => record.envelope.messageId);
}

describe('@courier/pg: what joining a transaction means', () => {
  it('refuses a Pool with a ConfigError naming the fix, writing nothing', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    const refusal = await bus
      .outbox(f.pool as never)
      .publish(Placed, {})
      .catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(ConfigError);
    expect((refusal as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((refusal as Error).message).toContain('PoolClient');
    expect((refusal as Error).message).toContain('withTransaction');
    expect(await pending(f)).toEqual([]);
  });

  it('refuses a client with no transaction open (it would autocommit), also one the store never saw before', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    // A client of the store's pool (followed from its creation) and a pg Client of its own (probed once).
    const pooled = await f.pool.connect();
    const { default: pg } = await import('pg');
    const own = new pg.Client({ connectionString: (f.pool as unknown as { options: { connectionString: string } }).options.connectionString });
    await own.connect();
    try {
      for (const client of [pooled, own]) {
        const refusal = await bus
          .outbox(client as never)
          .publish(Placed, {})
          .catch((error: unknown) => error);
        expect(refusal, 'an idle client is refused').toBeInstanceOf(ConfigError);
        expect((refusal as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
        expect((refusal as Error).message).toContain('BEGIN');
      }
      // Between BEGIN and COMMIT the same clients are accepted.
      const ids: string[] = [];
      for (const client of [pooled, own]) {
        await client.query('BEGIN');
        ids.push(await bus.outbox(client as never).publish(Placed, {}));
        await client.query('COMMIT');
      }
      expect((await pending(f)).sort()).toEqual(ids.sort());
    } finally {
      pooled.release();
      await own.end();
    }
  });

  it('a savepoint rolled back takes its messages with it; the rest of the transaction commits', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    let kept = '';
    await withTransaction(f.pool, async (client) => {
      kept = await bus.outbox(client).publish(Placed, {}, { key: 'k' });
      await client.query('SAVEPOINT inner_work');
      await bus.outbox(client).publish(Placed, {}, { key: 'k' });
      await f.recordEffect(client, 'inside-savepoint');
      await client.query('ROLLBACK TO SAVEPOINT inner_work');
      await f.recordEffect(client, 'after-savepoint');
    });
    expect(await pending(f)).toEqual([kept]);
    expect(await f.readEffects()).toEqual(['after-savepoint']);
  });

  it('withTransaction awaits a publish the callback did not await, and a failed one rolls everything back', async () => {
    const f = await setup();
    const bus = createBus({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    let id = '';
    await withTransaction(f.pool, async (client) => {
      await f.recordEffect(client, 'effect');
      // Not awaited on purpose: withTransaction waits for it before COMMIT.
      void bus
        .outbox(client)
        .publish(Placed, {})
        .then((published) => (id = published));
    });
    expect(await pending(f)).toEqual([id]);
    const duplicate = await withTransaction(f.pool, async (client) => {
      await f.recordEffect(client, 'lost-effect');
      bus
        .outbox(client)
        .publish(Placed, {}, { messageId: id })
        .catch(() => undefined);
    }).catch((error: unknown) => error);
    expect(duplicate).toBeInstanceOf(StorageError);
    expect((duplicate as StorageError).code).toBe('DUPLICATE_MESSAGE_ID');
    expect(await f.readEffects()).toEqual(['effect']);
  });
});
