// What joining means on Kysely, as the README states it, on each database: the row commits
// with the transaction or not at all; a rollback to a savepoint taken before the publish
// takes its messages with it while the transaction commits its own, the same key included;
// the Kysely instance and a transaction that has ended (a callback transaction kept past its
// callback, a controlled one after commit) are refused, writing nothing.
import { uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { sql } from 'kysely';
import { afterEach, describe, expect, it } from 'vitest';
import { createKyselyFixture, type KyselyFixture, type KyselyFixtureDialect, type Trx } from './support/fixture.js';

const fixtures: KyselyFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

class RolledBack extends Error {}

describe.each(['postgresql', 'mariadb', 'sqlite'] as KyselyFixtureDialect[])('joining a Kysely transaction on %s', (dialect) => {
  async function open() {
    const fixture = await createKyselyFixture(dialect, { testId: uniqueId() });
    fixtures.push(fixture);
    const Work = defineMessage('kysely.Work', { version: 1, topic: 'kysely.work' });
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const rows = async () => {
      const { rows: list } = await sql<{ message_id: unknown }>`SELECT message_id FROM ${sql.table(`${fixture.tablePrefix}outbox`)} ORDER BY seq`.execute(fixture.db);
      // MySQL/MariaDB keep ids in a binary column: the driver returns a Buffer.
      return list.map((row) => (Buffer.isBuffer(row.message_id) ? row.message_id.toString('utf8') : String(row.message_id)));
    };
    const refusal = (publish: () => Promise<unknown>) =>
      Promise.resolve()
        .then(publish)
        .then(
          () => undefined,
          (error: unknown) => error,
        );
    return { fixture, Work, bus, rows, refusal };
  }

  it('a rollback leaves nothing; a rollback to a savepoint takes only what followed it, the same key included', async () => {
    const { fixture, Work, bus, rows } = await open();
    await fixture.db
      .transaction()
      .execute(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 0 }, { key: 'k' });
        throw new RolledBack();
      })
      .catch((error: unknown) => {
        if (!(error instanceof RolledBack)) throw error;
      });
    expect(await rows()).toEqual([]);

    const trx = await fixture.db.startTransaction().execute();
    const before = await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
    const inSavepoint = await trx.savepoint('courier_sp').execute();
    await bus.outbox(inSavepoint).publish(Work, { n: 2 }, { key: 'k' });
    await bus.outbox(inSavepoint).publish(Work, { n: 3 }, { key: 'other' });
    const restored = await inSavepoint.rollbackToSavepoint('courier_sp').execute();
    const last = await bus.outbox(restored).publish(Work, { n: 4 }, { key: 'k' });
    await restored.commit().execute();
    expect(await rows()).toEqual([before, last]);
    const claimed = await fixture.outbox.claim({ owner: 'test', limit: 10, leaseMs: 30_000, perKey: 10 });
    expect(claimed.records.map((record) => record.envelope.messageId)).toEqual([before, last]);
  });

  it('refuses the Kysely instance and ended transactions with a ConfigError naming the fix, writing nothing', async () => {
    const { fixture, Work, bus, rows, refusal } = await open();
    const fromDb = await refusal(() => bus.outbox(fixture.db as unknown as Trx).publish(Work, { n: 1 }));
    expect(fromDb).toBeInstanceOf(ConfigError);
    expect(fromDb).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('db.transaction().execute(') });

    // A callback transaction kept past its callback: its connection went back to the pool.
    let kept: Trx | undefined;
    await fixture.db.transaction().execute(async (trx) => {
      kept = trx;
    });
    const late = await refusal(() => bus.outbox(kept!).publish(Work, { n: 2 }));
    expect(late, 'a publish on a transaction whose callback returned').toBeInstanceOf(ConfigError);
    expect(late).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });

    const controlled = await fixture.db.startTransaction().execute();
    await controlled.commit().execute();
    const afterCommit = await refusal(() => bus.outbox(controlled).publish(Work, { n: 3 }));
    expect(afterCommit).toBeInstanceOf(ConfigError);
    expect(afterCommit).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    expect(await rows()).toEqual([]);
  });
});
