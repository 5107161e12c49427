import { ConfigError } from '@courier/core';
import { SqlOutboxStore, type OutboxPendingRow, type OutboxWriter, type SqlOutboxStoreOptions } from '@courier/sql-engine';
import type { EntityManager } from 'typeorm';
import { TypeOrmStoreCore, type TypeOrmStoreConfig } from './typeorm-store-core.js';

/** Arguments of {@link TypeOrmOutboxStore}. */
export interface TypeOrmOutboxStoreConfig extends TypeOrmStoreConfig, SqlOutboxStoreOptions {}

/**
 * The outbox on TypeORM (PostgreSQL, MySQL/MariaDB): the engine's `SqlOutboxStore` joined to
 * the application's transaction through its `EntityManager`.
 *
 * Guarantees (the `OutboxStore` contract, checked by the conformance suite):
 * - `append(manager, …)` (what `bus.outbox(manager).publish()` calls) writes the rows at once
 *   on that manager's `QueryRunner`, inside its open transaction, and returns a promise that
 *   settles when they are written: await it inside `dataSource.transaction(async (manager) => …)`
 *   (or between `queryRunner.startTransaction()` and `commitTransaction()`, passing
 *   `queryRunner.manager`). The rows commit with the transaction or not at all.
 * - A manager with no transaction open (`dataSource.manager`, a released or committed runner)
 *   is refused with a `ConfigError` naming the fix before anything is written: never a
 *   silent autocommit (`UNIT_OF_WORK_REQUIRED`, or `UNIT_OF_WORK_ENDED` once its runner was
 *   released).
 * - Claims, leases, fencing, completion and the operator half are the engine's. PostgreSQL
 *   NOTIFY/LISTEN are not used: relays in other processes poll.
 */
export class TypeOrmOutboxStore extends SqlOutboxStore<EntityManager, EntityManager, EntityManager, Promise<void>> {
  constructor(config: TypeOrmOutboxStoreConfig) {
    const core = new TypeOrmStoreCore(config, 'TypeOrmOutboxStore');
    super({
      ...config,
      wakeups: core.dialect.name === 'postgresql' ? { listen: false, notify: false } : config.wakeups,
      core,
      join: (writer) => typeOrmJoin(writer),
    });
  }
}

function typeOrmJoin(writer: OutboxWriter<EntityManager>) {
  return {
    asyncAppend: true as const,
    resolve(unit: EntityManager): EntityManager {
      const isManager = unit !== null && typeof unit === 'object' && typeof (unit as { query?: unknown }).query === 'function' && 'connection' in unit;
      if (!isManager) {
        throw new ConfigError(`'publish' needs a TypeORM EntityManager inside a transaction (the 'manager' of dataSource.transaction(async (manager) => …)), got ${describe(unit)}`, {
          code: 'UNIT_OF_WORK_REQUIRED',
        });
      }
      const runner = unit.queryRunner;
      if (runner?.isReleased === true) {
        throw new ConfigError(`'publish' got an EntityManager whose transaction has ended (its QueryRunner was released): publish inside the transaction callback, before it returns`, {
          code: 'UNIT_OF_WORK_ENDED',
        });
      }
      if (runner === undefined || !runner.isTransactionActive) {
        throw new ConfigError(
          `'publish' got an EntityManager with no transaction open (it would autocommit): publish inside dataSource.transaction(async (manager) => { …; await bus.outbox(manager).publish(…) }), or pass queryRunner.manager after queryRunner.startTransaction()`,
          { code: 'UNIT_OF_WORK_REQUIRED' },
        );
      }
      return unit;
    },
    async add(manager: EntityManager, rows: OutboxPendingRow[]): Promise<void> {
      await writer.write(rows, manager);
      writer.committed();
    },
  };
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'an object';
}
