import { CourierError, StorageError } from '@courier/core';

/** What a driver error means to a caller deciding whether to retry. */
export type DriverErrorKind = 'transient' | 'schema' | 'duplicate' | 'permanent';

// PostgreSQL SQLSTATEs a retry can cure: serialization failure, deadlock, lock timeout,
// statement timeout / cancel, and the whole connection-exception and shutdown families.
const PG_TRANSIENT = new Set(['40001', '40P01', '55P03', '57014', '57P01', '57P02', '57P03', '53300', '53400', '25P03']);
const PG_SCHEMA = new Set(['42P01', '42703', '3F000', '42883', '42704']);
// MySQL/MariaDB errnos: deadlock, lock wait timeout, too many connections, server gone /
// lost, shutdown, connection killed, statement time limits (MariaDB 1969, MySQL 3024).
const MY_TRANSIENT = new Set([1213, 1205, 1040, 2002, 2003, 2006, 2013, 1053, 1927, 1969, 3024, 1317]);
const MY_SCHEMA = new Set([1146, 1054, 1049, 1051]);
const NODE_TRANSIENT = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH', 'EAI_AGAIN', 'PROTOCOL_CONNECTION_LOST', 'ER_SOCKET_UNEXPECTED_CLOSE', 'ER_CONNECTION_TIMEOUT', 'SQLITE_BUSY', 'SQLITE_LOCKED']);

interface DriverErrorShape {
  readonly code?: unknown;
  readonly errno?: unknown;
  readonly sqlState?: unknown;
  readonly fatal?: unknown;
  readonly message?: unknown;
  readonly name?: unknown;
  readonly cause?: unknown;
}

/**
 * Classifies an error thrown by a MikroORM connection or its driver (pg, mysql2,
 * mariadb, libsql), looking through `cause` chains and MikroORM's exception wrappers.
 */
export function classifyDriverError(error: unknown): DriverErrorKind {
  const seen = new Set<unknown>();
  let current: unknown = error;
  while (current !== null && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const kind = classifyOne(current as DriverErrorShape);
    if (kind !== undefined) return kind;
    current = (current as DriverErrorShape).cause;
  }
  return 'permanent';
}

function classifyOne(e: DriverErrorShape): DriverErrorKind | undefined {
  const code = typeof e.code === 'string' ? e.code : undefined;
  const errno = typeof e.errno === 'number' ? e.errno : undefined;
  const message = typeof e.message === 'string' ? e.message : '';
  const name = typeof e.name === 'string' ? e.name : '';
  if (name === 'DeadlockException' || name === 'LockWaitTimeoutException' || name === 'ConnectionException') return 'transient';
  if (name === 'TableNotFoundException' || name === 'InvalidFieldNameException') return 'schema';
  if (name === 'UniqueConstraintViolationException') return 'duplicate';
  if (code !== undefined) {
    if (PG_TRANSIENT.has(code) || code.startsWith('08')) return 'transient';
    if (PG_SCHEMA.has(code)) return 'schema';
    if (code === '23505' || code === 'ER_DUP_ENTRY' || code.startsWith('SQLITE_CONSTRAINT_UNIQUE') || code === 'SQLITE_CONSTRAINT_PRIMARYKEY') return 'duplicate';
    if (NODE_TRANSIENT.has(code)) return 'transient';
    if (code === 'SQLITE_ERROR' && /no such (table|column)|has no column/.test(message)) return 'schema';
  }
  if (errno !== undefined) {
    if (MY_TRANSIENT.has(errno)) return 'transient';
    if (MY_SCHEMA.has(errno)) return 'schema';
    if (errno === 1062) return 'duplicate';
    // The mariadb connector numbers its own connection and pool errors 45000 and up.
    if (errno >= 45000 && errno < 46000) return 'transient';
  }
  if (e.fatal === true) return 'transient';
  if (name === 'KnexTimeoutError' || /Connection terminated|Connection lost|connection is closed|socket hang up|Timeout acquiring a connection|database is locked|Client has encountered a connection error/i.test(message)) {
    return 'transient';
  }
  return undefined;
}

/**
 * True when `error` says the transaction lost a lock conflict and was rolled back or
 * refused without waiting longer: a deadlock (MySQL errno 1213, PostgreSQL `40P01`), a
 * serialization failure (`40001`) or SQLite's `SQLITE_BUSY`. Running the whole
 * transaction again is the documented cure.
 */
export function isLockConflict(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current !== null && typeof current === 'object' && !seen.has(current); current = (current as DriverErrorShape).cause) {
    seen.add(current);
    const e = current as DriverErrorShape;
    if (e.name === 'DeadlockException' || e.errno === 1213) return true;
    if (typeof e.code === 'string' && (e.code === '40P01' || e.code === '40001' || e.code.startsWith('SQLITE_BUSY'))) return true;
  }
  return false;
}

/**
 * Turns any error from a database call into a `StorageError` (leaving Courier errors as
 * they are): retriable for connection loss, deadlocks, lock and statement timeouts and
 * serialization failures; code `SCHEMA_MISSING` with the remedy when a Courier table or
 * column is missing; code `DUPLICATE_MESSAGE_ID` for a duplicate messageId.
 */
export function toStorageError(error: unknown, operation: string, schemaHint: string): CourierError {
  if (error instanceof CourierError) return error;
  const kind = classifyDriverError(error);
  const detail = error instanceof Error ? error.message.split('\n')[0] : String(error);
  switch (kind) {
    case 'transient':
      return new StorageError(`'${operation}' failed, a retry may succeed: ${detail}`, { cause: error, retriable: true });
    case 'schema':
      return new StorageError(`'${operation}' failed: the courier schema is missing or outdated (${detail}); ${schemaHint}`, {
        cause: error,
        code: 'SCHEMA_MISSING',
        retriable: false,
      });
    case 'duplicate':
      return new StorageError(`'${operation}' failed: a duplicate key (${detail})`, { cause: error, code: 'DUPLICATE_MESSAGE_ID', retriable: false });
    default:
      return new StorageError(`'${operation}' failed: ${detail}`, { cause: error, retriable: false });
  }
}
