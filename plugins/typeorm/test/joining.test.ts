// What joining the application's TypeORM transaction means beyond the conformance suite: a
// manager with no transaction open (dataSource.manager) is refused with the fix named and
// nothing written; a QueryRunner's manager between startTransaction and commitTransaction joins.
import { randomUUID } from 'node:crypto';
import { ConfigError, InMemoryBroker, createBus, defineMessage } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createTypeOrmFixture, type TypeOrmFixture } from './support/fixture.js';

const Ping = defineMessage('typeorm.joining.Ping', { version: 1 });

let fixture: TypeOrmFixture | undefined;
afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

describe.each(['postgresql', 'mariadb'] as const)('joining on %s', (dialect) => {
  it('refuses dataSource.manager (no transaction) naming dataSource.transaction; a QueryRunner in a transaction joins it', async () => {
    fixture = await createTypeOrmFixture(dialect, { testId: `t${randomUUID().replaceAll('-', '').slice(0, 12)}` });
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const refused = await bus
      .outbox(fixture.dataSource.manager)
      .publish(Ping, {})
      .catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(ConfigError);
    expect((refused as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((refused as Error).message).toContain('dataSource.transaction(async (manager)');
    expect((await fixture.outbox.stats()).pending).toBe(0);

    const runner = fixture.dataSource.createQueryRunner();
    await runner.startTransaction();
    await bus.outbox(runner.manager).publish(Ping, {});
    await runner.rollbackTransaction();
    expect((await fixture.outbox.stats()).pending).toBe(0);
    await runner.startTransaction();
    await bus.outbox(runner.manager).publish(Ping, {});
    await runner.commitTransaction();
    await runner.release();
    expect((await fixture.outbox.stats()).pending).toBe(1);
  });
});
