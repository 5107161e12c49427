// Ordered pipelining (perKey > 1) on MariaDB: several relays claiming at once must not
// deadlock each other. Each claim locks every row it updates, heads and followers, before
// it draws the token. Runs for COURIER_CLAIM_SOAK_MS (default 4 s) per driver and prints
// the counts; the figures in the README come from 10 s runs.
import { eventually } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { isLockConflict } from '@courier/sql-engine';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, testId } from './support/helpers.js';

const SOAK_MS = Number(process.env['COURIER_CLAIM_SOAK_MS'] ?? 4_000);
const CLAIMERS = 3;
const PER_KEY = 4;
const KEYS = 12;

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

// The soak above passes with claims that take no row locks (issue 29: tried with the lock
// removed): the lease token row serialises claims so tightly that two rarely read the same
// heads. Here two head claims (perKey 1: the rows are read, then the token drawn) are held at
// the token row by a transaction of the test until both have read their heads: locked rows are
// skipped by the second, unlocked ones are claimed by both.
describe.each(['mariadb', 'mysql-driver'] as const)('two claims that read the heads at once (%s)', (dialect) => {
  it('never claim the same row', async () => {
    const f = await createMikroOrmFixture(dialect, { testId: testId() }, { orm: { pool: { min: 0, max: 12 } } });
    open.push(f);
    const topic = `${f.tablePrefix}overlap`;
    const rows = Array.from({ length: 6 }, (_, index) => envelope(topic, `k${index}`));
    await f.transaction(async (tx) => f.outbox.append(tx, rows.map((item) => ({ envelope: item }))));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    const holder = f.orm.em.fork().transactional(async (em) => {
      await em.getConnection().execute(`SELECT value FROM ${f.table('meta')} WHERE name = 'lease_token' FOR UPDATE`, [], 'all', em.getTransactionContext());
      held();
      await released;
    });
    try {
      await holding;
      const claim = (owner: string) => f.outbox.claim({ owner, limit: 10, leaseMs: 60_000, perKey: 1 });
      const claims = [claim('relay-0'), claim('relay-1')] as const;
      // Both claims have read their heads once both wait for the token row.
      await eventually(
        async () => {
          const waiting = await f.sql(`SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE %' AND INFO LIKE '%LAST_INSERT_ID(value + 1)%'`);
          expect(Number(waiting[0]!['n'])).toBe(2);
        },
        { timeoutMs: 20_000 },
      );
      release();
      await holder;
      const [first, second] = await Promise.all(claims);
      const ids = (batch: Awaited<ReturnType<typeof claim>>) => batch.records.map((record) => record.envelope.messageId);
      expect(ids(first).filter((id) => ids(second).includes(id)), 'rows claimed by both').toEqual([]);
      expect([...ids(first), ...ids(second)].sort()).toEqual(rows.map((item) => item.messageId).sort());
    } finally {
      release();
      await holder.catch(() => undefined);
    }
  }, 60_000);
});

describe.each(['mariadb', 'mysql-driver'] as const)('claims with perKey > 1 (%s)', (dialect) => {
  it(`${CLAIMERS} claimers at perKey ${PER_KEY} against a steady producer: no deadlocks, every row published once`, async () => {
    const f = await createMikroOrmFixture(dialect, { testId: testId() }, { orm: { pool: { min: 0, max: 12 } } });
    open.push(f);
    const topic = `${f.tablePrefix}claims`;
    const deadline = Date.now() + SOAK_MS;
    const appended = new Set<string>();
    const published = new Map<string, number>();
    const counts = { claims: 0, deadlocks: 0, producerConflicts: 0 };
    let producing = true;

    const producer = async (): Promise<void> => {
      for (let round = 0; Date.now() < deadline; round += 1) {
        // Keep a backlog of a few hundred rows, so the claimers (not the producer) set the pace and the drain is short.
        if (appended.size - published.size > 300) {
          await new Promise((resolve) => setImmediate(resolve));
          continue;
        }
        const batch = Array.from({ length: 24 }, (_, index) => envelope(topic, `k${(round + index) % KEYS}`));
        try {
          await f.transaction(async (tx) => f.outbox.append(tx, batch.map((item) => ({ envelope: item }))));
          for (const item of batch) appended.add(item.messageId);
        } catch (error) {
          if (!isLockConflict(error)) throw error;
          counts.producerConflicts += 1;
        }
      }
      producing = false;
    };
    const claimer = async (index: number): Promise<void> => {
      for (let idle = 0; producing || idle < 3; ) {
        let batch;
        try {
          batch = await f.outbox.claim({ owner: `relay-${index}`, limit: 40, leaseMs: 60_000, perKey: PER_KEY });
          counts.claims += 1;
        } catch (error) {
          if (!isLockConflict(error)) throw error;
          counts.deadlocks += 1;
          continue;
        }
        idle = batch.records.length === 0 ? idle + 1 : 0;
        if (batch.records.length === 0) continue;
        for (const record of batch.records) published.set(record.envelope.messageId, (published.get(record.envelope.messageId) ?? 0) + 1);
        expect(await f.outbox.complete(batch.lease, batch.records.map((record) => record.sequence))).toBe(batch.records.length);
      }
    };
    await Promise.all([producer(), ...Array.from({ length: CLAIMERS }, (_, index) => claimer(index))]);
    console.log(
      `[claim-deadlocks ${dialect}] ${SOAK_MS} ms, ${CLAIMERS} claimers perKey ${PER_KEY}: ${counts.claims} claims, ${published.size} rows published, ${counts.deadlocks} deadlocks ` +
        `(${((counts.deadlocks * 10_000) / SOAK_MS).toFixed(1)} per 10 s), ${appended.size} rows, producer lock conflicts ${counts.producerConflicts}`,
    );
    expect(counts.deadlocks).toBe(0);
    expect([...appended].filter((id) => published.get(id) !== 1)).toEqual([]);
    expect(published.size).toBe(appended.size);
  }, SOAK_MS * 4 + 30_000);
});
