// @courier/kysely: Courier's outbox and inbox on Kysely (PostgreSQL, MySQL/MariaDB, SQLite),
// an adapter of @courier/sql-engine: the engine holds the SQL, this package says how to run
// it on a Kysely instance and how to join the application's `Transaction`.
export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind } from '@courier/sql-engine';
export { classifyDriverError, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export { KyselyExecutor } from './kysely-executor.js';
export type { KyselyStoreConfig } from './kysely-store-core.js';
export { detectKyselyDialect, KyselyStoreCore } from './kysely-store-core.js';
export type { KyselyInboxStoreConfig } from './kysely-inbox-store.js';
export { KyselyInboxStore } from './kysely-inbox-store.js';
export type { KyselyOutboxStoreConfig } from './kysely-outbox-store.js';
export { KyselyOutboxStore } from './kysely-outbox-store.js';
export { MAX_PREPARED_STATEMENTS, preparingCourierStatements } from './prepared-statements.js';
