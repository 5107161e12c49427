// @courier/mysql2: Courier's outbox and inbox on mysql2's promise API (MariaDB/MySQL), the
// engine's SQL on the application's own PoolConnection and transaction.
export type { CourierTableNames, CourierTablesConfig } from '@courier/sql-engine';
export { Mysql2Executor, inTransaction } from './mysql2-executor.js';
export type { Mysql2InboxStoreConfig, Mysql2OutboxStoreConfig, Mysql2StoreConfig } from './mysql2-stores.js';
export { Mysql2InboxStore, Mysql2OutboxStore } from './mysql2-stores.js';
export { settleAppends, withTransaction } from './transactions.js';
