// @courier/knex: Courier's outbox and inbox on Knex 3 (PostgreSQL, MySQL/MariaDB, SQLite), an
// adapter of @courier/sql-engine: the engine holds the SQL, this package says how to run it
// on a Knex instance and how to join the application's `Knex.Transaction`.
export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind } from '@courier/sql-engine';
export { classifyDriverError, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export { KnexExecutor } from './knex-executor.js';
export type { KnexStoreConfig } from './knex-store-core.js';
export { detectKnexDialect, isKnexTransaction, KnexStoreCore } from './knex-store-core.js';
export type { KnexInboxStoreConfig } from './knex-inbox-store.js';
export { KnexInboxStore } from './knex-inbox-store.js';
export type { KnexOutboxStoreConfig } from './knex-outbox-store.js';
export { KnexOutboxStore } from './knex-outbox-store.js';
