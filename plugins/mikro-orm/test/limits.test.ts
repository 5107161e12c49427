// The stores declare their column sizes, so the bus refuses what they cannot hold where it
// is given: a consumer name at subscribe (not a delivery redelivered without end), a
// schedule at publish (not a StorageError carrying the SQL).
import { ConfigError, InMemoryBroker, createBus, defineMessage, type Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { testId } from './support/helpers.js';

const Note = defineMessage('limits.NoteTaken', { version: 1 });

const open: { fixture: MikroOrmFixture; broker: InMemoryBroker; bus: Bus<EntityManager> }[] = [];
afterEach(async () => {
  for (const { fixture, broker, bus } of open.splice(0)) {
    await bus.stop({ timeoutMs: 2_000 });
    await broker.close();
    await fixture.close();
  }
});

async function setup(dialect: 'mariadb' | 'postgresql' | 'sqlite') {
  const fixture = await createMikroOrmFixture(dialect, { testId: testId() });
  const broker = new InMemoryBroker();
  const bus = createBus<EntityManager>({ outbox: fixture.outbox, inbox: fixture.inbox, transport: broker.connect() });
  open.push({ fixture, broker, bus });
  return { fixture, bus };
}

/** What `act` threw, failing the test when it did not throw. */
function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

describe.each(['postgresql', 'mariadb', 'sqlite'] as const)('MikroORM store limits (%s)', (dialect) => {
  it('a 198-character consumer name fails at subscribe, once, with the reason; 194 characters fit with the suffixes', async () => {
    const { bus } = await setup(dialect);
    const error = thrown(() => bus.subscribe('c'.repeat(198), Note, async () => undefined));
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([
      `consumer name '${'c'.repeat(198)}' is 198 characters; the inbox store (its limit less the 6 characters of Courier's suffix '~alone') holds at most 194`,
    ]);
    bus.subscribe('c'.repeat(194), Note, async () => undefined);
  });

  it.each([
    ['delay: 1e17', { delay: 1e17 }, "'delay'"],
    ['a notBefore in year 10000', { notBefore: new Date('+010000-01-01T00:00:00.000Z') }, "'notBefore'"],
    ['a notBefore in year 1', { notBefore: new Date('0001-01-01T00:00:00.000Z') }, "'notBefore'"],
  ])('refuses %s at publish with a ConfigError naming the option; nothing reaches the database', async (_name, options, option) => {
    const { fixture, bus } = await setup(dialect);
    await fixture.transaction(async (em) => {
      const error = thrown(() => bus.outbox(em).publish(Note, {}, options));
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems).toHaveLength(1);
      expect((error as ConfigError).problems[0]).toContain(`publish 'limits.NoteTaken': ${option} is `);
    });
    expect((await fixture.outbox.stats()).pending).toBe(0);
  });

  it('holds the latest schedule the range allows', async () => {
    const { fixture, bus } = await setup(dialect);
    await fixture.transaction(async (em) => {
      bus.outbox(em).publish(Note, {}, { notBefore: new Date('9999-12-31T23:59:59.999Z') });
      bus.outbox(em).publish(Note, {}, { delay: 100 * 365.25 * 24 * 3_600_000 });
    });
    const stats = await fixture.outbox.stats();
    expect(stats.pending).toBe(2);
    expect(stats.oldestPendingAgeMs).toBe(0);
  });
});
