import {
  classifyDriverError,
  toDriverStatement,
  type DialectName,
  type DriverErrorKind,
  type RunResult,
  type SqlExecutor,
  type SqlRow,
  type TransactionOptions,
} from '@courier/sql-engine';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';

interface PgClient {
  query(text: string, values: unknown[]): Promise<{ rows: SqlRow[]; rowCount: number | null }>;
}

/**
 * The engine's {@link SqlExecutor} on TypeORM. A statement given a transaction runs on that
 * `EntityManager`'s `QueryRunner` (its connection, inside its transaction); given none, on a
 * `QueryRunner` of its own, released after. PostgreSQL statements go to the runner's
 * node-postgres connection (`queryRunner.connect()`), because TypeORM's structured result
 * reports no row count for an INSERT, which the engine reads; MySQL/MariaDB statements go
 * through `queryRunner.query(…, true)` (affected rows and insert id from mysql2). Values are
 * always bound, never interpolated.
 *
 * Guarantees: the engine's port contract (see `SqlExecutor`). Own transactions use
 * `dataSource.transaction()` (READ COMMITTED on MySQL/MariaDB when asked).
 */
export class TypeOrmExecutor implements SqlExecutor<EntityManager> {
  readonly #dataSource: DataSource;
  readonly #dialect: DialectName;

  constructor(dataSource: DataSource, dialect: DialectName) {
    this.#dataSource = dataSource;
    this.#dialect = dialect;
  }

  /** Rows of a query. */
  async all(sql: string, params: readonly unknown[] = [], tx?: EntityManager): Promise<SqlRow[]> {
    return (await this.#execute(sql, params, tx)).rows;
  }

  /** Affected row count (and insert id) of a statement. */
  async run(sql: string, params: readonly unknown[] = [], tx?: EntityManager): Promise<RunResult> {
    const { affectedRows, insertId } = await this.#execute(sql, params, tx);
    return { affectedRows, insertId };
  }

  /** Runs `work` in a TypeORM transaction of its own: committed when it resolves, rolled back when it throws. */
  transaction<T>(work: (tx: EntityManager) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    return options.readCommitted && this.#dialect === 'mysql' ? this.#dataSource.transaction('READ COMMITTED', work) : this.#dataSource.transaction(work);
  }

  /** Runs a statement outside any transaction. */
  async untransacted(sql: string): Promise<SqlRow[]> {
    return this.all(sql, []);
  }

  /** PostgreSQL and MySQL/MariaDB have no prologue. */
  async prologue(): Promise<void> {}

  /** pg and mysql2 errors reach the engine inside TypeORM's `QueryFailedError.driverError`/`cause`, which {@link classifyDriverError} follows. */
  classifyError(error: unknown): DriverErrorKind {
    const driverError = (error as { driverError?: unknown } | null)?.driverError;
    return classifyDriverError(driverError ?? error);
  }

  async #execute(sql: string, params: readonly unknown[], tx: EntityManager | undefined): Promise<{ rows: SqlRow[]; affectedRows: number; insertId: unknown }> {
    const statement = toDriverStatement(sql, params, this.#dialect === 'postgresql' ? 'numbered' : 'question');
    const own = tx?.queryRunner === undefined;
    const runner: QueryRunner = tx?.queryRunner ?? this.#dataSource.createQueryRunner();
    try {
      if (this.#dialect === 'postgresql') {
        const client = (await runner.connect()) as PgClient;
        const result = await client.query(statement.sql, [...statement.parameters]);
        const rows = Array.isArray(result.rows) ? result.rows : [];
        return { rows, affectedRows: result.rowCount ?? rows.length, insertId: undefined };
      }
      const result = await runner.query(statement.sql, [...statement.parameters], true);
      const raw = result.raw as { affectedRows?: number; insertId?: unknown } | unknown[];
      const rows = (Array.isArray(result.records) ? result.records : []) as SqlRow[];
      if (Array.isArray(raw)) return { rows, affectedRows: result.affected ?? rows.length, insertId: undefined };
      return { rows, affectedRows: result.affected ?? raw?.affectedRows ?? 0, insertId: raw?.insertId };
    } finally {
      if (own) await runner.release();
    }
  }
}
