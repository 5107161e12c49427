// The pipelined claim's second step (perKey > 1): after the one-statement head claim has
// committed, rows behind each head are leased under the same lease. Two properties the
// conformance suite cannot pin down, because they concern the gap between the two steps and
// rows other transactions hold: followers are taken only behind a head still held by the
// lease, and a key's run never skips a row (contiguity), on every dialect.
import type { ClaimedBatch, Envelope } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { claimFollowers } from '@courier/sql-engine';
import { StoreCore } from '../src/store-core.js';
import { createMikroOrmFixture, type FixtureDialect, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function fixtureWithKey(dialect: FixtureDialect, rows: number): Promise<{ f: MikroOrmFixture; core: StoreCore; topic: string; key: Envelope[] }> {
  const f = await createMikroOrmFixture(dialect, { testId: testId() });
  open.push(f);
  const topic = `${f.tablePrefix}followers`;
  const key = Array.from({ length: rows }, () => envelope(topic, 'k'));
  await f.transaction(async (tx) => f.outbox.append(tx, key.map((item) => ({ envelope: item }))));
  return { f, core: new StoreCore({ orm: f.orm, tablePrefix: f.tablePrefix }, 'test'), topic, key };
}

const ids = (batch: ClaimedBatch): string[] => batch.records.map((record) => record.envelope.messageId);
const seqOf = async (f: MikroOrmFixture, item: Envelope): Promise<string> =>
  String((await f.sql(`SELECT seq FROM ${f.table('outbox')} WHERE message_id = ?`, [item.messageId]))[0]?.['seq']);

describe.each(['postgresql', 'mariadb', 'sqlite'] as const)('pipelined claim, follower step (%s)', (dialect) => {
  it('takes followers only behind a head still held by the lease it extends', async () => {
    const { f, core, key } = await fixtureWithKey(dialect, 3);
    const query = { owner: 'relay-a', limit: 10, leaseMs: 60_000 };
    const first = await f.outbox.claim({ ...query, perKey: 1 });
    expect(ids(first)).toEqual([key[0]!.messageId]);
    const head = first.records[0]!.sequence.toString();
    const step = (token: bigint) => claimFollowers(core.dialect, core.runner, query, { heads: [head], token, room: 9, perKey: 4 });
    // A token that never held the head: nothing.
    expect(await step(first.lease.token + 1_000n)).toEqual([]);
    // The head given back (release clears its lease): its old lease gets nothing either.
    expect(await f.outbox.release(first.lease, [first.records[0]!.sequence])).toBe(1);
    expect(await step(first.lease.token)).toEqual([]);
    // Re-claimed by another relay: the first lease is stale, the new one holds the head.
    const second = await f.outbox.claim({ ...query, owner: 'relay-b', perKey: 1 });
    expect(ids(second)).toEqual([key[0]!.messageId]);
    expect(await step(first.lease.token)).toEqual([]);
    // Nothing above was leased: the followers are still free for the holder of the head.
    const followers = await step(second.lease.token);
    expect(followers.map((row) => String(row['message_id']))).toEqual([key[1]!.messageId, key[2]!.messageId]);
    // Under the head's lease: its holder completes them, no other claim sees them.
    expect(await f.outbox.complete(second.lease, followers.map((row) => BigInt(String(row['seq']))))).toBe(2);
    // The head completed: it holds nothing any more, so a late second step takes nothing.
    expect(await f.outbox.complete(second.lease, [second.records[0]!.sequence])).toBe(1);
    expect(await step(second.lease.token)).toEqual([]);
  });

  it('a run stops at the first row it cannot take (halted, scheduled), and passes over dead rows', async () => {
    const { f, key } = await fixtureWithKey(dialect, 6);
    const outbox = f.table('outbox');
    // key: 0 head, 1 pending, 2 dead (not part of the order), 3 pending, 4 halted, 5 pending.
    await f.sql(`UPDATE ${outbox} SET state = 'dead' WHERE seq = ?`, [await seqOf(f, key[2]!)]);
    await f.sql(`UPDATE ${outbox} SET state = 'halted' WHERE seq = ?`, [await seqOf(f, key[4]!)]);
    const batch = await f.outbox.claim({ owner: 'relay-a', limit: 10, leaseMs: 60_000, perKey: 10 });
    expect(ids(batch)).toEqual([key[0]!, key[1]!, key[3]!].map((item) => item.messageId));
    // A scheduled row (due later) ends the run too; the rows behind it are not taken.
    await f.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
    await f.sql(`UPDATE ${outbox} SET state = 'pending' WHERE seq = ?`, [await seqOf(f, key[4]!)]);
    const more = Array.from({ length: 2 }, () => envelope(key[0]!.topic, 'k'));
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: more[0]! }, { envelope: more[1]! }]));
    await f.sql(`UPDATE ${outbox} SET available_at = ${f.dialect === 'sqlite' ? 'available_at + 3600000' : f.dialect === 'postgresql' ? "available_at + interval '1 hour'" : 'available_at + INTERVAL 1 HOUR'} WHERE seq = ?`, [
      await seqOf(f, key[5]!),
    ]);
    expect(ids(await f.outbox.claim({ owner: 'relay-a', limit: 10, leaseMs: 60_000, perKey: 10 }))).toEqual([key[4]!.messageId]);
  });

  it.skipIf(dialect === 'sqlite')('a run stops at a row another transaction holds locked, never taking the rows behind it (not SQLite: one writer, no row locks)', async () => {
    const { f, key } = await fixtureWithKey(dialect, 5);
    const held = await seqOf(f, key[2]!);
    let batch: ClaimedBatch | undefined;
    // Another transaction (another connection) holds row 2 while the claim runs.
    await f.orm.em.fork().transactional(async (em) => {
      await em.getConnection('write').execute(`SELECT seq FROM ${f.table('outbox')} WHERE seq = ? FOR UPDATE`, [held], 'all', em.getTransactionContext());
      batch = await f.outbox.claim({ owner: 'relay-a', limit: 10, leaseMs: 60_000, perKey: 10 });
    });
    expect(ids(batch!)).toEqual([key[0]!.messageId, key[1]!.messageId]);
    // Once the lock is gone, the rest of the run comes with the next batch of the key.
    await f.outbox.complete(batch!.lease, batch!.records.map((record) => record.sequence));
    expect(ids(await f.outbox.claim({ owner: 'relay-a', limit: 10, leaseMs: 60_000, perKey: 10 }))).toEqual([key[2]!, key[3]!, key[4]!].map((item) => item.messageId));
  });

  // MariaDB/MySQL claim heads and followers in one transaction (see #claimRunsInnoDb), which fills the room key by key.
  it.skipIf(dialect === 'mariadb')('shares the room left by the heads: every key its first follower before any key its second, each run contiguous (not MariaDB: its one-transaction pipelined claim fills the room key by key)', async () => {
    const f = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(f);
    const topic = `${f.tablePrefix}room`;
    const a = Array.from({ length: 4 }, () => envelope(topic, 'a'));
    const b = Array.from({ length: 4 }, () => envelope(topic, 'b'));
    await f.transaction(async (tx) => f.outbox.append(tx, [...a, ...b].map((item) => ({ envelope: item }))));
    const batch = await f.outbox.claim({ owner: 'relay-a', limit: 5, leaseMs: 60_000, perKey: 4 });
    const taken = new Set(ids(batch));
    expect(taken.size).toBe(5);
    // Heads and first followers of both keys, then one second follower.
    for (const item of [a[0]!, a[1]!, b[0]!, b[1]!]) expect(taken.has(item.messageId)).toBe(true);
    expect(taken.has(a[2]!.messageId) !== taken.has(b[2]!.messageId)).toBe(true);
    expect(taken.has(a[3]!.messageId) || taken.has(b[3]!.messageId)).toBe(false);
    // Sorted by sequence, one lease.
    const sequences = batch.records.map((record) => record.sequence);
    expect([...sequences].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0))).toEqual(sequences);
    expect(await f.outbox.complete(batch.lease, sequences)).toBe(5);
  });
});
