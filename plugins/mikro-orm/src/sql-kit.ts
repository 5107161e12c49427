// `@courier/mikro-orm/sql-kit`: the dialect plumbing of the stores, for other Courier
// packages that keep tables of their own next to the outbox (the SQL transport). Not part
// of the stores' API: it may change with any release of this package, so depend on it with
// the same version range as the stores.
export type { RunResult, SqlRow, TransactionPrologue } from './sql-runner.js';
export { READ_COMMITTED, SqlRunner, toBigInt, toNullableString, toNumber } from './sql-runner.js';
export type { DialectName, DriverErrorKind, PostgresWakeupConfig } from '@courier/sql-engine';
export { classifyDriverError, driverMessage, isLockConflict, OutboxWakeups, toStorageError } from '@courier/sql-engine';
export { detectDialect } from './detect-dialect.js';
export { knexListenSource } from './knex-listen-source.js';
