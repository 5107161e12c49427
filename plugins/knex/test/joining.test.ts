// What joining means on Knex, as the README states it, on each database: the row commits
// with the transaction or not at all; a rolled-back nested transaction (a savepoint) takes
// its messages with it while the outer transaction commits its own, the same key included;
// the Knex instance and an ended transaction are refused, writing nothing.
import { uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createKnexFixture, type KnexFixture, type KnexFixtureDialect } from './support/fixture.js';

const fixtures: KnexFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

class RolledBack extends Error {}

describe.each(['postgresql', 'mariadb', 'sqlite'] as KnexFixtureDialect[])('joining a Knex transaction on %s', (dialect) => {
  async function open() {
    const fixture = await createKnexFixture(dialect, { testId: uniqueId() });
    fixtures.push(fixture);
    const Work = defineMessage('knex.Work', { version: 1, topic: 'knex.work' });
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const rows = async () => {
      const result = (await fixture.knex.raw(`SELECT message_id FROM ${fixture.table('outbox')} ORDER BY seq`)) as unknown;
      // knex.raw's result differs per client: pg { rows }, mysql2 [rows, fields], better-sqlite3 rows.
      const list = dialect === 'postgresql' ? (result as { rows: unknown[] }).rows : dialect === 'mariadb' ? (result as unknown[][])[0]! : (result as unknown[]);
      // MySQL/MariaDB keep ids in a binary column: the driver returns a Buffer.
      return (list as { message_id: unknown }[]).map((row) => (Buffer.isBuffer(row.message_id) ? row.message_id.toString('utf8') : String(row.message_id)));
    };
    return { fixture, Work, bus, rows };
  }

  it('a rolled-back nested transaction leaves nothing; the outer one commits its own messages, the same key included', async () => {
    const { fixture, Work, bus, rows } = await open();
    const outcome = await fixture.knex.transaction(async (trx) => {
      const before = await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
      const doomed: string[] = [];
      await trx
        .transaction(async (nested) => {
          doomed.push(await bus.outbox(nested).publish(Work, { n: 2 }, { key: 'k' }));
          doomed.push(await bus.outbox(nested).publish(Work, { n: 3 }, { key: 'other' }));
          throw new RolledBack();
        })
        .catch((error: unknown) => {
          if (!(error instanceof RolledBack)) throw error;
        });
      const after = await bus.outbox(trx).publish(Work, { n: 4 }, { key: 'k' });
      return { kept: [before, after], doomed };
    });
    expect(await rows()).toEqual(outcome.kept);
    // What the relay sees: the kept rows of key 'k', in order, and nothing of the savepoint.
    const claimed = await fixture.outbox.claim({ owner: 'test', limit: 10, leaseMs: 30_000, perKey: 10 });
    expect(claimed.records.map((record) => record.envelope.messageId)).toEqual(outcome.kept);
  });

  it('a nested transaction that commits is kept only when the outer one commits', async () => {
    const { fixture, Work, bus, rows } = await open();
    await fixture.knex
      .transaction(async (trx) => {
        await trx.transaction(async (nested) => {
          await bus.outbox(nested).publish(Work, { n: 1 }, { key: 'k' });
        });
        throw new RolledBack();
      })
      .catch((error: unknown) => {
        if (!(error instanceof RolledBack)) throw error;
      });
    expect(await rows()).toEqual([]);
  });

  it('refuses the Knex instance and an ended transaction with a ConfigError naming the fix, writing nothing', async () => {
    const { fixture, Work, bus, rows } = await open();
    const refusal = await Promise.resolve()
      .then(() => bus.outbox(fixture.knex as never).publish(Work, { n: 1 }))
      .catch((error: unknown) => error);
    expect(refusal).toBeInstanceOf(ConfigError);
    expect(refusal).toMatchObject({ code: 'UNIT_OF_WORK_REQUIRED', message: expect.stringContaining('knex.transaction(') });
    let ended: Parameters<Parameters<typeof fixture.knex.transaction>[0]>[0] | undefined;
    await fixture.knex.transaction(async (trx) => {
      ended = trx;
    });
    const late = await Promise.resolve()
      .then(() => bus.outbox(ended!).publish(Work, { n: 2 }))
      .catch((error: unknown) => error);
    expect(late).toBeInstanceOf(ConfigError);
    expect(late).toMatchObject({ code: 'UNIT_OF_WORK_ENDED' });
    expect(await rows()).toEqual([]);
  });
});
