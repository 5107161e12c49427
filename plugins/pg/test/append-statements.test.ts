// What a publish sends on the application's PoolClient (issue 31): one statement, keyed or
// not — the outbox INSERT, which takes the key's advisory lock itself (INSERT … SELECT …
// WHERE <lock>) and runs as a named prepared statement; the transaction check reads the
// status PostgreSQL reported after the client's last statement, with no round trip of its own
// (but the first publish on a client the store has not seen yet: one `SELECT 1` to learn it).
import { createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createPgFixture, type PgFixture } from './support/pg-fixture.js';

const fixtures: PgFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

describe('the append on @courier/pg', () => {
  it('a keyed and a keyless publish are one statement each: the prepared outbox INSERT (after the first sight of the client)', async () => {
    const fixture = await createPgFixture({ testId: `t${process.pid.toString(16)}a${Date.now().toString(16)}` });
    fixtures.push(fixture);
    const bus = createBus({ outbox: fixture.outbox, transport: new InMemoryBroker().connect() });
    const Work = defineMessage('pg.Statements', { version: 1, topic: 'pg.statements' });
    const client = await fixture.pool.connect();
    const sent: unknown[] = [];
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      sent.push(args[0]);
      return query(...args);
    };
    try {
      await client.query('BEGIN');
      sent.length = 0;
      await bus.outbox(client).publish(Work, { n: 0 }, { key: 'first' });
      expect(sent[0]).toBe('SELECT 1');
      expect(sent).toHaveLength(2);
      sent.length = 0;
      await bus.outbox(client).publish(Work, { n: 1 }, { key: 'k' });
      const keyed = [...sent];
      sent.length = 0;
      await bus.outbox(client).publish(Work, { n: 2 });
      const keyless = [...sent];
      await client.query('COMMIT');

      const text = (statement: unknown) => (typeof statement === 'string' ? statement : (statement as { text: string }).text);
      const name = (statement: unknown) => (typeof statement === 'string' ? undefined : (statement as { name?: string }).name);
      expect(keyed).toHaveLength(1);
      expect(text(keyed[0])).toMatch(/^INSERT INTO .* WHERE \(SELECT count\(pg_advisory_xact_lock\(/s);
      expect(name(keyed[0])).toEqual(expect.any(String));
      expect(keyless).toHaveLength(1);
      expect(text(keyless[0])).toMatch(/^INSERT INTO /);
      expect(name(keyless[0])).toEqual(expect.any(String));
    } finally {
      client.release();
    }
    const rows = await fixture.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${fixture.tablePrefix}outbox"`);
    expect(rows.rows[0]!.n).toBe(3);
  });
});
