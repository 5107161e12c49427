// @courier/drizzle: Courier's outbox and inbox on Drizzle ORM (node-postgres, mysql2),
// an adapter of @courier/sql-engine: the engine holds the SQL, this package says how to run
// it on a Drizzle database and how to join the application's transaction.
export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind } from '@courier/sql-engine';
export { classifyDriverError, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export type { DrizzleRunner } from './drizzle-executor.js';
export { DrizzleExecutor } from './drizzle-executor.js';
export type { DrizzleStoreConfig, DrizzleTransactionOf } from './drizzle-store-core.js';
export { detectDrizzleDialect, DrizzleStoreCore, isDrizzleTransaction } from './drizzle-store-core.js';
export type { DrizzleInboxStoreConfig } from './drizzle-inbox-store.js';
export { DrizzleInboxStore } from './drizzle-inbox-store.js';
export type { DrizzleOutboxStoreConfig } from './drizzle-outbox-store.js';
export { DrizzleOutboxStore } from './drizzle-outbox-store.js';
export { courierPgTables } from './pg-tables.js';
