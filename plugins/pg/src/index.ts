// @courier/pg: Courier's outbox and inbox on node-postgres (pg 8), on the SQL engine.
export type { PgOutboxStoreConfig } from './pg-outbox-store.js';
export { PgOutboxStore } from './pg-outbox-store.js';
export type { PgInboxStoreConfig } from './pg-inbox-store.js';
export { PgInboxStore } from './pg-inbox-store.js';
export type { PgStoreConfig } from './pg-store-core.js';
export { PgExecutor } from './pg-executor.js';
export { withTransaction } from './with-transaction.js';
