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
// Values the database cannot store, which no retry cures (issue 29): PostgreSQL 22021 (invalid
// byte sequence, U+0000 bound as a parameter), 22P05 (untranslatable character), 22001 (value
// too long for its column), 54000 (program limit: an index row too large); MySQL/MariaDB 1406
// (data too long), 1366 (incorrect string value), 1300 (invalid character string), 1153 / 1301
// (packet / result larger than max_allowed_packet); SQLite's SQLITE_TOOBIG.
const PG_UNSTORABLE = new Set(['22021', '22P05', '22001', '54000']);
const MY_UNSTORABLE = new Set([1406, 1366, 1300, 1153, 1301]);
const NODE_TRANSIENT = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'ENOTFOUND', 'EHOSTUNREACH', 'EAI_AGAIN', 'PROTOCOL_CONNECTION_LOST', 'ER_SOCKET_UNEXPECTED_CLOSE', 'ER_CONNECTION_TIMEOUT', 'SQLITE_BUSY', 'SQLITE_LOCKED']);

interface DriverErrorShape {
  readonly code?: unknown;
  readonly errno?: unknown;
  readonly sqlState?: unknown;
  readonly fatal?: unknown;
  readonly message?: unknown;
  readonly name?: unknown;
  readonly cause?: unknown;
  readonly sqlMessage?: unknown;
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
  // First, before the connection-exception family and MikroORM's wrappers: PostgreSQL answers
  // a statement whose text holds U+0000 (MikroORM inlines bound values) with 08P01 "invalid
  // message format", which is no connection problem — the same statement fails every time.
  if (code !== undefined && (PG_UNSTORABLE.has(code) || code.startsWith('SQLITE_TOOBIG') || (code === '08P01' && /invalid message format/.test(message)))) return 'permanent';
  if (errno !== undefined && MY_UNSTORABLE.has(errno)) return 'permanent';
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

// How a statement starts; knex (under MikroORM 6) writes `<statement, bound values inlined> -
// <driver message>` into the driver error's message.
const STATEMENT_START = /^\s*(\(|select|insert|update|delete|with|create|alter|drop|begin|start|commit|rollback|set|pragma|lock|savepoint|release|truncate|show|explain|values|replace|call|do)\b/i;

/**
 * The driver's own message of a database error, without the statement: the first line of the
 * server's text (mysql2 and mariadb keep it as `sqlMessage`; otherwise what follows the
 * statement knex put in front of it). Error messages built from it name the operation and
 * this, never the bound values (message bodies, keys) that reach logs and `/health`; the
 * statement stays in the error's `cause` for debugging.
 */
export function driverMessage(error: unknown): string {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current !== null && typeof current === 'object' && !seen.has(current); current = (current as DriverErrorShape).cause) {
    seen.add(current);
    const sqlMessage = (current as DriverErrorShape).sqlMessage;
    if (typeof sqlMessage === 'string' && sqlMessage.length > 0) return firstLine(sqlMessage);
  }
  const message = error instanceof Error ? error.message : String(error);
  if (!STATEMENT_START.test(message)) return firstLine(message);
  const at = message.lastIndexOf(' - ');
  return at < 0 ? 'the statement failed (driver message not found; see the cause)' : firstLine(message.slice(at + 3));
}

function firstLine(text: string): string {
  const end = text.indexOf('\n');
  return end < 0 ? text : text.slice(0, end);
}

/**
 * Turns any error from a database call into a `StorageError` (leaving Courier errors as
 * they are): retriable for connection loss, deadlocks, lock and statement timeouts and
 * serialization failures; code `SCHEMA_MISSING` with the remedy when a Courier table or
 * column is missing; code `DUPLICATE_MESSAGE_ID` for a duplicate messageId; never retriable
 * for a value the database cannot store (U+0000 in PostgreSQL text, data too long). The
 * message names `operation` and the driver's message ({@link driverMessage}), never the
 * statement or its bound values; `cause` keeps the driver's error.
 */
export function toStorageError(error: unknown, operation: string, schemaHint: string): CourierError {
  if (error instanceof CourierError) return error;
  const kind = classifyDriverError(error);
  const detail = driverMessage(error);
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
