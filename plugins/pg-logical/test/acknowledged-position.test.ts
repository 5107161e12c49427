// What the log-tailing store confirms to PostgreSQL must never pass what the server sent
// it (at most the WAL the server flushed). pg-logical-replication's `acknowledge(lsn)` reports `lsn + 1` (it takes
// the last byte received); a keepalive's position and a commit's end are already "the
// byte after". Reported as is, a keepalive between a transaction's last insert and its
// COMMIT confirmed the commit record's first byte, and the next reader of the slot
// skipped that transaction (seen in CI: a SIGKILLed relay's slot held none of its 12 rows).
import { createBus, noopLogger } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogTailFixture, eventually, Ping, RecordingTransport, type LogTailFixture } from './support/fixture.js';

const fixtures: LogTailFixture[] = [];
afterEach(async () => {
  while (fixtures.length > 0) await fixtures.pop()!.close();
});

/**
 * The slot's confirmed position and, read after it, the end of the WAL the server has
 * flushed (a walsender sends only flushed WAL, so a correct reader never confirms past it).
 */
async function positions(f: LogTailFixture): Promise<{ confirmed: bigint; flushed: bigint } | undefined> {
  const { rows } = await f.admin.query<{ confirmed: string | null; flushed: string }>(
    `SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::text AS confirmed, (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::text AS flushed
       FROM pg_replication_slots WHERE slot_name = $1`,
    [f.id],
  );
  const row = rows[0];
  return row && row.confirmed !== null ? { confirmed: BigInt(row.confirmed), flushed: BigInt(row.flushed) } : undefined;
}

describe('the position the log-tailing store acknowledges', () => {
  it('never passes the WAL the server flushed (so never a commit it has not sent)', async () => {
    const f = await createLogTailFixture();
    fixtures.push(f);
    const store = f.logTail();
    const transport = new RecordingTransport();
    const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000 } });
    await bus.start({ relay: true, consumers: false });
    await eventually(() => expect(store.streaming).toBe(true));

    await f.transaction(async (em) => {
      for (let i = 0; i < 3; i++) bus.outbox(em).publish(Ping, { i }, { key: 'k' });
    });
    await eventually(() => expect(transport.published).toHaveLength(3));
    await eventually(async () => expect((await store.slotStats())?.unacknowledgedAgeMs).toBe(0));

    // Idle and busy alike, what the slot confirmed never passes the server's flushed WAL.
    const deadline = Date.now() + 4_000;
    let seen = 0;
    while (Date.now() < deadline) {
      const now = await positions(f);
      if (now) {
        seen++;
        expect(now.confirmed, `the slot confirmed ${now.confirmed}, past the server's flushed WAL ${now.flushed}`).toBeLessThanOrEqual(now.flushed);
      }
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    expect(seen).toBeGreaterThan(0);
    await bus.stop();
  });
});
