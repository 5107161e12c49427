// A MikroORM store fixture on the same database as the queue (the bus suite's partner):
// outbox and inbox tables prefixed `<testId>_` next to the queue tables, and an effects
// table written in the handler's unit of work. On SQLite it shares the transport's ORM of
// this process (see `sharedSqliteOrm`).
import type { FixtureContext, StoreFixture } from '@courier/conformance';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { EntitySchema, type EntityManager } from '@mikro-orm/core';
import { openOrm, sharedSqliteOrm, type QueueDialectName } from './fixture.js';
import { locateInStore } from './locate.js';

/** A `StoreFixtureFactory<EntityManager>` over `dialect`. */
export function createStoreFixture(dialect: QueueDialectName) {
  return async ({ testId }: FixtureContext): Promise<StoreFixture<EntityManager>> => {
    if (!/^[A-Za-z0-9_]+$/.test(testId)) throw new Error(`testId ${JSON.stringify(testId)} is not safe in table names`);
    const effectsTable = `${testId}_effects`;
    // A class per fixture: MikroORM keeps metadata on the class.
    class Effect {
      seq?: number;
      effectId!: string;
    }
    const schema = new EntitySchema<Effect>({
      class: Effect,
      tableName: effectsTable,
      properties: {
        seq: { type: 'number', primary: true, autoincrement: true },
        effectId: { type: 'string', fieldName: 'effect_id' },
      },
    });
    const shared = dialect === 'sqlite' ? await sharedSqliteOrm(testId) : undefined;
    const orm = shared ? shared.orm : await openOrm(dialect, testId);
    // The ORM was opened without this entity (the SQLite one is shared with the transport).
    orm.discoverEntity(schema);
    const release = shared ? () => shared.release() : () => orm.close(true);
    const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
    const connection = orm.em.getConnection('write');
    try {
      const effectsDdl =
        dialect === 'postgresql'
          ? `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq bigserial PRIMARY KEY, effect_id varchar(200) NOT NULL)`
          : dialect === 'sqlite'
            ? `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL)`
            : `CREATE TABLE IF NOT EXISTS ${quote(effectsTable)} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, effect_id VARCHAR(200) NOT NULL) ENGINE=InnoDB`;
      await connection.execute(effectsDdl, [], 'run');
      const tablePrefix = `${testId}_`;
      const outbox = new MikroOrmOutboxStore({ orm, tablePrefix });
      const inbox = new MikroOrmInboxStore({ orm, tablePrefix });
      await outbox.ensureSchema();
      return {
        outbox,
        inbox,
        transaction: <T>(work: (tx: EntityManager) => Promise<T>) => orm.em.fork().transactional((em) => work(em)),
        transactionHeldBeforeCommit: <T>(work: (tx: EntityManager) => Promise<T>, beforeCommit: () => Promise<void>) =>
          orm.em.fork().transactional((em) => {
            em.getEventManager().registerSubscriber({ beforeTransactionCommit: () => beforeCommit() });
            return work(em);
          }),
        reusableUnitOfWork: {
          async begin() {
            const em = orm.em.fork();
            await em.begin();
            return em;
          },
          async rollback(em: EntityManager) {
            await em.rollback();
            await em.begin();
            return em;
          },
          commit: (em: EntityManager) => em.commit(),
        },
        async recordEffect(tx: EntityManager, id: string) {
          tx.persist(tx.create(Effect, { effectId: id }));
          await tx.flush();
        },
        async readEffects() {
          const rows = (await connection.execute(`SELECT effect_id FROM ${quote(effectsTable)} ORDER BY seq`, [], 'all')) as Record<string, unknown>[];
          return rows.map((row) => String(row['effect_id']));
        },
        locate: (ids: readonly string[]) => locateInStore(orm, dialect, testId, ids),
        async close() {
          await outbox.close();
          await inbox.close();
          await release();
        },
      };
    } catch (error) {
      await release().catch(() => undefined);
      throw error;
    }
  };
}
