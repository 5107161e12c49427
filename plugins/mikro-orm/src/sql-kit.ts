// `@courier/mikro-orm/sql-kit`: the dialect plumbing of the stores, for other Courier
// packages that keep tables of their own next to the outbox (the SQL transport). Not part
// of the stores' API: it may change with any release of this package, so depend on it with
// the same version range as the stores.
export type { RunResult, SqlRow, TransactionPrologue } from './sql-runner.js';
export { READ_COMMITTED, SqlRunner, toBigInt, toNullableString, toNumber } from './sql-runner.js';
export type { DriverErrorKind } from './storage-errors.js';
export { classifyDriverError, driverMessage, isLockConflict, toStorageError } from './storage-errors.js';
export { detectDialect } from './dialects/create-dialect.js';
export type { DialectName } from './dialects/sql-dialect.js';
export type { PostgresWakeupConfig } from './outbox-wakeups.js';
export { OutboxWakeups } from './outbox-wakeups.js';
