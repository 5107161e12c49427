// Diagnostics for the bus suite's `locate` (a scenario that did not settle names where each
// unsettled message is): reads the outbox and inbox tables of one fixture as they are.
import type { FixtureDialect } from './fixture.js';

/** What {@link locateInStore} reads through: the fixture's raw SQL, its table names and dialect. */
export interface LocateSource {
  readonly dialect: FixtureDialect;
  sql(query: string, params?: readonly unknown[]): Promise<Record<string, unknown>[]>;
  /** Quoted name of a table of the fixture, e.g. `table('outbox')`. */
  table(name: string): string;
}

/** Milliseconds from the database's clock to the timestamp column `column` (negative: already due). */
function dueInMs(dialect: FixtureDialect, column: string): string {
  switch (dialect) {
    case 'postgresql':
      return `floor(extract(epoch from (${column} - now())) * 1000)`;
    case 'mariadb':
    case 'mysql-driver':
      return `(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), ${column}) DIV 1000)`;
    case 'sqlite':
      return `(${column} - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))`;
  }
}

function text(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

function due(ms: unknown): string {
  const value = Number(ms);
  return value > 0 ? `due in ${value} ms` : `due ${-value} ms ago`;
}

/**
 * Where each of `ids` is in the store: its outbox row (state, attempts, due time, lease, last
 * error), its inbox records per consumer, and the consumer's count of its runs alone. One
 * line per message found; read-only.
 */
export async function locateInStore(source: LocateSource, ids: readonly string[]): Promise<ReadonlyMap<string, string>> {
  const found = new Map<string, string[]>();
  const add = (id: unknown, line: string) => found.set(text(id), [...(found.get(text(id)) ?? []), line]);
  if (ids.length === 0) return new Map();
  const marks = ids.map(() => '?').join(', ');
  const outbox = await source.sql(
    `SELECT message_id, seq, state, attempts, lease_owner, lease_token, last_error, ${dueInMs(source.dialect, 'COALESCE(leased_until, available_at)')} AS due_ms FROM ${source.table('outbox')} WHERE message_id IN (${marks})`,
    ids,
  );
  for (const row of outbox) {
    const error = row['last_error'] ? `, last error: ${text(row['last_error']).slice(0, 160)}` : '';
    // A claimed row's due time is its lease's end (leased_until, schema version 7).
    const ms = Number(row['due_ms']);
    const timing =
      row['lease_owner'] === null || row['lease_owner'] === undefined
        ? `${due(ms)}, no lease`
        : `lease ${text(row['lease_owner'])}#${text(row['lease_token'])} ${ms > 0 ? `ends in ${ms} ms` : `ran out ${-ms} ms ago (claimable)`}`;
    add(row['message_id'], `outbox seq ${text(row['seq'])} ${text(row['state'])}, attempts ${text(row['attempts'])}, ${timing}${error}`);
  }
  // The consumer's own record, and those under its suffixes (`~dead` mark, `~rerun` replay).
  for (const row of await source.sql(`SELECT message_id, consumer FROM ${source.table('inbox')} WHERE message_id IN (${marks})`, ids)) {
    add(row['message_id'], `inbox record for '${text(row['consumer'])}'`);
  }
  for (const row of await source.sql(`SELECT message_id, consumer, starts FROM ${source.table('inbox_starts')} WHERE message_id IN (${marks})`, ids)) {
    add(row['message_id'], `'${text(row['consumer'])}' started it ${text(row['starts'])} time(s) alone`);
  }
  return new Map([...found].map(([id, lines]) => [id, lines.join(', ')]));
}
