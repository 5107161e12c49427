import { createHash } from 'node:crypto';
import { classifyDriverError, type DriverErrorKind, type RunResult, type SqlExecutor, type SqlRow, type TransactionOptions } from '@courier/sql-engine';
import type { Pool, PoolClient, QueryConfig, QueryResult } from 'pg';

/** Most statement texts given a prepared-statement name; later ones run unnamed (each connection keeps every statement it prepared). */
const MAX_NAMED_STATEMENTS = 256;

/** One engine statement turned into node-postgres text: `$n` placeholders, with the name it is prepared under. */
interface Translated {
  readonly text: string;
  /** Position in the engine's parameters of each `$n` (an array parameter expanded into a list takes several). */
  readonly shape: readonly ParamUse[];
  readonly name: string | undefined;
}

/** How one engine parameter is bound: as it is, or (an array that must become a list) one placeholder per element. */
interface ParamUse {
  readonly index: number;
  readonly spread: boolean;
}

/**
 * The node-postgres implementation of the engine's {@link SqlExecutor}: runs Courier's SQL
 * on a `pg` `Pool`, or on the `PoolClient` of a transaction.
 *
 * - The engine's `?` placeholders become `$1…$n`. An array parameter becomes one array
 *   parameter where the SQL allows it (`IN (?)` → `= ANY($n)`, `ARRAY[?]` → `$n`), so the
 *   statement text does not depend on how many values it carries; elsewhere it is expanded.
 * - With `preparedStatements` (the default), statements run as named prepared statements:
 *   PostgreSQL parses and plans each once per connection instead of on every call (the
 *   append, claim and complete statements of the hot path). At most
 *   {@link MAX_NAMED_STATEMENTS} texts are named; turn it off behind a pooler that cannot
 *   keep them (PgBouncer in transaction mode before 1.21).
 * - `transaction(work)` takes a client from the pool, runs `BEGIN` (READ COMMITTED, the
 *   default), `work`, then `COMMIT`, or `ROLLBACK` when `work` throws (the error rethrown
 *   unchanged), and releases the client — destroying it when the rollback failed too, so a
 *   broken connection never goes back to the pool.
 */
export class PgExecutor implements SqlExecutor<PoolClient> {
  readonly #pool: Pool;
  readonly #prepared: boolean;
  readonly #translated = new Map<string, Translated>();
  #named = 0;

  constructor(pool: Pool, options: { preparedStatements?: boolean } = {}) {
    this.#pool = pool;
    this.#prepared = options.preparedStatements !== false;
  }

  async all(sql: string, params: readonly unknown[] = [], tx?: PoolClient): Promise<SqlRow[]> {
    const result = await this.#query(sql, params, tx);
    return result.rows as SqlRow[];
  }

  async run(sql: string, params: readonly unknown[] = [], tx?: PoolClient): Promise<RunResult> {
    const result = await this.#query(sql, params, tx);
    return { affectedRows: result.rowCount ?? 0, insertId: undefined };
  }

  async transaction<T>(work: (tx: PoolClient) => Promise<T>, _options?: TransactionOptions): Promise<T> {
    const client = await this.#pool.connect();
    let broken: unknown;
    try {
      await client.query('BEGIN');
      let result: T;
      try {
        result = await work(client);
      } catch (error) {
        try {
          await client.query('ROLLBACK');
        } catch (rollbackError) {
          broken = rollbackError;
        }
        throw error;
      }
      await client.query('COMMIT');
      return result;
    } catch (error) {
      broken ??= isConnectionError(error) ? error : undefined;
      throw error;
    } finally {
      client.release(broken instanceof Error ? broken : broken === undefined ? undefined : true);
    }
  }

  async untransacted(sql: string): Promise<SqlRow[]> {
    const result = await this.#pool.query(sql);
    return result.rows as SqlRow[];
  }

  /** PostgreSQL needs no prologue. */
  async prologue(): Promise<void> {}

  classifyError(error: unknown): DriverErrorKind {
    return classifyDriverError(error);
  }

  #query(sql: string, params: readonly unknown[], tx: PoolClient | undefined): Promise<QueryResult> {
    const config = this.#config(sql, params);
    return tx === undefined ? this.#pool.query(config) : tx.query(config);
  }

  /** The node-postgres query for `sql` with `params`, translated once per text and array layout. */
  #config(sql: string, params: readonly unknown[]): QueryConfig {
    let key = sql;
    for (let index = 0; index < params.length; index += 1) if (Array.isArray(params[index])) key += `\u0000${index}`;
    let translated = this.#translated.get(key);
    if (translated === undefined) {
      const fresh = translate(sql, params);
      // A text with a list spread into placeholders depends on the list's length: neither
      // cached nor prepared (the engine writes PostgreSQL's lists as IN (?) / ARRAY[?]).
      if (fresh.spread) return { text: fresh.text, values: bind(fresh.shape, params) };
      translated = fresh;
      if (this.#prepared && this.#named < MAX_NAMED_STATEMENTS) {
        this.#named += 1;
        translated = { ...translated, name: `courier_${createHash('sha1').update(translated.text).digest('hex').slice(0, 20)}` };
      }
      this.#translated.set(key, translated);
    }
    const values = bind(translated.shape, params);
    return translated.name === undefined ? { text: translated.text, values } : { name: translated.name, text: translated.text, values };
  }
}

function bind(shape: readonly ParamUse[], params: readonly unknown[]): unknown[] {
  const values: unknown[] = [];
  for (const use of shape) {
    const value = params[use.index];
    if (use.spread) values.push(...(value as unknown[]));
    else values.push(value);
  }
  return values;
}

/**
 * `sql` with `$n` placeholders. Quoted text (`'…'`, `"…"`) is copied as it is; an array
 * parameter in `IN (?)` or `ARRAY[?]` is bound as one array, anywhere else as a list of
 * placeholders (`spread`).
 */
function translate(sql: string, params: readonly unknown[]): Translated & { readonly spread: boolean } {
  let text = '';
  const shape: ParamUse[] = [];
  let placeholders = 0;
  let spread = false;
  let param = 0;
  for (let at = 0; at < sql.length; at += 1) {
    const char = sql[at]!;
    if (char === "'" || char === '"') {
      const end = sql.indexOf(char, at + 1);
      const stop = end === -1 ? sql.length : end + 1;
      text += sql.slice(at, stop);
      at = stop - 1;
      continue;
    }
    if (char !== '?') {
      text += char;
      continue;
    }
    const index = param;
    param += 1;
    const value = params[index];
    if (!Array.isArray(value)) {
      shape.push({ index, spread: false });
      placeholders += 1;
      text += `$${placeholders}`;
    } else if (/\bIN \($/i.test(text) && sql[at + 1] === ')') {
      shape.push({ index, spread: false });
      placeholders += 1;
      text = `${text.slice(0, -'IN ('.length)}= ANY($${placeholders})`;
      at += 1;
    } else if (/ARRAY\[$/i.test(text) && sql[at + 1] === ']') {
      shape.push({ index, spread: false });
      placeholders += 1;
      text = `${text.slice(0, -'ARRAY['.length)}$${placeholders}`;
      at += 1;
    } else {
      spread = true;
      shape.push({ index, spread: true });
      const list: string[] = [];
      for (let element = 0; element < value.length; element += 1) {
        placeholders += 1;
        list.push(`$${placeholders}`);
      }
      text += list.length > 0 ? list.join(', ') : 'NULL';
    }
  }
  return { text, shape, name: undefined, spread };
}

/**
 * Whether the connection may be unusable after `error`: anything but an error the server
 * reported for a statement (a SQLSTATE), or a server-reported connection failure or
 * shutdown (classes 08 and 57P). Such a client must not go back to the pool.
 */
export function isConnectionError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || !/^[0-9A-Z]{5}$/.test(code)) return true;
  return code.startsWith('08') || code.startsWith('57P');
}
