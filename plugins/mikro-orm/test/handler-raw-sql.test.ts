// Users ask whether raw SQL in a handler joins the handler's transaction (and so is
// exactly-once with the inbox record). It does when it goes through `ctx.tx` — the
// EntityManager fork the inbox store runs the handler in — and it does not when it goes
// to the connection without that transaction. Both halves are pinned here, because the
// plugin README promises the first and warns about the second.
import { eventually } from '@courier/conformance';
import { InMemoryBroker, UnrecoverableError, createBus, defineMessage } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

/** The SQL EntityManager's `execute` (every SQL driver's EntityManager has it), typed by the subset used. */
type SqlEntityManager = EntityManager & { execute(sql: string, params: unknown[], method: 'run'): Promise<unknown> };

const RawSql = defineMessage('mikroorm.RawSql', { version: 1 });

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

type Way = 'em.execute' | 'connection.execute with the transaction' | 'connection.execute without it';

/** Runs one message whose handler inserts `effect` the given way and then fails for good. */
async function insertThenFail(fixture: MikroOrmFixture, way: Way, effect: string): Promise<void> {
  const broker = new InMemoryBroker();
  cleanups.push(() => broker.close());
  const connection = broker.connect();
  const bus = createBus<EntityManager>({ outbox: fixture.outbox, inbox: fixture.inbox, transport: connection });
  cleanups.push(() => bus.stop({ timeoutMs: 5_000 }));
  const table = fixture.dialect === 'postgresql' ? `"${fixture.tablePrefix}effects"` : `\`${fixture.tablePrefix}effects\``;
  const insert = `INSERT INTO ${table} (effect_id) VALUES ('${effect}')`;
  bus.subscribe('raw', RawSql, async (_message, ctx) => {
    const em = ctx.tx as SqlEntityManager;
    if (way === 'em.execute') await em.execute(insert, [], 'run');
    else if (way === 'connection.execute with the transaction') await em.getConnection().execute(insert, [], 'run', em.getTransactionContext());
    else await em.getConnection().execute(insert, [], 'run');
    throw new UnrecoverableError('the handler fails after its insert');
  });
  await bus.start({ relay: false, consumers: true });
  const message = envelope(RawSql.topic, null, { type: RawSql.type, payload: '{}' });
  expect((await connection.publish([message]))[0]?.ok).toBe(true);
  // The handler's transaction has rolled back once the message is dead-lettered.
  await eventually(async () => expect(await connection.deadLetters.list('raw')).toHaveLength(1), { timeoutMs: 15_000 });
}

describe.each(['postgresql', 'mariadb'] as const)('raw SQL in a handler (%s)', (dialect) => {
  it.each(['em.execute', 'connection.execute with the transaction'] as const)('through ctx.tx (%s) joins the handler transaction: rolled back with it', async (way) => {
    const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
    cleanups.push(() => fixture.close());
    await insertThenFail(fixture, way, 'joined');
    expect(await fixture.readEffects()).toEqual([]);
  });

  it('straight to the connection, without the transaction, does not: it stays although the handler failed', async () => {
    const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
    cleanups.push(() => fixture.close());
    await insertThenFail(fixture, 'connection.execute without it', 'outside');
    expect([...(await fixture.readEffects())]).toEqual(['outside']);
  });
});
