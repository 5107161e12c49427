// What a keyed publish sends on PostgreSQL: one statement, the INSERT that takes the per-key
// advisory lock itself (INSERT … SELECT … WHERE <lock>), as on @courier/pg — not a lock
// statement and an INSERT, one round trip more in every producing transaction (issue 31:
// the Kysely producer line was 0.86 × Kysely's own insert with two). The lock still orders
// the key's rows and a duplicate messageId is still refused (the conformance suite checks both
// at large; here, on the statement this test watched).
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { createBus, defineMessage, InMemoryBroker, StorageError } from '@courier/core';
import { sql } from 'kysely';
import { afterEach, describe, expect, it } from 'vitest';
import { createKyselyFixture, type KyselyFixture, type KyselyFixtureDialect } from './support/fixture.js';

const fixtures: KyselyFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

/** A fixture on `dialect` (its statementLog sees what Kysely sends), a bus on its outbox, and its outbox rows. */
async function open(dialect: KyselyFixtureDialect) {
  const fixture = await createKyselyFixture(dialect, { testId: uniqueId() });
  fixtures.push(fixture);
  const log = fixture.statementLog;
  if (log === undefined) throw new Error(`the ${dialect} fixture declares no statementLog`);
  const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
  const Work = defineMessage('kysely.Work', { version: 1, topic: 'kysely.work' });
  /** The statements `work` sent, transaction control left out. */
  const watch = async (work: () => Promise<void>) => (await log.watch(work)).filter((text) => !/^(begin|commit|start transaction)$/i.test(text.trim()));
  const rows = async () =>
    (await sql<{ message_id: string | Buffer; msg_key: string | Buffer | null }>`SELECT message_id, msg_key FROM ${sql.table(`${fixture.tablePrefix}outbox`)} ORDER BY seq`.execute(fixture.db)).rows.map(
      (row) => [String(row.message_id), row.msg_key === null ? null : String(row.msg_key)],
    );
  return { fixture, db: fixture.db, outbox: fixture.outbox, bus, Work, watch, rows };
}

describe('the append on PostgreSQL (Kysely)', () => {
  it('a keyed publish is one statement: the outbox INSERT carrying the key lock', async () => {
    const { db, bus, Work, watch, rows } = await open('postgresql');
    const outboxStatements = await watch(() =>
      db.transaction().execute(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
      }),
    );
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    expect((await rows()).map(([, key]) => key)).toEqual(['k']);
  });

  it('an append of several keyed messages, delayed and scheduled, is one statement too, in order; a duplicate messageId is refused', async () => {
    const { db, outbox, bus, Work, watch, rows } = await open('postgresql');
    const envelopes = [makeEnvelope({ key: 'b' }), makeEnvelope({ key: 'a' }), makeEnvelope({ key: 'b' })];
    const outboxStatements = await watch(() =>
      db.transaction().execute(async (trx) => {
        await outbox.append(trx, [{ envelope: envelopes[0]! }, { envelope: envelopes[1]!, delayMs: 50 }, { envelope: envelopes[2]!, notBefore: new Date(Date.now() + 50) }]);
      }),
    );
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    const ids = envelopes.map((envelope) => envelope.messageId);
    expect(await rows()).toEqual([
      [ids[0], 'b'],
      [ids[1], 'a'],
      [ids[2], 'b'],
    ]);

    const duplicate = await db
      .transaction()
      .execute(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 4 }, { key: 'b', messageId: ids[0] });
      })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    expect(duplicate).toBeInstanceOf(StorageError);
    expect((duplicate as StorageError).code).toBe('DUPLICATE_MESSAGE_ID');
    expect(await rows()).toHaveLength(3);
  });
});

// On MariaDB the key lock is a FOR UPDATE subquery on the lock table inside the INSERT
// (the engine's MySQL keyLockCondition): a keyed publish is one statement there too (it
// was a SELECT … FOR UPDATE and the INSERT).
describe('the append on MariaDB (Kysely)', () => {
  it('a keyed publish is one statement: the outbox INSERT carrying the key lock', async () => {
    const { db, bus, Work, watch, rows } = await open('mariadb');
    const outboxStatements = await watch(() =>
      db.transaction().execute(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
      }),
    );
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* FROM DUAL WHERE \(SELECT COUNT\(\*\) FROM \(SELECT bucket FROM .* FOR UPDATE\) AS courier_locks\) >= 0$/s);
    expect((await rows()).map(([, key]) => key)).toEqual(['k']);
  });
});
