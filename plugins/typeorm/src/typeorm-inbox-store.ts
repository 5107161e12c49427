import { SqlInboxStore } from '@courier/sql-engine';
import type { EntityManager } from 'typeorm';
import { TypeOrmStoreCore, type TypeOrmStoreConfig } from './typeorm-store-core.js';

/** Arguments of {@link TypeOrmInboxStore}. */
export type TypeOrmInboxStoreConfig = TypeOrmStoreConfig;

/**
 * The idempotent inbox on TypeORM (PostgreSQL, MySQL/MariaDB): the engine's `SqlInboxStore`,
 * running each handler in `dataSource.transaction(async (manager) => …)` so `ctx.tx` is that
 * `EntityManager`.
 *
 * Guarantees (the `InboxStore` contract, checked by the conformance suite): the
 * (messageId, consumer) record is inserted first, then `work` runs with the manager; what it
 * wrote commits together with the record, or nothing does. A pair recorded by a committed run
 * is reported as `{ duplicate: true }` without running `work`. If `work` throws, its error
 * propagates unchanged and the transaction rolls back.
 */
export class TypeOrmInboxStore extends SqlInboxStore<EntityManager, EntityManager> {
  constructor(config: TypeOrmInboxStoreConfig) {
    const core = new TypeOrmStoreCore(config, 'TypeOrmInboxStore');
    super({ core, transactions: { run: (work) => core.runner.transaction((manager) => work(manager, manager)) } });
  }
}
