// @courier/pg-logical: Courier's log-tailing relay for PostgreSQL — an outbox store whose
// claims come from a logical replication slot, and the slot's lifecycle for operators.
export type { PgLogicalOutboxStoreConfig } from './pg-logical-outbox-store.js';
export { PgLogicalOutboxStore } from './pg-logical-outbox-store.js';
export type { PgQueryable, ReplicationSlotStats } from './replication-slot.js';
export { dropReplicationSlot, ensureReplicationSlot, readSlotStats } from './replication-slot.js';
