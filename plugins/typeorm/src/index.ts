// @courier/typeorm: Courier's outbox and inbox on TypeORM (PostgreSQL, MySQL/MariaDB), an
// adapter of @courier/sql-engine: the engine holds the SQL, this package runs it on a
// DataSource and joins the application's transaction through its EntityManager.
export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind } from '@courier/sql-engine';
export { classifyDriverError, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export { TypeOrmExecutor } from './typeorm-executor.js';
export type { TypeOrmStoreConfig } from './typeorm-store-core.js';
export { detectTypeOrmDialect, TypeOrmStoreCore } from './typeorm-store-core.js';
export type { TypeOrmInboxStoreConfig } from './typeorm-inbox-store.js';
export { TypeOrmInboxStore } from './typeorm-inbox-store.js';
export type { TypeOrmOutboxStoreConfig } from './typeorm-outbox-store.js';
export { TypeOrmOutboxStore } from './typeorm-outbox-store.js';
