import { describe, expect, it } from 'vitest';
import {
  ClosedError,
  ConfigError,
  CourierError,
  InMemoryDatabase,
  InMemoryOutboxStore,
  SerializationError,
  StorageError,
  type Envelope,
  type InMemoryTransaction,
} from '@courier/core';

let counter = 0;
function envelope(key: string | null = 'k', overrides: Partial<Envelope> = {}): Envelope {
  counter += 1;
  const messageId = `m-${counter}`;
  return {
    messageId,
    type: 'tests.Thing',
    version: 1,
    topic: 'tests',
    occurredAt: '2024-01-01T00:00:00.000Z',
    key,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
    ...overrides,
  };
}

function setup() {
  const clock = { now: 1_000_000 };
  const db = new InMemoryDatabase({ now: () => clock.now });
  const outbox = new InMemoryOutboxStore({ database: db });
  const claim = (owner = 'relay', leaseMs = 1_000) => outbox.claim({ owner, limit: 100, leaseMs, perKey: 1 });
  return { clock, db, outbox, claim };
}

describe('InMemoryOutboxStore', () => {
  it('refuses what is not a live InMemoryTransaction of its database', async () => {
    const { db, outbox } = setup();
    expect(() => outbox.append({} as InMemoryTransaction, [{ envelope: envelope() }])).toThrowError(/'append' needs an InMemoryTransaction/);
    const foreign = new InMemoryDatabase().begin();
    expect(() => outbox.append(foreign, [{ envelope: envelope() }])).toThrowError(/another InMemoryDatabase/);
    const tx = db.begin();
    await tx.rollback();
    try {
      outbox.append(tx, [{ envelope: envelope() }]);
      expect.unreachable();
    } catch (error) {
      expect(error).toBeInstanceOf(CourierError);
      expect((error as CourierError).code).toBe('UNIT_OF_WORK_ENDED');
    }
  });

  it('refuses a duplicate messageId at append when it is visible, staged, or twice in the batch', async () => {
    const { db, outbox } = setup();
    const first = envelope();
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: first }]));
    const tx = db.begin();
    expect(() => outbox.append(tx, [{ envelope: first }])).toThrowError(expect.objectContaining({ code: 'DUPLICATE_MESSAGE_ID', retriable: false }));
    const staged = envelope();
    outbox.append(tx, [{ envelope: staged }]);
    expect(() => outbox.append(tx, [{ envelope: staged }])).toThrowError(/already in the outbox/);
    const twice = envelope();
    expect(() => outbox.append(tx, [{ envelope: twice }, { envelope: twice }])).toThrowError(StorageError);
  });

  it('fails the later of two commits staging one messageId and writes none of its rows', async () => {
    const { db, outbox, claim } = setup();
    const shared = envelope('a');
    const other = envelope('b');
    const first = db.begin();
    const second = db.begin();
    outbox.append(first, [{ envelope: shared }]);
    outbox.append(second, [{ envelope: other }, { envelope: { ...shared, payload: '{"v":2}' } }]);
    await first.commit();
    await expect(second.commit()).rejects.toMatchObject({ code: 'DUPLICATE_MESSAGE_ID' });
    const batch = await claim();
    expect(batch.records.map((record) => [record.envelope.messageId, record.envelope.payload])).toEqual([[shared.messageId, '{}']]);
  });

  it('validates envelopes and schedules, appending nothing of a bad batch', async () => {
    const { db, outbox, claim } = setup();
    const tx = db.begin();
    const good = envelope();
    expect(() => outbox.append(tx, [{ envelope: good }, { envelope: { ...envelope(), topic: 'bad topic!' } }])).toThrowError(SerializationError);
    expect(() => outbox.append(tx, [{ envelope: good, delayMs: -1 }])).toThrowError(ConfigError);
    expect(() => outbox.append(tx, [{ envelope: good, notBefore: new Date(Number.NaN) }])).toThrowError(ConfigError);
    await tx.commit();
    expect((await claim()).records).toEqual([]);
  });

  it('compares delays and leases with the database clock, to the millisecond', async () => {
    const { clock, db, outbox, claim } = setup();
    const delayed = envelope(null);
    const scheduled = envelope(null);
    await db.transaction(async (tx) =>
      outbox.append(tx, [
        { envelope: delayed, delayMs: 500 },
        { envelope: scheduled, notBefore: new Date(clock.now + 800) },
      ]),
    );
    clock.now += 499;
    expect((await claim()).records).toEqual([]);
    clock.now += 1;
    const first = await claim('a', 100);
    expect(first.records.map((record) => record.envelope.messageId)).toEqual([delayed.messageId]);
    clock.now += 99;
    expect((await claim('b')).records).toEqual([]);
    clock.now += 1;
    const reclaimed = await claim('b');
    expect(reclaimed.records.map((record) => record.envelope.messageId)).toEqual([delayed.messageId]);
    clock.now += 200;
    expect((await claim('c')).records.map((record) => record.envelope.messageId)).toEqual([scheduled.messageId]);
  });

  it('applies nothing while beforeCommit never resolves, and fences it if it resolves late', async () => {
    const { clock, db, outbox, claim } = setup();
    const row = envelope();
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: row }]));
    const frozen = await claim('frozen', 100);
    let thaw!: () => void;
    const completing = outbox.complete(frozen.lease, [frozen.records[0]!.sequence], {
      beforeCommit: () => new Promise<void>((resolve) => (thaw = resolve)),
    });
    clock.now += 100;
    const taker = await claim('taker');
    expect(taker.records).toHaveLength(1);
    thaw();
    expect(await completing).toBe(0);
    expect(await outbox.complete(taker.lease, [taker.records[0]!.sequence])).toBe(1);
  });

  it('counts a row in retry backoff (and one released) from when it first became due, not from the end of its backoff', async () => {
    const { clock, db, outbox, claim } = setup();
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope('failing') }]));
    clock.now += 1_000;
    const first = await claim();
    await outbox.fail(first.lease, [{ sequence: first.records[0]!.sequence, error: 'TransportError [PUBLISH_REJECTED]: no', outcome: 'retry', delayMs: 3_600_000 }]);
    clock.now += 60_000;
    // Waiting out an hour's backoff: 61 s old, as a backlog alert must see it (it read 0 before).
    expect(await outbox.stats()).toMatchObject({ pending: 1, oldestPendingAgeMs: 61_000 });
    clock.now += 3_600_000;
    const second = await claim();
    expect(await outbox.stats()).toMatchObject({ inFlight: 1, oldestPendingAgeMs: 3_661_000 });
    await outbox.release(second.lease, [second.records[0]!.sequence], 0);
    clock.now += 1_000;
    expect((await outbox.stats()).oldestPendingAgeMs).toBe(3_662_000);
  });

  it('reports the age of the oldest due pending row and prunes by publish time', async () => {
    const { clock, db, outbox, claim } = setup();
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope('a') }, { envelope: envelope('b'), delayMs: 10_000 }]));
    clock.now += 250;
    expect((await outbox.stats()).oldestPendingAgeMs).toBe(250);
    const batch = await claim();
    await outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
    clock.now += 1_000;
    expect(await outbox.prune(1_001)).toBe(0);
    expect(await outbox.prune(1_000)).toBe(1);
  });

  it('rejects every operation with a retriable StorageError during an outage', async () => {
    const { db, outbox, claim } = setup();
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope() }]));
    const tx = db.begin();
    outbox.append(tx, [{ envelope: envelope() }]);
    db.setAvailable(false);
    await expect(claim()).rejects.toMatchObject({ name: 'StorageError', retriable: true });
    await expect(outbox.stats()).rejects.toThrowError(/unavailable; 'stats' failed/);
    await expect(tx.commit()).rejects.toBeInstanceOf(StorageError);
    db.setAvailable(true);
    expect((await claim()).records).toHaveLength(1);
  });

  it('wakes watchers after commits, releases, replays and resumes, not after rollbacks', async () => {
    const { db, outbox, claim } = setup();
    const calls: string[] = [];
    let label = '';
    const stop = await outbox.watch(() => calls.push(label));
    const flush = () => new Promise<void>((resolve) => setImmediate(resolve));
    label = 'rollback';
    await expect(
      db.transaction(async (tx) => {
        outbox.append(tx, [{ envelope: envelope() }]);
        throw new Error('rolled back');
      }),
    ).rejects.toThrow('rolled back');
    await flush();
    label = 'commit';
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope('h') }]));
    await flush();
    label = 'release';
    const batch = await claim();
    await outbox.release(batch.lease, [batch.records[0]!.sequence]);
    await flush();
    label = 'replay';
    const again = await claim();
    await outbox.fail(again.lease, [{ sequence: again.records[0]!.sequence, error: 'x', outcome: 'halt' }]);
    await outbox.resume('tests', 'h', 'retry');
    await flush();
    await stop();
    label = 'stopped';
    await db.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope() }]));
    await flush();
    expect(calls).toEqual(['commit', 'release', 'replay']);
  });

  it('rejects bad claim options listing every problem, and every call after close', async () => {
    const { outbox } = setup();
    await expect(outbox.claim({ owner: 'r', limit: 0, leaseMs: 0, perKey: 0 })).rejects.toMatchObject({ problems: expect.arrayContaining([expect.stringContaining("'limit'"), expect.stringContaining("'leaseMs'"), expect.stringContaining("'perKey'")]) });
    await outbox.close();
    await outbox.close();
    await expect(outbox.stats()).rejects.toBeInstanceOf(ClosedError);
  });
});
