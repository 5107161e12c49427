import type { DialectName } from '@courier/sql-engine';

// Prisma error codes a retry can cure: database unreachable (P1001), timed out (P1002, P1008),
// server closed the connection (P1017), no pool connection in time (P2024), a transaction
// that expired or was closed under load (P2028), a write conflict or deadlock (P2034).
const PRISMA_TRANSIENT = new Set(['P1001', 'P1002', 'P1008', 'P1017', 'P2024', 'P2028', 'P2034']);
// Driver adapter error kinds (`DriverAdapterError.cause.kind`) that carry no database code
// and mean the connection, not the statement, failed.
const TRANSIENT_KINDS = new Set(['DatabaseNotReachable', 'ConnectionClosed', 'SocketTimeout', 'TooManyConnections', 'TransactionAlreadyClosed', 'TransactionWriteConflict', 'TlsConnectionError']);

/**
 * A database error raised through Prisma, restated in the shape of the driver's own error
 * (PostgreSQL SQLSTATE in `code`, MySQL/MariaDB error number in `errno`, SQLite's code in
 * `code`) so the engine classifies it as it does every driver's: Prisma wraps them in
 * `PrismaClientKnownRequestError` (`P2010`, the code only in `meta.driverAdapterError`).
 * The Prisma error is the `cause`.
 */
export class PrismaDriverError extends Error {
  override readonly name = 'PrismaDriverError';
  readonly code: string | undefined;
  readonly errno: number | undefined;
  /** Set for connection-level failures: the engine's classification treats it as transient. */
  readonly fatal: boolean;

  constructor(message: string, fields: { code?: string | undefined; errno?: number | undefined; fatal: boolean }, cause: unknown) {
    super(message, { cause });
    this.code = fields.code;
    this.errno = fields.errno;
    this.fatal = fields.fatal;
  }
}

interface PrismaErrorShape {
  readonly code?: unknown;
  readonly message?: unknown;
  readonly meta?: { readonly driverAdapterError?: { readonly cause?: { readonly originalCode?: unknown; readonly originalMessage?: unknown; readonly kind?: unknown } } };
}

/**
 * Restates a Prisma error as a {@link PrismaDriverError} (see there); anything else — a
 * driver's own error, the application's — is returned unchanged.
 */
export function toDriverError(error: unknown, dialect: DialectName): unknown {
  if (error === null || typeof error !== 'object' || error instanceof PrismaDriverError) return error;
  const shape = error as PrismaErrorShape;
  const prismaCode = typeof shape.code === 'string' && /^P\d{4}$/.test(shape.code) ? shape.code : undefined;
  const cause = shape.meta?.driverAdapterError?.cause;
  if (prismaCode === undefined && cause === undefined) return error;
  const original = cause?.originalCode === undefined || cause.originalCode === null ? undefined : String(cause.originalCode);
  const kind = typeof cause?.kind === 'string' ? cause.kind : undefined;
  const message = typeof cause?.originalMessage === 'string' ? cause.originalMessage : typeof shape.message === 'string' ? shape.message.trim() : String(error);
  let code: string | undefined;
  let errno: number | undefined;
  if (original !== undefined) {
    if (dialect === 'mysql' && /^\d+$/.test(original)) errno = Number(original);
    else code = original;
  } else if (kind === 'TransactionWriteConflict') {
    code = '40001';
  }
  const fatal = (original === undefined && kind !== undefined && TRANSIENT_KINDS.has(kind)) || (original === undefined && prismaCode !== undefined && PRISMA_TRANSIENT.has(prismaCode));
  return new PrismaDriverError(message, { code, errno, fatal }, error);
}

/** True when `error` is Prisma's refusal of a query on an interactive transaction that has ended (`P2028`, "Transaction already closed"). */
export function isEndedTransaction(error: unknown): boolean {
  const seen = new Set<unknown>();
  for (let current: unknown = error; current !== null && typeof current === 'object' && !seen.has(current); current = (current as { cause?: unknown }).cause) {
    seen.add(current);
    const shape = current as { code?: unknown; message?: unknown };
    if (shape.code === 'P2028' && typeof shape.message === 'string' && /Transaction already closed/i.test(shape.message)) return true;
  }
  return false;
}
