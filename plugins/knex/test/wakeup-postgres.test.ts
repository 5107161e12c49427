// What a publish through Knex sends on PostgreSQL, the same as through @courier/pg: in the
// user's transaction only the outbox INSERT (between knex's BEGIN and COMMIT), and the relays'
// wake-up NOTIFY after the COMMIT, outside that transaction, on a connection of knex's pool
// (coalesced to at most one per `notifyIntervalMs` per process). A NOTIFY inside the producer's
// transaction would take PostgreSQL's commit-time notify lock (17–42 % less commit throughput
// with 8 writers, shared/ENVIRONMENT.md), so none is sent there, nor folded into the INSERT.
import { eventually, uniqueId } from '@courier/conformance';
import { createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createKnexFixture, type KnexFixture } from './support/fixture.js';

const fixtures: KnexFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

/** A statement as knex's 'query' event reports it: its text, and the transaction it ran in (none outside one). */
interface Sent {
  readonly sql: string;
  readonly txId: string | undefined;
}

const NOTIFY = /\bpg_notify\(|^\s*notify\b/i;

describe('the wake-up of a publish through Knex on PostgreSQL', () => {
  it("the transaction carries only the INSERT; the NOTIFY follows its COMMIT, outside it", async () => {
    const fixture = await createKnexFixture('postgresql', { testId: uniqueId() });
    fixtures.push(fixture);
    const sent: Sent[] = [];
    fixture.knex.on('query', (query: { sql: string; __knexTxId?: string }) => sent.push({ sql: query.sql, txId: query.__knexTxId }));
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const Work = defineMessage('knex.Woken', { version: 1, topic: 'knex.woken' });

    await fixture.knex.transaction(async (trx) => {
      await bus.outbox(trx).publish(Work, { n: 1 }, { key: 'k' });
    });
    const notified = await eventually(() => {
      const index = sent.findIndex((statement) => NOTIFY.test(statement.sql));
      expect(index, 'a NOTIFY was sent after the publish').toBeGreaterThanOrEqual(0);
      return index;
    });

    const inserted = sent.findIndex((statement) => /^\s*INSERT INTO /i.test(statement.sql));
    const txId = sent[inserted]?.txId;
    expect(txId, 'the INSERT ran in the transaction').toEqual(expect.any(String));
    const inTransaction = sent.filter((statement) => statement.txId === txId).map((statement) => statement.sql.trim());
    expect(inTransaction).toEqual([expect.stringMatching(/^BEGIN;?$/i), expect.stringMatching(/^INSERT INTO /), expect.stringMatching(/^COMMIT;?$/i)]);
    expect(sent[notified]!.txId, 'the NOTIFY ran in no transaction of the application').toBeUndefined();
    const committed = sent.findIndex((statement) => statement.txId === txId && /^COMMIT/i.test(statement.sql.trim()));
    expect(notified, 'the NOTIFY came after the COMMIT').toBeGreaterThan(committed);
  });
});
