export type { RedisInboxStoreConfig, RedisInboxUnit, RedisInboxUnitOfWork } from './redis-inbox-store.js';
export { RedisInboxStore } from './redis-inbox-store.js';
export type { RedisInboxClient } from './redis-scripts.js';
