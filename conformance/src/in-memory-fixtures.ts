import { InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, type InMemoryTransaction } from '@courier/core';
import type { FixtureContext, StoreFixture, TransportFixture } from './fixtures.js';

/**
 * A store fixture over a fresh {@link InMemoryDatabase}: the reference implementation
 * the suites are proven against, and a ready fixture for engine tests.
 *
 * Guarantees: effects are staged into the unit of work and applied at its commit, so
 * they commit and roll back with the outbox rows and the inbox record; `outage`
 * toggles the database's simulated availability. Nothing outlives the fixture.
 */
export async function createInMemoryStoreFixture(_context?: FixtureContext, database = new InMemoryDatabase()): Promise<StoreFixture<InMemoryTransaction>> {
  const outbox = new InMemoryOutboxStore({ database });
  const inbox = new InMemoryInboxStore({ database });
  const effects: string[] = [];
  return {
    outbox,
    inbox,
    transaction: (work) => database.transaction(work),
    // Rows are staged and get their sequence at commit: holding before it holds nothing.
    transactionHeldBeforeCommit: (work, beforeCommit) =>
      database.transaction(async (tx) => {
        const value = await work(tx);
        await beforeCommit();
        return value;
      }),
    // An InMemoryTransaction ends with its rollback: the next transaction is a new object.
    reusableUnitOfWork: {
      begin: async () => database.begin(),
      rollback: async (tx) => {
        await tx.rollback();
        return database.begin();
      },
      commit: (tx) => tx.commit(),
    },
    recordEffect: async (tx, id) => {
      database.assertAvailable('recordEffect');
      tx.onCommit(() => {
        effects.push(id);
      });
    },
    readEffects: async () => [...effects],
    outage: {
      begin: async () => database.setAvailable(false),
      end: async () => database.setAvailable(true),
    },
    close: async () => {
      await outbox.close();
      await inbox.close();
    },
  };
}

/**
 * A transport fixture over a fresh {@link InMemoryBroker}: `connect` opens another
 * connection, `kill` drops one as a crash would, `outage`, `rejectPublish`, `failSettles` and
 * `refusable` inject broker faults. `close` closes the broker and every connection.
 */
export async function createInMemoryTransportFixture(_context?: FixtureContext, broker = new InMemoryBroker()): Promise<TransportFixture> {
  let refusing = false;
  return {
    transport: broker.connect(),
    connect: async () => broker.connect(),
    kill: async (transport) => broker.kill(transport),
    outage: {
      begin: async () => broker.setAvailable(false),
      end: async () => broker.setAvailable(true),
    },
    rejectPublish: async (predicate) => {
      broker.failPublish(predicate);
    },
    failSettles: async (kind, count) => {
      broker.failSettles(kind, count);
    },
    refusable: (envelope) => {
      // The broker refuses what carries this header, as a real one refuses content it cannot take.
      if (!refusing) broker.failPublish((candidate) => candidate.headers[REFUSED_HEADER] !== undefined);
      refusing = true;
      return { ...envelope, headers: { ...envelope.headers, [REFUSED_HEADER]: 'yes' } };
    },
    close: () => broker.close(),
  };
}

const REFUSED_HEADER = 'conformance-refused';
