import type { Connection, IsolationLevel, Transaction } from '@mikro-orm/core';

/**
 * `IsolationLevel.READ_COMMITTED`, spelled out: a value import of `@mikro-orm/core` would
 * make Node's ESM loader lex the whole CommonJS package (hundreds of ms at start-up) even
 * when the application loaded MikroORM with `require`. Type-only imports cost nothing.
 */
export const READ_COMMITTED = 'read committed' as IsolationLevel;

/** A row as the driver returns it. */
export type SqlRow = Readonly<Record<string, unknown>>;

/** The outcome of a statement that returns no rows. */
export interface RunResult {
  readonly affectedRows: number;
  readonly insertId: unknown;
}

/**
 * Runs Courier's hand-written SQL on a MikroORM connection, optionally inside a driver
 * transaction. Statements go through `Connection.execute`, so they appear in MikroORM's
 * query log like the ORM's own; values are bound with `?` placeholders and quoted by the
 * platform (MikroORM inlines them with the driver's own escaping).
 */
export class SqlRunner {
  readonly #connection: Connection;

  constructor(connection: Connection) {
    this.#connection = connection;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], trx?: Transaction): Promise<SqlRow[]> {
    const result: unknown = await this.#connection.execute(sql, [...params], 'all', trx);
    return Array.isArray(result) ? (result as SqlRow[]) : [];
  }

  /** Affected row count of a statement. */
  async run(sql: string, params: readonly unknown[] = [], trx?: Transaction): Promise<RunResult> {
    const result = (await this.#connection.execute(sql, [...params], 'run', trx)) as { affectedRows?: unknown; insertId?: unknown } | undefined;
    return { affectedRows: Number(result?.affectedRows ?? 0), insertId: result?.insertId };
  }

  /**
   * Runs `work` in a transaction of its own (committed when it resolves, rolled back when
   * it throws). `readCommitted` asks for READ COMMITTED where the database's default is
   * stricter (MySQL/MariaDB), so that store transactions take no gap locks producers
   * could queue behind.
   */
  transaction<T>(work: (trx: Transaction) => Promise<T>, options: { readCommitted?: boolean } = {}): Promise<T> {
    return this.#connection.transactional(work, options.readCommitted ? { isolationLevel: READ_COMMITTED } : {});
  }
}

/** Reads a column that may come back as number, bigint or string (drivers differ). */
export function toBigInt(value: unknown): bigint {
  if (typeof value === 'bigint') return value;
  if (typeof value === 'number') return BigInt(Math.trunc(value));
  if (typeof value === 'string' && value.length > 0) return BigInt(value);
  throw new TypeError(`expected an integer column value, got ${typeof value}`);
}

/** Reads a numeric column that may come back as number, bigint or string. */
export function toNumber(value: unknown): number {
  if (value === null || value === undefined) return 0;
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  if (typeof value === 'string') return Number(value);
  return Number(value);
}

/** Reads a nullable string column. */
export function toNullableString(value: unknown): string | null {
  if (value === null || value === undefined) return null;
  if (typeof value === 'string') return value;
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  return String(value);
}
