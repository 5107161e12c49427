// A handler whose unit of work fails to commit after the handler returned, with an error
// the store reports as retriable (a statement timeout), is a failure of that message:
// each run counts an attempt and the message is dead-lettered after maxAttempts, instead
// of being retried forever as if the database were unreachable.
import { eventually } from '@courier/conformance';
import { InMemoryBroker, createBus, defineMessage, type Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type FixtureDialect, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const Tested = defineMessage('mikroorm.Tested', { version: 1 });
const MAX_ATTEMPTS = 3;

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/**
 * Makes every effect whose id starts with `fail:` break the commit of its transaction
 * after the handler returned. PostgreSQL: a deferred constraint trigger raising SQLSTATE
 * 57014 (what a statement timeout raises) at COMMIT. MariaDB has no deferred triggers: a
 * trigger signals errno 1969 (max_statement_time exceeded) on the insert, which MikroORM
 * runs in the flush that follows the handler, not in the handler.
 */
async function failCommitsOfFailEffects(fixture: MikroOrmFixture): Promise<void> {
  const effects = `${fixture.tablePrefix}effects`;
  const name = `${fixture.tablePrefix}fail_at_commit`;
  if (fixture.dialect === 'postgresql') {
    await fixture.sql(
      `CREATE FUNCTION "${name}"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN ` +
        `RAISE EXCEPTION 'canceling statement due to statement timeout (at commit)' USING ERRCODE = 'query_canceled'; END $$`,
    );
    await fixture.sql(
      `CREATE CONSTRAINT TRIGGER "${name}" AFTER INSERT ON "${effects}" DEFERRABLE INITIALLY DEFERRED ` +
        `FOR EACH ROW WHEN (NEW.effect_id LIKE 'fail:%') EXECUTE FUNCTION "${name}"()`,
    );
  } else {
    await fixture.sql(
      `CREATE TRIGGER \`${name}\` BEFORE INSERT ON \`${effects}\` FOR EACH ROW BEGIN ` +
        `IF NEW.effect_id LIKE 'fail:%' THEN SIGNAL SQLSTATE '70100' SET MYSQL_ERRNO = 1969, ` +
        `MESSAGE_TEXT = 'Query execution was interrupted (max_statement_time exceeded at flush)'; END IF; END`,
    );
  }
}

async function setUp(dialect: FixtureDialect): Promise<{ fixture: MikroOrmFixture; broker: InMemoryBroker; connection: ReturnType<InMemoryBroker['connect']>; bus: Bus<EntityManager> }> {
  const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
  cleanups.push(() => fixture.close());
  await failCommitsOfFailEffects(fixture);
  const broker = new InMemoryBroker();
  cleanups.push(() => broker.close());
  const connection = broker.connect();
  const bus = createBus<EntityManager>({
    outbox: fixture.outbox,
    inbox: fixture.inbox,
    transport: connection,
    retry: { maxAttempts: MAX_ATTEMPTS, initialDelayMs: 5, maxDelayMs: 20, jitter: 0 },
  });
  cleanups.push(() => bus.stop({ timeoutMs: 5_000 }));
  return { fixture, broker, connection, bus };
}

describe.each(['postgresql', 'mariadb', 'mysql-driver'] as const)('a handler whose commit always fails (%s)', (dialect) => {
  it('counts an attempt per run, dead-letters it after maxAttempts, and its key moves on', async () => {
    const { fixture, connection, bus } = await setUp(dialect);
    const runs: string[] = [];
    bus.subscribe(
      'shipping',
      Tested,
      async (message, ctx) => {
        const { name } = message.payload as { name: string };
        runs.push(`${name}@${ctx.attempt}`);
        // Persisted, not flushed: the handler returns, then the unit of work flushes and commits.
        ctx.tx.persist(ctx.tx.create(fixture.Effect, { effectId: name === 'bad' ? `fail:${message.messageId}` : name }));
      },
      { ordered: true },
    );
    await bus.start({ relay: false, consumers: true });
    const bad = envelope(Tested.topic, 'k', { type: Tested.type, payload: JSON.stringify({ name: 'bad' }) });
    const next = envelope(Tested.topic, 'k', { type: Tested.type, payload: JSON.stringify({ name: 'next' }) });
    const other = envelope(Tested.topic, 'other', { type: Tested.type, payload: JSON.stringify({ name: 'other' }) });
    const published = await connection.publish([bad, next, other]);
    expect(published.every((result) => result.ok)).toBe(true);

    const [letter] = await eventually(
      async () => {
        const letters = await connection.deadLetters.list('shipping');
        expect(letters).toHaveLength(1);
        return letters;
      },
      { timeoutMs: 15_000 },
    );
    expect(letter).toMatchObject({
      attempt: MAX_ATTEMPTS,
      envelope: { messageId: bad.messageId },
      reason: { code: 'ATTEMPTS_EXHAUSTED', message: expect.stringMatching(new RegExp(`^${MAX_ATTEMPTS} attempts; last: .*(statement timeout|max_statement_time)`)) },
    });
    await eventually(async () => expect([...(await fixture.readEffects())].sort()).toEqual(['next', 'other']), { timeoutMs: 15_000 });
    expect(runs.filter((run) => !run.startsWith('other'))).toEqual(['bad@1', 'bad@2', 'bad@3', 'next@1']);
    // The effect is visible once its transaction committed; the counter moves once the
    // delivery is acknowledged after it, a moment later.
    await eventually(() => expect(bus.health().counters).toMatchObject({ retries: MAX_ATTEMPTS - 1, deadLettered: 1, processed: 2 }), { timeoutMs: 15_000 });
  });
});
