// Issue 40, phase 1 of the "HOT lease" (bench/README.md, "The HOT lease, measured first"): a
// prototype of the lease that changes no indexed column, for measuring before building it.
// The outbox tables registered with `hotLease` get a `leased_until timestamptz` column and a
// fill factor; the PostgreSQL dialect's claim on them writes the lease into `lease_owner`,
// `lease_token` and `leased_until` instead of moving `available_at` (the `due_ix` key), and
// its due scans skip rows whose `leased_until` is still in the future. Everything else (the
// completion, the head-of-key probe, the token) is the engine's own SQL, unchanged: the claim
// statement the engine builds is rewritten on its way to the executor. Prototype only — the
// renew / release / fail / stats statements still use `available_at`; a drain never calls
// them (its lease outlives it).
//
// Since schema version 7 the engine leases this way itself (every table): the patch is then
// refused (`hotLease` throws); run it at commit 8f659a3 (schema 6) to repeat phase 1. The fill
// factor alone (`setFillfactor`) still works, to compare fill factors of the built lease.
// The engine's own module (the bench does not depend on it by name): with the source
// condition, @courier/pg and @courier/mikro-orm load this same file, so the patch reaches them.
import { PostgresDialect, SCHEMA_VERSION, type ClaimQuery, type ClaimResult, type CompletionQuery, type SqlExecutor } from '../../packages/sql-engine/src/index.js';
import pg from 'pg';
import { URLS } from '../src/services.js';

const hotTables = new Set<string>();

const unleased = (alias: string) => `(${alias}.leased_until IS NULL OR ${alias}.leased_until <= now())`;

/** The engine's claim statement with the lease moved off `available_at`. */
export function hotClaimSql(sql: string): string {
  const rewritten = sql
    .replace(/available_at = \(now\(\) \+/, 'leased_until = (now() +')
    .replaceAll('o.available_at <= now()', `o.available_at <= now() AND ${unleased('o')}`)
    .replaceAll('w.available_at <= now()', `w.available_at <= now() AND ${unleased('w')}`);
  if (rewritten === sql || !rewritten.includes('leased_until = (now() +')) throw new Error(`hot-lease-patch: the claim statement changed shape: ${sql.slice(0, 200)}`);
  return rewritten;
}

const original = PostgresDialect.prototype.claimHeads;
PostgresDialect.prototype.claimHeads = function claimHeads<Tx>(this: PostgresDialect, runner: SqlExecutor<Tx>, query: ClaimQuery, done?: CompletionQuery<Tx>): Promise<ClaimResult> {
  if (!hotTables.has(this.table('outbox'))) return Reflect.apply(original, this, [runner, query, done]) as Promise<ClaimResult>;
  const rewriting: SqlExecutor<Tx> = Object.create(runner) as SqlExecutor<Tx>;
  rewriting.all = (sql, params, trx) => runner.all(hotClaimSql(sql), params, trx);
  rewriting.transaction = runner.transaction.bind(runner);
  return Reflect.apply(original, this, [rewriting, query, done]) as Promise<ClaimResult>;
};

/**
 * Gives `table` (a quoted outbox table name, as the dialect writes it) the HOT lease: the
 * `leased_until` column, `fillfactor` (for pages written from now on: call it before seeding an
 * empty table), and the rewritten claim.
 */
export async function hotLease(table: string, fillfactor: number): Promise<void> {
  if (SCHEMA_VERSION >= 7) throw new Error(`hot-lease-patch: schema version ${SCHEMA_VERSION} leases in leased_until already; the prototype is for schema 6 (commit 8f659a3)`);
  const client = new pg.Client({ connectionString: URLS.postgresql });
  await client.connect();
  try {
    await client.query(`ALTER TABLE ${table} ADD COLUMN IF NOT EXISTS leased_until timestamptz, SET (fillfactor = ${fillfactor})`);
  } finally {
    await client.end();
  }
  hotTables.add(table);
}

/** Only the fill factor (the current lease, on pages with room). */
export async function setFillfactor(table: string, fillfactor: number): Promise<void> {
  const client = new pg.Client({ connectionString: URLS.postgresql });
  await client.connect();
  try {
    await client.query(`ALTER TABLE ${table} SET (fillfactor = ${fillfactor})`);
  } finally {
    await client.end();
  }
}
