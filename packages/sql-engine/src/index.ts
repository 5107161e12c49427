// @courier/sql-engine: Courier's outbox/inbox SQL for PostgreSQL, MariaDB/MySQL and SQLite,
// independent of the driver. An adapter (the MikroORM plugin, …) implements `SqlExecutor`
// for its driver; everything here runs on that port.
export type { RunResult, SqlExecutor, SqlRow, TransactionOptions, TransactionPrologue } from './executor.js';
export { classifyError, toBigInt, toNullableString, toNumber } from './executor.js';
export type { DriverErrorKind } from './storage-errors.js';
export { classifyDriverError, driverMessage, isLockConflict, toStorageError } from './storage-errors.js';
export type { CourierTableNames, CourierTablesConfig } from './courier-tables.js';
export { resolveTableNames } from './courier-tables.js';
export type { FollowerClaim } from './claim-followers.js';
export { claimFollowers, contiguousRuns } from './claim-followers.js';
export type { ListenHandle, ListenHandlers, ListenSource, PgListenClient, PostgresWakeupConfig } from './outbox-wakeups.js';
export { OutboxWakeups, pgClientListenSource } from './outbox-wakeups.js';
export { createDialect } from './dialects/create-dialect.js';
export type { HaltSql } from './dialects/inbox-halts-sql.js';
export { haltId, haltSql } from './dialects/inbox-halts-sql.js';
export { KEY_LOCK_BUCKETS, MySqlDialect, NOT_PUBLISHED_AT } from './dialects/mysql-dialect.js';
export { PostgresDialect } from './dialects/postgres-dialect.js';
export { SQLITE_BUSY_TIMEOUT_MS, SqliteDialect } from './dialects/sqlite-dialect.js';
export type { ClaimQuery, ClaimResult, CompletedRows, CompletionQuery, CourierObject, DialectContext, DialectName, PublishedRows, SqlDialect } from './dialects/sql-dialect.js';
export { ageSql, completeRows, completeSql, failureColumnsSql, headsSql, qualifiedColumns, ROW_COLUMNS, SCHEMA_VERSION, upgradeSql } from './dialects/sql-dialect.js';
export type { SqlStoreCoreConfig } from './sql-store-core.js';
export { pruneInBatches, SqlStoreCore, throwIfAborted } from './sql-store-core.js';
export type { InsertGuard, OutboxJoin, OutboxPendingRow, OutboxWriter, SqlOutboxStoreConfig, SqlOutboxStoreOptions } from './sql-outbox-store.js';
export { keyHash, SqlOutboxStore } from './sql-outbox-store.js';
export type { InboxTransactions, SqlInboxStoreConfig } from './sql-inbox-store.js';
export { SqlInboxStore } from './sql-inbox-store.js';
export type { SqlSchemaAdmin } from './schema-admin.js';
export { sqlSchemaAdmin } from './schema-admin.js';
export type { DriverStatement, PlaceholderStyle } from './positional-sql.js';
export { toDriverStatement } from './positional-sql.js';
