// `publishedRows: 'delete'` beyond the contract (the conformance suite runs in this mode from
// conformance-published-rows-delete.test.ts): the rows really leave the table on every
// completion path of every dialect, a store in 'keep' and one in 'delete' share tables, and a
// bad value is refused.
import { eventually } from '@courier/conformance';
import { ConfigError } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { MikroOrmOutboxStore } from '../src/index.js';
import { createMikroOrmFixture, type FixtureDialect, type MikroOrmFixture } from './support/fixture.js';
import { claimAll, envelope, idsOf, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
const stores: MikroOrmOutboxStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((store) => store.close()));
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function deleting(dialect: FixtureDialect): Promise<MikroOrmFixture> {
  const f = await createMikroOrmFixture(dialect, { testId: testId() }, { outbox: { publishedRows: 'delete' } });
  open.push(f);
  return f;
}

async function rowCount(f: MikroOrmFixture): Promise<number> {
  const [row] = await f.sql(`SELECT count(*) AS n FROM ${f.table('outbox')}`);
  return Number(row?.['n']);
}

describe('publishedRows config', () => {
  it("defaults to 'keep' and refuses anything but 'keep' or 'delete'", async () => {
    const f = await createMikroOrmFixture('sqlite', { testId: testId() });
    open.push(f);
    expect(f.outbox.publishedRows).toBe('keep');
    expect(() => new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix, publishedRows: 'drop' as 'delete' })).toThrow(ConfigError);
    expect(() => new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix, publishedRows: 'drop' as 'delete' })).toThrow(/'publishedRows' must be 'keep' or 'delete', got "drop"/);
  });
});

describe.each(['postgresql', 'mariadb', 'sqlite'] as const)("publishedRows 'delete' on %s", (dialect) => {
  it('complete and completeAndClaim (with and without the fault hook, pipelined too) leave no row behind', async () => {
    const f = await deleting(dialect);
    const topic = `${f.tablePrefix}rows`;
    const rows = Array.from({ length: 4 }, () => envelope(topic, 'k'));
    const keyless = [envelope(topic), envelope(topic)];
    await f.transaction(async (tx) => f.outbox.append(tx, [...rows, ...keyless].map((item) => ({ envelope: item }))));
    expect(await rowCount(f)).toBe(6);
    const first = await claimAll(f);
    expect(idsOf(first)).toEqual([rows[0]!.messageId, ...keyless.map((item) => item.messageId)].sort());
    // complete with the hook: told the ids of the rows it deletes, before they are gone.
    const told: (readonly string[])[] = [];
    const keylessSeqs = first.records.filter((record) => record.envelope.key === null).map((record) => record.sequence);
    expect(await f.outbox.complete(first.lease, keylessSeqs, { beforeCommit: (_point, context) => void told.push(context.messageIds) })).toBe(2);
    expect(told).toEqual([keyless.map((item) => item.messageId)]);
    expect(await rowCount(f)).toBe(4);
    // completeAndClaim with the hook: the head's completion lets the key's next row in.
    const head = first.records.filter((record) => record.envelope.key !== null);
    const options = { owner: 'relay', limit: 100, leaseMs: 60_000, perKey: 1 };
    const second = await f.outbox.completeAndClaim(
      { lease: first.lease, sequences: head.map((record) => record.sequence) },
      { ...options, beforeCommit: (_point, context) => void told.push(context.messageIds) },
    );
    expect(told[1]).toEqual([rows[0]!.messageId]);
    expect(second.completed).toBe(1);
    const next = second.records.length > 0 ? second : await claimAll(f);
    expect(idsOf(next)).toEqual([rows[1]!.messageId]);
    expect(await rowCount(f)).toBe(3);
    // Pipelined (perKey 2): completion, heads and the rows behind them.
    const third = await f.outbox.completeAndClaim({ lease: next.lease, sequences: next.records.map((record) => record.sequence) }, { ...options, perKey: 2 });
    expect(third.completed).toBe(1);
    const last = third.records.length > 0 ? third : await f.outbox.claim({ ...options, perKey: 2 });
    expect(idsOf(last)).toEqual([rows[2]!.messageId, rows[3]!.messageId].sort());
    const end = await f.outbox.completeAndClaim({ lease: last.lease, sequences: last.records.map((record) => record.sequence) }, options);
    expect(end.completed).toBe(2);
    expect(end.records).toEqual([]);
    expect(await rowCount(f)).toBe(0);
    expect(await f.outbox.stats()).toEqual({ pending: 0, oldestPendingAgeMs: 0, inFlight: 0, dead: 0, haltedKeys: 0 });
  });

  it("works beside a 'keep' store on the same tables: either's completion lets the key move on, and prune deletes what 'keep' kept", async () => {
    const f = await deleting(dialect);
    const keeping = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix, publishedRows: 'keep' });
    stores.push(keeping);
    const topic = `${f.tablePrefix}mixed`;
    const rows = Array.from({ length: 3 }, () => envelope(topic, 'k'));
    await f.transaction(async (tx) => f.outbox.append(tx, rows.map((item) => ({ envelope: item }))));
    const byKeep = await keeping.claim({ owner: 'keep', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(await keeping.complete(byKeep.lease, byKeep.records.map((record) => record.sequence))).toBe(1);
    const byDelete = await claimAll(f);
    expect(idsOf(byDelete)).toEqual([rows[1]!.messageId]);
    expect(await f.outbox.complete(byDelete.lease, byDelete.records.map((record) => record.sequence))).toBe(1);
    const lastOne = await keeping.claim({ owner: 'keep', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(idsOf(lastOne)).toEqual([rows[2]!.messageId]);
    expect(await keeping.complete(lastOne.lease, lastOne.records.map((record) => record.sequence))).toBe(1);
    // Two rows were kept as published, one was deleted; the deleting store's prune takes the two.
    expect(await rowCount(f)).toBe(2);
    let pruned = 0;
    // Published "at least 0 ms ago" on the database clock: at its resolution, maybe not yet.
    await eventually(async () => {
      pruned += await f.outbox.prune(0);
      expect(pruned).toBe(2);
    });
    expect(await rowCount(f)).toBe(0);
  });
});
