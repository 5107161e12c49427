// How append joins MikroORM units of work, beyond what the conformance suite checks:
// entity changes and outbox rows commit together through every way of flushing, and
// misuse is refused with an error that says what to do.
import { deferred } from '@courier/conformance';
import { ConfigError, CourierError, createBus, defineMessage, InMemoryBroker, SerializationError, StorageError, type Envelope } from '@courier/core';
import { RequestContext, type EntityManager } from '@mikro-orm/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createMikroOrmFixture, FIXTURE_DIALECTS, type MikroOrmFixture } from './support/fixture.js';
import { claimAll, envelope, idsOf, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function fixtureFor(dialect: (typeof FIXTURE_DIALECTS)[number], options: Parameters<typeof createMikroOrmFixture>[2] = {}): Promise<MikroOrmFixture> {
  const fixture = await createMikroOrmFixture(dialect, { testId: testId() }, options);
  open.push(fixture);
  return fixture;
}

function codeOf(run: () => unknown): string | undefined {
  try {
    run();
  } catch (error) {
    if (error instanceof CourierError) return error.code;
    throw error;
  }
  return undefined;
}

describe.each(FIXTURE_DIALECTS)('append joins the unit of work (%s)', (dialect) => {
  it('writes the rows with the entity changes of the same em.flush()', async () => {
    const f = await fixtureFor(dialect);
    const em = f.orm.em.fork();
    const message = envelope(f.tablePrefix, 'order-1');
    em.persist(em.create(f.Effect, { effectId: 'order-1' }));
    f.outbox.append(em, [{ envelope: message }]);
    expect(idsOf(await claimAll(f))).toEqual([]);
    await em.flush();
    expect(await f.readEffects()).toEqual(['order-1']);
    expect(idsOf(await claimAll(f))).toEqual([message.messageId]);
  });

  it('a flush that fails writes neither the entities nor the rows', async () => {
    const f = await fixtureFor(dialect);
    const taken = envelope(f.tablePrefix, 'k');
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: taken }]));
    const em = f.orm.em.fork();
    em.persist(em.create(f.Effect, { effectId: 'doomed' }));
    f.outbox.append(em, [{ envelope: envelope(f.tablePrefix, 'other') }, { envelope: { ...taken, payload: '{"again":true}' } }]);
    const error = await em.flush().then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(StorageError);
    expect((error as StorageError).code).toBe('DUPLICATE_MESSAGE_ID');
    expect((error as StorageError).retriable).toBe(false);
    expect(await f.readEffects()).toEqual([]);
    const batch = await claimAll(f);
    expect(idsOf(batch)).toEqual([taken.messageId]);
    expect(batch.records[0]!.envelope.payload).toBe('{}');
  });

  it('a flush with nothing else to write still writes the rows, and wakes watchers after commit', async () => {
    const f = await fixtureFor(dialect);
    let woken = 0;
    const stop = await f.outbox.watch(() => {
      woken += 1;
    });
    try {
      const em = f.orm.em.fork();
      const message = envelope(f.tablePrefix, null);
      f.outbox.append(em, [{ envelope: message }]);
      await em.flush();
      expect(idsOf(await claimAll(f))).toEqual([message.messageId]);
      await new Promise((resolve) => setTimeout(resolve, 10));
      expect(woken).toBeGreaterThan(0);
    } finally {
      await stop();
    }
  });

  it('em.transactional with a nested transactional commits everything together, or nothing', async () => {
    const f = await fixtureFor(dialect);
    const outer = envelope(f.tablePrefix, 'a');
    const inner = envelope(f.tablePrefix, 'b');
    await f.orm.em.fork().transactional(async (em) => {
      f.outbox.append(em, [{ envelope: outer }]);
      await em.transactional(async (nested) => {
        f.outbox.append(nested, [{ envelope: inner }]);
        await f.recordEffect(nested, 'nested');
      });
    });
    expect(idsOf(await claimAll(f))).toEqual([outer.messageId, inner.messageId].sort());
    const lost = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'c')];
    await expect(
      f.orm.em.fork().transactional(async (em) => {
        await em.transactional(async (nested) => {
          f.outbox.append(nested, [{ envelope: lost[0]! }]);
        });
        f.outbox.append(em, [{ envelope: lost[1]! }]);
        await em.flush();
        throw new Error('outer rollback');
      }),
    ).rejects.toThrow('outer rollback');
    expect(idsOf(await claimAll(f, 'relay-2'))).toEqual([]);
    expect((await f.outbox.stats()).pending).toBe(2);
  });

  it('em.begin() / em.commit() and em.rollback() carry the rows', async () => {
    const f = await fixtureFor(dialect);
    const kept = envelope(f.tablePrefix, 'k');
    const lost = envelope(f.tablePrefix, 'l');
    const em = f.orm.em.fork();
    await em.begin();
    f.outbox.append(em, [{ envelope: kept }]);
    await em.commit();
    const other = f.orm.em.fork();
    await other.begin();
    f.outbox.append(other, [{ envelope: lost }]);
    await other.flush();
    await other.rollback();
    expect(idsOf(await claimAll(f))).toEqual([kept.messageId]);
  });

  it('a rollback discards the rows appended before it, even when the EntityManager is used again', async () => {
    const f = await fixtureFor(dialect);
    // Flushed entity, then a publish, then a rollback; the same EntityManager flushes again.
    const em = f.orm.em.fork();
    await em.begin();
    em.persist(em.create(f.Effect, { effectId: 'order' }));
    await em.flush();
    f.outbox.append(em, [{ envelope: envelope(f.tablePrefix, 'k') }]);
    await em.rollback();
    em.persist(em.create(f.Effect, { effectId: 'other' }));
    await em.flush();
    // No flush before the rollback; a new transaction on the same EntityManager commits.
    const again = f.orm.em.fork();
    await again.begin();
    f.outbox.append(again, [{ envelope: envelope(f.tablePrefix, 'k') }]);
    await again.rollback();
    const kept = envelope(f.tablePrefix, 'k');
    await again.begin();
    f.outbox.append(again, [{ envelope: kept }]);
    await again.commit();
    expect(await f.readEffects()).toEqual(['other']);
    expect(idsOf(await claimAll(f))).toEqual([kept.messageId]);
    expect((await f.outbox.stats()).pending).toBe(1);
  });

  it('em.clear() discards the rows not flushed yet, as it does entity changes', async () => {
    const f = await fixtureFor(dialect);
    const em = f.orm.em.fork();
    f.outbox.append(em, [{ envelope: envelope(f.tablePrefix, 'cleared') }]);
    em.clear();
    const kept = envelope(f.tablePrefix, 'kept');
    f.outbox.append(em, [{ envelope: kept }]);
    em.persist(em.create(f.Effect, { effectId: 'after-clear' }));
    await em.flush();
    await RequestContext.create(f.orm.em, async () => {
      f.outbox.append(f.orm.em, [{ envelope: envelope(f.tablePrefix, 'cleared-in-context') }]);
      f.orm.em.clear();
      await f.orm.em.flush();
    });
    expect(await f.readEffects()).toEqual(['after-clear']);
    expect(idsOf(await claimAll(f))).toEqual([kept.messageId]);
  });

  it('writes an envelope the bus built as it is, and validates one it did not: a changed copy is refused naming the field', async () => {
    const f = await fixtureFor(dialect);
    const received: Envelope[] = [];
    const append = f.outbox.append.bind(f.outbox);
    f.outbox.append = (tx, messages) => {
      append(tx, messages);
      received.push(...messages.map((message) => message.envelope));
    };
    const bus = createBus<EntityManager>({ outbox: f.outbox, transport: new InMemoryBroker().connect() });
    const Tested = defineMessage('mikroorm.Tested', { version: 1, topic: f.tablePrefix });
    const em = f.orm.em.fork();
    const messageId = bus.outbox(em).publish(Tested, { n: 1 }, { key: 'k' });
    const published = received[0]!;
    const refusal = (changed: object) => {
      try {
        f.outbox.append(em, [{ envelope: changed as Envelope }]);
      } catch (error) {
        expect(error).toBeInstanceOf(SerializationError);
        return (error as SerializationError).message;
      }
      return expect.unreachable('expected the store to refuse the envelope');
    };
    expect(refusal({ ...published, type: 'bad type' })).toContain("'type' is malformed");
    expect(refusal({ ...published, messageId: '' })).toContain("'messageId'");
    expect(refusal({ ...published, headers: { 'courier-seq': '1' } })).toContain('reserved');
    await em.flush();
    const batch = await claimAll(f);
    expect(idsOf(batch)).toEqual([messageId]);
    expect(batch.records[0]!.envelope).toEqual(published);
  });

  it('refuses a publish on an EntityManager whose transactional fork is active, naming the fork', async () => {
    const f = await fixtureFor(dialect);
    const em = f.orm.em.fork();
    const refused = [{ envelope: envelope(f.tablePrefix, 'outer') }];
    const inner = envelope(f.tablePrefix, 'inner');
    const nested = envelope(f.tablePrefix, 'nested');
    await em.transactional(async (tx) => {
      expect(codeOf(() => f.outbox.append(em, refused))).toBe('UNIT_OF_WORK_REQUIRED');
      expect(() => f.outbox.append(em, refused)).toThrow(/the 'em' the transactional callback received/);
      f.outbox.append(tx, [{ envelope: inner }]);
      await tx.transactional(async (savepoint) => {
        expect(codeOf(() => f.outbox.append(tx, refused))).toBe('UNIT_OF_WORK_REQUIRED');
        f.outbox.append(savepoint, [{ envelope: nested }]);
      });
    });
    // Once the callback has returned, the outer EntityManager is a unit of work again.
    const after = envelope(f.tablePrefix, 'after');
    f.outbox.append(em, [{ envelope: after }]);
    await em.flush();
    expect(idsOf(await claimAll(f))).toEqual([inner.messageId, nested.messageId, after.messageId].sort());
  });

  it('a savepoint rollback discards the rows flushed inside it; the enclosing transaction keeps its own', async () => {
    const f = await fixtureFor(dialect);
    const kept = envelope(f.tablePrefix, 'kept');
    await f.orm.em.fork().transactional(async (tx) => {
      f.outbox.append(tx, [{ envelope: kept }]);
      await expect(
        tx.transactional(async (savepoint) => {
          f.outbox.append(savepoint, [{ envelope: envelope(f.tablePrefix, 'lost') }]);
          await f.recordEffect(savepoint, 'savepoint');
          throw new Error('savepoint rollback');
        }),
      ).rejects.toThrow('savepoint rollback');
    });
    expect(await f.readEffects()).toEqual([]);
    expect(idsOf(await claimAll(f))).toEqual([kept.messageId]);
  });

  it('the global EntityManager stands for the RequestContext fork inside one', async () => {
    const f = await fixtureFor(dialect);
    const message = envelope(f.tablePrefix, 'ctx');
    await RequestContext.create(f.orm.em, async () => {
      f.orm.em.persist(f.orm.em.create(f.Effect, { effectId: 'in-context' }));
      f.outbox.append(f.orm.em, [{ envelope: message }]);
      await f.orm.em.flush();
    });
    expect(await f.readEffects()).toEqual(['in-context']);
    expect(idsOf(await claimAll(f))).toEqual([message.messageId]);
  });

  it('rows of an EntityManager that is never flushed are never written', async () => {
    const f = await fixtureFor(dialect);
    f.outbox.append(f.orm.em.fork(), [{ envelope: envelope(f.tablePrefix, 'never') }]);
    const em = f.orm.em.fork();
    await em.flush();
    expect(idsOf(await claimAll(f))).toEqual([]);
  });

  it('refuses the global EntityManager, a foreign one, an ended transaction and non-EntityManagers, naming the remedy', async () => {
    const f = await fixtureFor(dialect);
    const message = [{ envelope: envelope(f.tablePrefix, 'x') }];
    expect(codeOf(() => f.outbox.append(f.orm.em, message))).toBe('UNIT_OF_WORK_REQUIRED');
    expect(() => f.outbox.append(f.orm.em, message)).toThrow(/em\.fork\(\)/);
    const other = await fixtureFor(dialect);
    expect(codeOf(() => f.outbox.append(other.orm.em.fork(), message))).toBe('UNIT_OF_WORK_REQUIRED');
    expect(() => f.outbox.append(other.orm.em.fork(), message)).toThrow(/another MikroORM instance/);
    let ended: EntityManager | undefined;
    await f.orm.em.fork().transactional(async (em) => {
      ended = em;
    });
    expect(codeOf(() => f.outbox.append(ended!, message))).toBe('UNIT_OF_WORK_ENDED');
    expect(codeOf(() => f.outbox.append({} as EntityManager, message))).toBe('UNIT_OF_WORK_REQUIRED');
    expect(codeOf(() => f.outbox.append(null as unknown as EntityManager, message))).toBe('UNIT_OF_WORK_REQUIRED');
    expect(() => f.outbox.append(f.orm.em.fork(), [{ envelope: envelope(f.tablePrefix, 'x'), delayMs: -1 }])).toThrow(ConfigError);
    expect(idsOf(await claimAll(f))).toEqual([]);
  });

  it('with implicitTransactions off, appends need an explicit transaction', async () => {
    const f = await fixtureFor(dialect, { orm: { implicitTransactions: false } });
    const message = envelope(f.tablePrefix, 'k');
    expect(codeOf(() => f.outbox.append(f.orm.em.fork(), [{ envelope: message }]))).toBe('UNIT_OF_WORK_REQUIRED');
    await f.orm.em.fork().transactional(async (em) => {
      f.outbox.append(em, [{ envelope: message }]);
    });
    expect(idsOf(await claimAll(f))).toEqual([message.messageId]);
  });

  it('after close(), append is refused', async () => {
    const f = await fixtureFor(dialect);
    await f.outbox.close();
    await f.outbox.close();
    expect(codeOf(() => f.outbox.append(f.orm.em.fork(), [{ envelope: envelope(f.tablePrefix, 'k') }]))).toBe('CLOSED');
    await expect(claimAll(f)).rejects.toMatchObject({ code: 'CLOSED' });
  });
});

// SQLite has one writer: its producers take turns for the whole transaction, so there is
// no interleaving of two open producers to try there.
describe.each(FIXTURE_DIALECTS.filter((dialect) => dialect !== 'sqlite'))('producers that flush more than once (%s)', (dialect) => {
  it('never deadlock on key locks when they append the same keys in opposite orders', async () => {
    const f = await fixtureFor(dialect);
    let firstFlushes = 0;
    const bothFlushed = deferred();
    // Each producer flushes its first key, waits until the other has too, then appends
    // the other key and commits: the order in which a lock per flush would deadlock.
    const produce = (first: string, second: string) =>
      f.orm.em.fork().transactional(async (tx) => {
        tx.persist(tx.create(f.Effect, { effectId: `${first}-first` }));
        f.outbox.append(tx, [{ envelope: envelope(f.tablePrefix, first) }]);
        await tx.flush();
        firstFlushes += 1;
        if (firstFlushes === 2) bothFlushed.resolve();
        await bothFlushed.promise;
        f.outbox.append(tx, [{ envelope: envelope(f.tablePrefix, second) }]);
      });
    const results = await Promise.allSettled([produce('alpha', 'beta'), produce('beta', 'alpha')]);
    expect(results.map((result) => (result.status === 'rejected' ? String(result.reason) : 'committed'))).toEqual(['committed', 'committed']);
    expect((await f.outbox.stats()).pending).toBe(4);
    expect([...(await f.readEffects())].sort()).toEqual(['alpha-first', 'beta-first']);
  });
});
