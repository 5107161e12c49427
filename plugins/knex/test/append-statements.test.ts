// What a keyed publish sends on PostgreSQL: one statement, the INSERT that takes the per-key
// advisory lock itself (INSERT … SELECT … WHERE <lock>), as on @courier/pg — not a lock
// statement and an INSERT, one round trip more in every producing transaction (issue 31:
// the Knex producer line was 0.82 × Knex's own insert with two). The lock still orders
// the key's rows and a duplicate messageId is still refused (the conformance suite checks both
// at large; here, on the statement this test watched).
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { ConfigError, createBus, defineMessage, InMemoryBroker, StorageError } from '@courier/core';
import knexFactory from 'knex';
import { afterEach, describe, expect, it } from 'vitest';
import { KnexOutboxStore } from '../src/index.js';
import { PG_URL } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('the append on PostgreSQL (Knex)', () => {
  async function open(options: { preparedStatements?: boolean } = {}) {
    const seen: string[] = [];
    let watching = false;
    const db = knexFactory({ client: 'pg', connection: PG_URL, pool: { min: 0, max: 2 } });
    db.on('query', (query: { sql: string }) => {
      if (watching) seen.push(query.sql);
    });
    cleanups.push(() => db.destroy());
    const tablePrefix = `${uniqueId()}_`;
    const outbox = new KnexOutboxStore({ knex: db, tablePrefix, ...options });
    await outbox.ensureSchema();
    cleanups.push(() => outbox.close());
    const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
    const Work = defineMessage('knex.Work', { version: 1, topic: 'knex.work' });
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
    const rows = async () => (await db(`${tablePrefix}outbox`).select('message_id', 'msg_key').orderBy('seq')) as { message_id: string; msg_key: string | null }[];
    return { db, outbox, bus, Work, watch, rows };
  }

  it('a keyed publish is one statement: the outbox INSERT carrying the key lock', async () => {
    const { db, bus, Work, watch, rows } = await open();
    const statements = await watch(() =>
      db.transaction(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
      }),
    );
    const outboxStatements = statements.filter((text) => !/^(begin|commit);?$/i.test(text.trim()));
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    expect((await rows()).map((row) => row.msg_key)).toEqual(['k']);
  });

  it('an append of several keyed messages, delayed and scheduled, is one statement too, in order; a duplicate messageId is refused', async () => {
    const { db, outbox, bus, Work, watch, rows } = await open();
    const envelopes = [makeEnvelope({ key: 'b' }), makeEnvelope({ key: 'a' }), makeEnvelope({ key: 'b' })];
    const statements = await watch(() =>
      db.transaction(async (trx) => {
        await outbox.append(trx, [{ envelope: envelopes[0]! }, { envelope: envelopes[1]!, delayMs: 50 }, { envelope: envelopes[2]!, notBefore: new Date(Date.now() + 50) }]);
      }),
    );
    const outboxStatements = statements.filter((text) => !/^(begin|commit);?$/i.test(text.trim()));
    expect(outboxStatements).toHaveLength(1);
    expect(outboxStatements[0]).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
    const ids = envelopes.map((envelope) => envelope.messageId);
    expect((await rows()).map((row) => [row.message_id, row.msg_key])).toEqual([
      [ids[0], 'b'],
      [ids[1], 'a'],
      [ids[2], 'b'],
    ]);

    const duplicate = await db
      .transaction(async (trx) => {
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

  // Parsed and planned once per connection, as @courier/pg does: the append's INSERT …
  // SELECT … WHERE <lock> was planned afresh on every call, where the application's own
  // INSERT … VALUES costs less to plan (backend CPU per producing transaction, bench/README.md).
  it('runs the append as a named prepared statement on the transaction\'s connection, unless preparedStatements is false', async () => {
    const prepared = async (options: { preparedStatements?: boolean }) => {
      const { db, bus, Work } = await open(options);
      return db.transaction(async (trx) => {
        await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
        await bus.outbox(trx).publish(Work, { n: 2 }, { key: 'k' });
        const { rows } = (await trx.raw(`SELECT statement FROM pg_prepared_statements WHERE name LIKE 'courier\\_%'`)) as { rows: { statement: string }[] };
        return rows.map((row) => row.statement);
      });
    };
    const named = await prepared({});
    expect(named.filter((statement) => /^INSERT INTO .*pg_advisory_xact_lock/s.test(statement))).toHaveLength(1);
    expect(await prepared({ preparedStatements: false })).toEqual([]);
    expect(() => new KnexOutboxStore({ knex: knexFactory({ client: 'pg' }), preparedStatements: 'yes' as unknown as boolean })).toThrow(ConfigError);
  });
});
