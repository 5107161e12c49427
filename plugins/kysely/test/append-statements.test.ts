// What a keyed publish sends on PostgreSQL: one statement, the INSERT that takes the per-key
// advisory lock itself (INSERT … SELECT … WHERE <lock>), as on @courier/pg — not a lock
// statement and an INSERT, one round trip more in every producing transaction (issue 31:
// the Kysely producer line was 0.86 × Kysely's own insert with two). The lock still orders
// the key's rows and a duplicate messageId is still refused (the conformance suite checks both
// at large; here, on the statement this test watched).
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { createBus, defineMessage, InMemoryBroker, StorageError } from '@courier/core';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { KyselyOutboxStore } from '../src/index.js';
import { PG_URL, type AnyDb } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('the append on PostgreSQL (Kysely)', () => {
  async function open() {
    const seen: string[] = [];
    let watching = false;
    const db = new Kysely<AnyDb>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: PG_URL, max: 2 }) }),
      log: (event) => {
        if (watching) seen.push(event.query.sql);
      },
    });
    cleanups.push(() => db.destroy());
    const tablePrefix = `${uniqueId()}_`;
    const outbox = new KyselyOutboxStore({ db, tablePrefix });
    await outbox.ensureSchema();
    cleanups.push(() => outbox.close());
    const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
    const Work = defineMessage('kysely.Work', { version: 1, topic: 'kysely.work' });
    const watch = async (work: () => Promise<void>) => {
      seen.length = 0;
      watching = true;
      try {
        await work();
      } finally {
        watching = false;
      }
      return [...seen];
    };
    const rows = async () =>
      (await sql<{ message_id: string; msg_key: string | null }>`SELECT message_id, msg_key FROM ${sql.table(`${tablePrefix}outbox`)} ORDER BY seq`.execute(db)).rows;
    return { db, outbox, bus, Work, watch, rows };
  }

  it('a keyed publish is one statement: the outbox INSERT carrying the key lock', async () => {
    const { db, bus, Work, watch, rows } = await open();
    const statements = await watch(() =>
      db.transaction().execute(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
      }),
    );
    const outboxStatements = statements.filter((text) => !/^(begin|commit)$/i.test(text.trim()));
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    expect((await rows()).map((row) => row.msg_key)).toEqual(['k']);
  });

  it('an append of several keyed messages, delayed and scheduled, is one statement too, in order; a duplicate messageId is refused', async () => {
    const { db, outbox, bus, Work, watch, rows } = await open();
    const envelopes = [makeEnvelope({ key: 'b' }), makeEnvelope({ key: 'a' }), makeEnvelope({ key: 'b' })];
    const statements = await watch(() =>
      db.transaction().execute(async (trx) => {
        await outbox.append(trx, [{ envelope: envelopes[0]! }, { envelope: envelopes[1]!, delayMs: 50 }, { envelope: envelopes[2]!, notBefore: new Date(Date.now() + 50) }]);
      }),
    );
    const outboxStatements = statements.filter((text) => !/^(begin|commit)$/i.test(text.trim()));
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    const ids = envelopes.map((envelope) => envelope.messageId);
    expect((await rows()).map((row) => [row.message_id, row.msg_key])).toEqual([
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
