export type { SqlTransportConfig, SqlTransportOrm, SqlTransportPruneOptions } from './sql-transport.js';
export { SqlTransport } from './sql-transport.js';
export type { QueueTableNames } from './queue-dialect.js';
export { resolveQueueNames } from './queue-dialect.js';
