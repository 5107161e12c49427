// A PostgreSQL outbox (MikroORM store, tables prefixed by the test id), the log-tailing
// store over it with a slot of the test's own, and a transport that records what it was
// asked to publish. Every slot a test creates is dropped by `close()`.
import { randomBytes } from 'node:crypto';
import { defineMessage, type Envelope, type PublishResult, type Transport, type TransportCapabilities } from '@courier/core';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import type { EntityManager, MikroORM, Options } from '@mikro-orm/core';
import pg from 'pg';
import { dropReplicationSlot, PgLogicalOutboxStore, type PgLogicalOutboxStoreConfig } from '../../src/index.js';

/** Connection URL of the PostgreSQL test database (`COURIER_PG_URL`); its role needs REPLICATION (scripts/services.sh grants it). */
export const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test';
const HOW_TO_START = `start PostgreSQL with wal_level = logical and a REPLICATION role (\`bash scripts/services.sh\`), or point COURIER_PG_URL at one (now ${PG_URL})`;

export const Ping = defineMessage('logtail.Ping', { version: 1 });

/** A unique, slot-safe id per test. */
export function testId(): string {
  return `lt_${randomBytes(5).toString('hex')}`;
}

/** Records every envelope it is asked to publish and confirms it; `gate` can hold or fail a publish. */
export class RecordingTransport implements Transport {
  readonly capabilities: TransportCapabilities = { orderingByKey: true, orderedPipelining: false, nativeDelay: false, nativeDeadLetter: false, maxMessageBytes: 1024 * 1024 };
  readonly published: Envelope[] = [];
  gate: ((messages: readonly Envelope[]) => Promise<void>) | undefined;

  async publish(messages: readonly Envelope[]): Promise<readonly PublishResult[]> {
    await this.gate?.(messages);
    this.published.push(...messages);
    return messages.map((message) => ({ messageId: message.messageId, ok: true as const }));
  }

  subscribe(): never {
    throw new Error('RecordingTransport only publishes');
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}

export interface LogTailFixture {
  readonly id: string;
  readonly orm: MikroORM;
  readonly inner: MikroOrmOutboxStore;
  readonly tablePrefix: string;
  readonly admin: pg.Pool;
  /** A log-tailing store over `inner` on this test's slot (closed by `close()`). */
  logTail(overrides?: Partial<PgLogicalOutboxStoreConfig<EntityManager>>): PgLogicalOutboxStore<EntityManager>;
  /** Another MikroORM outbox store on the same tables (a polling relay's). */
  polling(): MikroOrmOutboxStore;
  transaction<T>(work: (em: EntityManager) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export async function createLogTailFixture(id = testId()): Promise<LogTailFixture> {
  let orm: MikroORM;
  try {
    const { MikroORM: PgOrm } = await import('@mikro-orm/postgresql');
    orm = await PgOrm.init({ clientUrl: PG_URL, pool: { min: 0, max: 10 }, entities: [], debug: false, discovery: { warnWhenNoEntities: false } } as Options);
    await orm.em.getConnection('write').execute('SELECT 1', [], 'all');
  } catch (error) {
    throw new Error(`PostgreSQL is not reachable: ${HOW_TO_START}`, { cause: error });
  }
  const tablePrefix = `${id}_`;
  const inner = new MikroOrmOutboxStore({ orm, tablePrefix, wakeups: false });
  await inner.ensureSchema();
  const admin = new pg.Pool({ connectionString: PG_URL, max: 2 });
  const level = (await admin.query('SHOW wal_level')).rows[0] as { wal_level: string };
  if (level.wal_level !== 'logical') throw new Error(`PostgreSQL runs with wal_level = ${level.wal_level}: ${HOW_TO_START}`);
  const opened: PgLogicalOutboxStore<EntityManager>[] = [];
  const others: MikroOrmOutboxStore[] = [];
  return {
    id,
    orm,
    inner,
    tablePrefix,
    admin,
    logTail(overrides = {}) {
      const store = new PgLogicalOutboxStore<EntityManager>({
        store: new MikroOrmOutboxStore({ orm, tablePrefix, wakeups: false }),
        connection: { connectionString: PG_URL },
        slot: id,
        tables: { tablePrefix },
        ...overrides,
      });
      opened.push(store);
      return store;
    },
    polling() {
      const store = new MikroOrmOutboxStore({ orm, tablePrefix, wakeups: false });
      others.push(store);
      return store;
    },
    transaction: (work) => orm.em.fork().transactional((em) => work(em)),
    async close() {
      for (const store of opened) await store.close();
      for (const store of others) await store.close();
      // The slot is dropped once its reader's connection is gone (the server ends it a moment after).
      for (let attempt = 0; ; attempt++) {
        try {
          await dropReplicationSlot(admin, id, { publication: `${id}_pub` });
          break;
        } catch (error) {
          if (attempt >= 50) throw error;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
      await inner.close();
      await admin.end();
      await orm.close();
    },
  };
}

/** Polls `check` until it returns without throwing, for at most `timeoutMs`. */
export async function eventually<T>(check: () => T | Promise<T>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }
}
