// What joining the application's Drizzle transaction means beyond the conformance suite: the
// database itself is refused with the fix named, on every driver this package takes, and a
// Drizzle SQLite database is refused at construction (not supported yet, see the README).
import { randomUUID } from 'node:crypto';
import { ConfigError, InMemoryBroker, createBus, defineMessage } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { DrizzleOutboxStore } from '../src/index.js';
import { createDrizzleFixture, openDrizzle, type DrizzleFixture } from './support/fixture.js';

const Ping = defineMessage('drizzle.joining.Ping', { version: 1 });

let fixture: DrizzleFixture | undefined;
afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

describe.each(['postgresql', 'mariadb'] as const)('joining on %s', (dialect) => {
  it('refuses the Drizzle database in place of a transaction, naming db.transaction, and writes nothing', async () => {
    fixture = await createDrizzleFixture(dialect, { testId: `t${randomUUID().replaceAll('-', '').slice(0, 12)}` });
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const refused = await bus
      .outbox(fixture.db)
      .publish(Ping, {})
      .catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((refused as Error).message).toContain('db.transaction(async (tx)');
    expect((await fixture.outbox.stats()).pending).toBe(0);
  });
});

it('refuses a Drizzle SQLite database at construction, naming the packages that take SQLite', async () => {
  const { db, close } = await openDrizzle('sqlite', `t${randomUUID().replaceAll('-', '').slice(0, 12)}`);
  try {
    expect(() => new DrizzleOutboxStore({ db })).toThrow(/SQLite.*@courier\/kysely or @courier\/knex/);
  } finally {
    await close();
  }
});
