// @courier/sqlite: Courier's outbox and inbox on SQLite drivers (better-sqlite3, @libsql/client),
// adapters of @courier/sql-engine: the engine holds the SQL, this package says how to run it
// on the application's connection and how to join its transaction.
export type { CourierTableNames, CourierTablesConfig } from '@courier/sql-engine';
export type { BetterSqlite3InboxStoreConfig, BetterSqlite3OutboxStoreConfig, BetterSqlite3StoreConfig, BetterSqlite3Tx, Database } from './better-sqlite3.js';
export { BetterSqlite3Executor, BetterSqlite3InboxStore, BetterSqlite3OutboxStore, withTransaction } from './better-sqlite3.js';
export { WRITE_LOCK_WAIT_MS } from './write-gate.js';
export type { LibsqlInboxStoreConfig, LibsqlOutboxStoreConfig, LibsqlStoreConfig } from './libsql.js';
export { LibsqlExecutor, LibsqlInboxStore, LibsqlOutboxStore, withTransaction as withLibsqlTransaction } from './libsql.js';
