export type { CourierTableNames, CourierTablesConfig, DialectName, DriverErrorKind, PostgresWakeupConfig } from '@courier/sql-engine';
export { classifyDriverError, KEY_LOCK_BUCKETS, keyHash, resolveTableNames, SCHEMA_VERSION } from '@courier/sql-engine';
export type { MikroOrmInstance, MikroOrmStoreConfig } from './store-core.js';
export type { MikroOrmOutboxStoreConfig } from './mikro-orm-outbox-store.js';
export { MikroOrmOutboxStore } from './mikro-orm-outbox-store.js';
export type { MikroOrmInboxStoreConfig } from './mikro-orm-inbox-store.js';
export { MikroOrmInboxStore } from './mikro-orm-inbox-store.js';
export type { SqliteBusyTimeoutDriverOptions } from './sqlite-options.js';
export { SQLITE_BUSY_TIMEOUT_MS, withSqliteBusyTimeout } from './sqlite-options.js';
