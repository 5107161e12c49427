import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  ConfigError,
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  StorageError,
  createBus,
  defineMessage,
  type InMemoryTransaction,
  type OutboxAppend,
} from '@courier/core';
import { FAST, eventually } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });
const Shipped = defineMessage('shipping.OrderShipped', { version: 1 });

/**
 * An outbox store that writes at append time, as a driver adapter does (pg, mysql2): its
 * `append` returns a promise that settles a macrotask later, so a caller that commits
 * without awaiting it finds the write landing on an ended unit of work. `failNext` makes
 * the next writes of `shipping.OrderShipped` fail as a database would (a duplicate key).
 */
class WritingOutboxStore extends InMemoryOutboxStore {
  readonly asyncAppend = true;
  failNext = 0;
  writes = 0;

  override append(tx: InMemoryTransaction, messages: readonly OutboxAppend[]): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      setImmediate(() => {
        if (this.failNext > 0 && messages[0]?.envelope.type === Shipped.type) {
          this.failNext -= 1;
          reject(new StorageError('simulated write failure', { code: 'DUPLICATE_MESSAGE_ID', retriable: false }));
          return;
        }
        try {
          super.append(tx, messages);
          this.writes += 1;
          resolve();
        } catch (error) {
          reject(error as Error);
        }
      });
    });
  }
}

function setup() {
  const db = new InMemoryDatabase();
  const outbox = new WritingOutboxStore({ database: db });
  const inbox = new InMemoryInboxStore({ database: db });
  const broker = new InMemoryBroker();
  const bus = createBus({ outbox, inbox, transport: broker.connect(), retry: FAST.retry, relay: FAST.relay });
  return {
    db,
    outbox,
    bus,
    async [Symbol.asyncDispose]() {
      await bus.stop({ timeoutMs: 1_000 });
      await broker.close();
    },
  };
}

async function pendingIds(outbox: InMemoryOutboxStore): Promise<string[]> {
  const batch = await outbox.claim({ owner: 'inspector', limit: 100, leaseMs: 60_000, perKey: 100 });
  return batch.records.map((record) => record.envelope.messageId);
}

describe('async append: a store that writes at once', () => {
  it('types publish from the store: Promise<string> for a writing store, string for a queuing one', () => {
    const db = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const writing = createBus({ outbox: new WritingOutboxStore({ database: db }), transport: broker.connect() });
    const queuing = createBus({ outbox: new InMemoryOutboxStore({ database: db }), transport: broker.connect() });
    expectTypeOf(writing.outbox).returns.toHaveProperty('publish').returns.toEqualTypeOf<Promise<string>>();
    expectTypeOf(queuing.outbox).returns.toHaveProperty('publish').returns.toEqualTypeOf<string>();
    void broker.close();
  });

  it('publish resolves with the messageId once the row is written, and it commits with the unit of work', async () => {
    await using s = setup();
    let id = '';
    await s.db.transaction(async (tx) => {
      const pending = s.bus.outbox(tx).publish(Placed, { n: 1 }, { key: 'o-1' });
      expect(pending).toBeInstanceOf(Promise);
      id = await pending;
    });
    expect(await pendingIds(s.outbox)).toEqual([id]);
  });

  it('a validation problem rejects the promise instead of throwing; nothing is written and the unit of work stays usable', async () => {
    await using s = setup();
    let good = '';
    await s.db.transaction(async (tx) => {
      const outbox = s.bus.outbox(tx);
      let pending: Promise<string> | undefined;
      expect(() => {
        pending = outbox.publish(Placed, {}, { key: '' });
      }, 'publish does not throw on a store that writes at once').not.toThrow();
      await expect(pending).rejects.toBeInstanceOf(ConfigError);
      good = await outbox.publish(Placed, {}, { key: 'k' });
    });
    expect(await pendingIds(s.outbox)).toEqual([good]);
    expect(s.outbox.writes).toBe(1);
  });

  it('ctx.publish a handler did not await is awaited before the inbox transaction commits', async () => {
    await using s = setup();
    const handled: string[] = [];
    s.bus.subscribe('shipping', Placed, async (message, ctx) => {
      // Deliberately not awaited: the consumer must still wait for the write before committing.
      void ctx.publish(Shipped, {}, { key: message.key ?? undefined });
      handled.push(message.messageId);
    });
    await s.bus.start();
    await s.db.transaction(async (tx) => {
      await s.bus.outbox(tx).publish(Placed, {}, { key: 'o-1' });
    });
    await eventually(() => expect(handled).toHaveLength(1));
    await eventually(async () => expect((await s.outbox.stats()).pending).toBe(0));
    // Both the trigger and the message the handler published were written and relayed.
    expect(s.outbox.writes).toBe(2);
  });

  it('a ctx.publish that fails fails the delivery even when the handler did not await it; the retry publishes', async () => {
    await using s = setup();
    const attempts: number[] = [];
    const effects: string[] = [];
    s.bus.subscribe('shipping', Placed, async (_message, ctx) => {
      attempts.push(ctx.attempt);
      void ctx.publish(Shipped, {});
      ctx.tx.onCommit(() => effects.push(`applied on attempt ${ctx.attempt}`));
    });
    s.outbox.failNext = 1;
    await s.bus.start();
    await s.db.transaction(async (tx) => {
      await s.bus.outbox(tx).publish(Placed, {}, { key: 'o-1' });
    });
    await eventually(() => expect(effects).toEqual(['applied on attempt 2']));
    expect(attempts).toEqual([1, 2]);
    await eventually(async () => expect((await s.outbox.stats()).pending).toBe(0));
    expect(s.outbox.writes).toBe(2);
  });
});
