import { ConfigError } from '@courier/core';
import { createHash } from 'node:crypto';
import type { PostgresPool, PostgresPoolClient } from 'kysely';

/** Most statement texts named for preparing; later ones run unnamed (each connection keeps every statement it prepared). */
export const MAX_PREPARED_STATEMENTS = 256;

// Courier's PostgreSQL statement texts (exactly as a KyselyExecutor sends them) → their
// prepared-statement names. Shared by every executor and every wrapped pool in the process:
// the name is derived from the text alone, so all of them agree on it (node-postgres refuses
// one name for two texts on one connection).
const NAMES = new Map<string, string>();

/**
 * Records `sql` as one of Courier's statements, so a pool wrapped by
 * {@link preparingCourierStatements} runs it as a named prepared statement. Texts past
 * {@link MAX_PREPARED_STATEMENTS} are not recorded (they run unnamed). Called by the
 * executor for every PostgreSQL statement whose text does not depend on a list's length.
 */
export function registerCourierStatement(sql: string): void {
  if (NAMES.has(sql) || NAMES.size >= MAX_PREPARED_STATEMENTS) return;
  NAMES.set(sql, `courier_${createHash('sha1').update(sql).digest('hex').slice(0, 20)}`);
}

/**
 * Wraps the node-postgres `Pool` you give Kysely's `PostgresDialect` so that **Courier's own
 * statements** run as named prepared statements: each connection parses and plans them once
 * instead of on every call. Kysely's driver sends every statement unnamed
 * (`client.query(sql, parameters)`), so without this PostgreSQL plans Courier's outbox
 * `INSERT` afresh in every producing transaction.
 *
 * ```ts
 * const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool: preparingCourierStatements(new pg.Pool(…)) }) });
 * ```
 *
 * Guarantees:
 * - Only statements a Courier Kysely store ran before, recognised by their exact text, are
 *   named (at most {@link MAX_PREPARED_STATEMENTS} texts, so a connection keeps a bounded set).
 *   Every other query — your own, Kysely's `begin`/`commit`, cursors — reaches the client
 *   exactly as Kysely sent it.
 * - The pool itself is not changed: the wrapper forwards `connect`, `end`, `options` and
 *   `Client` to it, and hands Kysely one stable stand-in per pooled client (Kysely keys its
 *   connections by client object), forwarding every other member to the client.
 * - Optional: without the wrapper everything runs unnamed, as Kysely does. Do not use it
 *   behind a pooler that cannot keep prepared statements across transactions (PgBouncer in
 *   transaction mode before 1.21, without `max_prepared_statements`).
 *
 * @throws ConfigError when `pool` is not a node-postgres `Pool` (an object with `connect` and
 * `end` functions) or a function that returns one, the two forms `PostgresDialect` takes.
 */
export function preparingCourierStatements<P extends PostgresPool>(pool: P): PostgresPool;
export function preparingCourierStatements<P extends PostgresPool>(pool: () => Promise<P>): () => Promise<PostgresPool>;
export function preparingCourierStatements(pool: PostgresPool | (() => Promise<PostgresPool>)): PostgresPool | (() => Promise<PostgresPool>) {
  if (typeof pool === 'function') return async () => wrapPool(await pool());
  return wrapPool(pool);
}

function wrapPool(pool: PostgresPool): PostgresPool {
  if (pool === null || typeof pool !== 'object' || typeof pool.connect !== 'function' || typeof pool.end !== 'function') {
    const got = pool === null ? 'null' : typeof pool === 'object' ? `an object without connect()/end()` : typeof pool;
    throw new ConfigError(`preparingCourierStatements(pool): 'pool' must be a node-postgres Pool (new pg.Pool(…)) or a function returning one, got ${got}`);
  }
  const standIns = new WeakMap<PostgresPoolClient, PostgresPoolClient>();
  return {
    get Client() {
      return pool.Client;
    },
    get options() {
      return pool.options;
    },
    async connect() {
      const client = await pool.connect();
      let standIn = standIns.get(client);
      if (standIn === undefined) {
        standIn = preparingClient(client);
        standIns.set(client, standIn);
      }
      return standIn;
    },
    end: () => pool.end(),
  };
}

function preparingClient(client: PostgresPoolClient): PostgresPoolClient {
  const query = (...args: unknown[]) => {
    const [sql, parameters] = args;
    const name = args.length === 2 && typeof sql === 'string' && Array.isArray(parameters) ? NAMES.get(sql) : undefined;
    const run = client.query as (...args: unknown[]) => unknown;
    // node-postgres's query config: a `name` makes it a prepared statement on this connection.
    if (name !== undefined) return run.call(client, { name, text: sql, values: parameters });
    return run.apply(client, args);
  };
  // Every other member (release, processID, …) is the client's own, read when used: pg-pool
  // sets `release` anew on each checkout.
  return new Proxy(client, {
    get(target, property) {
      if (property === 'query') return query;
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
