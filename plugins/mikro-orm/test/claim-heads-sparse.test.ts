// PostgreSQL's head claim has two scans: the dense one (due rows in claim order, each probed
// for an earlier row of its key) and the sparse one (one descent of the key index per key),
// chosen from what the previous claim saw. Only the cost may differ: these cases drive the
// store into the sparse scan (a short claim over many due rows of few keys) and check that it
// takes exactly the heads the dense scan would, hands back to the dense scan when it cannot
// see every key, and stays on indexes.
import type { ClaimedBatch, Envelope, OutboxStore } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

/** A PostgreSQL fixture that records the claim statements it runs; its outbox keeps or deletes completed rows. */
async function fixture(publishedRows: 'keep' | 'delete' = 'keep'): Promise<{ f: MikroOrmFixture; topic: string; claims: string[]; inlined: () => string }> {
  const claims: string[] = [];
  let last: { sql: string; params: readonly unknown[] } | undefined;
  const f = await createMikroOrmFixture(
    'postgresql',
    { testId: testId() },
    {
      outbox: { publishedRows },
      orm: {
        onQuery: (sql: string, params: readonly unknown[]) => {
          if (sql.includes('SKIP LOCKED') && sql.includes('nextval(')) {
            claims.push(sql);
            last = { sql, params: [...params] };
          }
          return sql;
        },
      },
    },
  );
  open.push(f);
  // The last claim statement with its values inlined, as MikroORM sends it.
  const inlined = () => f.orm.em.getPlatform().formatQuery(last!.sql, [...last!.params]);
  return { f, topic: `${f.tablePrefix}heads`, claims, inlined };
}

const sparse = (sql: string) => sql.startsWith('WITH RECURSIVE');
const ids = (batch: ClaimedBatch): string[] => batch.records.map((record) => record.envelope.messageId);
const sorted = (items: readonly string[]): string[] => [...items].sort();
const append = (f: MikroOrmFixture, items: readonly Envelope[], delayMs?: number) =>
  f.transaction(async (tx) => (f.outbox as OutboxStore<EntityManager>).append(tx, items.map((item) => ({ envelope: item, ...(delayMs === undefined ? {} : { delayMs }) }))));

/** `rows` rows for each of `keys` keys, appended round-robin (key 0, key 1, …, key 0, …). */
function backlog(topic: string, keys: number, rows: number): Envelope[][] {
  return Array.from({ length: keys }, (_, key) => Array.from({ length: rows }, () => envelope(topic, `k${key}`)));
}
const roundRobin = (byKey: readonly Envelope[][]): Envelope[] => byKey[0]!.flatMap((_, row) => byKey.map((rows) => rows[row]!));

/**
 * After a drain, no row is left unpublished — and with `publishedRows: 'delete'` no row at all:
 * every completion, the ones in the sparse scan's own statement included, deleted its rows.
 */
async function expectDrained(f: MikroOrmFixture): Promise<void> {
  expect(await f.sql(`SELECT count(*)::int AS n FROM ${f.table('outbox')} WHERE state <> 'published'`)).toEqual([{ n: 0 }]);
  if (f.outbox.publishedRows === 'delete') expect(await f.sql(`SELECT count(*)::int AS n FROM ${f.table('outbox')}`)).toEqual([{ n: 0 }]);
}

// Both completion modes: a row the statement's own completion deletes must count as published
// in the sparse scan's key descent as it does when marked (and a deleted row is simply absent).
for (const publishedRows of ['keep', 'delete'] as const) describe(`PostgreSQL head claim, sparse scan, publishedRows ${publishedRows}`, () => {
  it('after a short claim over many due rows of few keys, takes the same heads through the key index, the completion counted', async () => {
    const { f, topic, claims } = await fixture(publishedRows);
    const byKey = backlog(topic, 3, 8);
    const keyless = [envelope(topic), envelope(topic)];
    await append(f, [...roundRobin(byKey), ...keyless]);
    const query = { owner: 'relay', limit: 10, leaseMs: 60_000, perKey: 1 };
    // Dense: 26 rows due, 5 heads (3 keys, 2 keyless): short, so the next claim scans sparsely.
    const first = await f.outbox.claim(query);
    expect(sorted(ids(first))).toEqual(sorted([...byKey.map((rows) => rows[0]!.messageId), ...keyless.map((item) => item.messageId)]));
    expect(claims.map(sparse)).toEqual([false]);
    // Sparse, with the completion in the same statement: each key's next row, nothing else.
    let batch = first;
    for (let row = 1; row < 8; row += 1) {
      const next = await f.outbox.completeAndClaim({ lease: batch.lease, sequences: batch.records.map((record) => record.sequence) }, query);
      expect(next.completed).toBe(batch.records.length);
      expect(sorted(ids(next))).toEqual(sorted(byKey.map((rows) => rows[row]!.messageId)));
      batch = next;
    }
    expect(claims.slice(1).every(sparse)).toBe(true);
    const last = await f.outbox.completeAndClaim({ lease: batch.lease, sequences: batch.records.map((record) => record.sequence) }, query);
    expect(last.records).toEqual([]);
    await expectDrained(f);
  });

  it('gives a key nothing while its first row is in flight, halted or not yet due, and takes the keyless rows', async () => {
    const { f, topic, claims } = await fixture(publishedRows);
    // Key a: 12 rows, to make the first claim short over many due rows.
    const a = Array.from({ length: 12 }, () => envelope(topic, 'a'));
    await append(f, a);
    const query = { owner: 'relay', limit: 5, leaseMs: 60_000, perKey: 1 };
    const inFlight = await f.outbox.claim(query);
    expect(ids(inFlight)).toEqual([a[0]!.messageId]);
    // Key b: its head halted. Key c: its head scheduled an hour ahead, then due rows. Key d: due.
    const b = [envelope(topic, 'b'), envelope(topic, 'b')];
    await append(f, b);
    const bHead = await f.outbox.claim(query);
    expect(ids(bHead)).toEqual([b[0]!.messageId]);
    expect(claims.map(sparse)).toEqual([false, true]);
    await f.outbox.fail(bHead.lease, [{ sequence: bHead.records[0]!.sequence, error: 'poison', outcome: 'halt' }]);
    const c = [envelope(topic, 'c')];
    await append(f, c, 3_600_000);
    const cLater = [envelope(topic, 'c')];
    const d = [envelope(topic, 'd'), envelope(topic, 'd')];
    const keyless = [envelope(topic), envelope(topic)];
    await append(f, [...cLater, ...d, ...keyless]);
    const batch = await f.outbox.claim(query);
    expect(sparse(claims.at(-1)!)).toBe(true);
    expect(sorted(ids(batch))).toEqual(sorted([d[0]!.messageId, ...keyless.map((item) => item.messageId)]));
  });

  it('past the keys it reaches, says so: the next claim is dense again, and a drain still takes every row in per-key order', async () => {
    const { f, topic, claims } = await fixture(publishedRows);
    const query = { owner: 'relay', limit: 2, leaseMs: 60_000, perKey: 1 };
    // One key with 10 rows: a short dense claim over 10 due rows switches to the sparse scan.
    const hot = Array.from({ length: 10 }, () => envelope(topic, 'hot'));
    await append(f, hot);
    let batch = await f.outbox.claim(query);
    expect(ids(batch)).toEqual([hot[0]!.messageId]);
    // 12 more keys: the sparse scan reaches 4 × limit = 8 keys, then hands back.
    const many = Array.from({ length: 12 }, (_, key) => [envelope(topic, `m${key}`), envelope(topic, `m${key}`)]);
    await append(f, roundRobin(many));
    const order = new Map<string, string[]>();
    for (const rows of [hot, ...many]) order.set(rows[0]!.key!, rows.map((item) => item.messageId));
    const seen = new Map<string, string[]>();
    for (let round = 0; round < 100 && batch.records.length > 0; round += 1) {
      for (const record of batch.records) seen.set(record.envelope.key!, [...(seen.get(record.envelope.key!) ?? []), record.envelope.messageId]);
      // Never two rows of one key in a head claim.
      expect(new Set(batch.records.map((record) => record.envelope.key)).size).toBe(batch.records.length);
      batch = await f.outbox.completeAndClaim({ lease: batch.lease, sequences: batch.records.map((record) => record.sequence) }, query);
    }
    expect(seen).toEqual(order);
    await expectDrained(f);
    const kinds = claims.map(sparse);
    // The first sparse claim saw more keys than it reaches, so the one after it was dense.
    const firstSparse = kinds.indexOf(true);
    expect(firstSparse).toBe(1);
    expect(kinds[firstSparse + 1]).toBe(false);
  });

});

describe('PostgreSQL head claim, sparse scan, plan', () => {
  it('stays on indexes: no sequential scan of the outbox in the sparse claim on 20,000 rows', { timeout: 60_000 }, async () => {
    const { f, topic, claims, inlined } = await fixture();
    const outbox = f.table('outbox');
    // 20 keys × 1,000 due rows, written directly (same columns as an append).
    await f.sql(
      `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at) ` +
        `SELECT 'seed-' || i, 'seed.Type', 1, ?, 'k' || (i % 20), md5('k' || (i % 20)), '2024-01-01T00:00:00.000Z', 'seed-' || i, '{}', '{}', 'pending', now(), 0, now() FROM generate_series(1, 20000) AS i`,
      [topic],
    );
    await f.sql(`ANALYZE ${outbox}`);
    const query = { owner: 'relay', limit: 100, leaseMs: 60_000, perKey: 1 };
    const first = await f.outbox.claim(query);
    expect(first.records.length).toBe(20);
    const second = await f.outbox.completeAndClaim({ lease: first.lease, sequences: first.records.map((record) => record.sequence) }, query);
    expect(second.records.length).toBe(20);
    expect(sparse(claims.at(-1)!)).toBe(true);
    // Explained without running it (EXPLAIN alone does not execute the data-modifying CTEs).
    const [row] = await f.sql(`EXPLAIN (FORMAT JSON) ${inlined()}`);
    const scans: string[] = [];
    const walk = (node: { 'Node Type': string; 'Relation Name'?: string; Plans?: unknown[] }) => {
      if (node['Node Type'] === 'Seq Scan') scans.push(String(node['Relation Name']));
      for (const child of node.Plans ?? []) walk(child as typeof node);
    };
    walk((row?.['QUERY PLAN'] as { Plan: { 'Node Type': string } }[])[0]!.Plan);
    expect(scans).toEqual([]);
  });
});
