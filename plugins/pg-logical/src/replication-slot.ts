import { ConfigError, StorageError } from '@courier/core';

/** The subset of a `pg` client or pool the slot functions use. */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
}

/** A replication slot as operators see it. */
export interface ReplicationSlotStats {
  readonly slot: string;
  /** Whether a relay is reading it now. */
  readonly active: boolean;
  /** The process id of the server backend serving the reader, when active. */
  readonly activePid: number | null;
  /** Where a reader resumes: everything before it was acknowledged. */
  readonly confirmedLsn: string | null;
  /**
   * WAL bytes the server keeps for this slot (from the confirmed position to the current
   * WAL end). It grows while nobody reads or acknowledges; alert on it (docs/operations.md).
   */
  readonly lagBytes: number;
  /** PostgreSQL's own verdict on the WAL the slot holds (`reserved`, `extended`, `unreserved`, `lost`). */
  readonly walStatus: string | null;
  /**
   * How long nobody has read the slot (server clock), from `inactive_since`: null while it is
   * read, and on servers before PostgreSQL 17, which do not record it.
   */
  readonly inactiveForMs: number | null;
}

const SLOT_NAME = /^[a-z0-9_]{1,63}$/;

/** Checks a slot or publication name: PostgreSQL allows lower-case letters, digits and `_`, at most 63. */
export function assertSlotName(what: string, name: string): void {
  if (typeof name !== 'string' || !SLOT_NAME.test(name)) {
    throw new ConfigError(`'${what}' must be 1–63 lower-case letters, digits or '_', got ${JSON.stringify(name)}`);
  }
}

/**
 * Creates the publication of the outbox table (inserts only) and the logical replication
 * slot (`pgoutput`), each only if missing, in that order: a slot decodes with the catalog
 * as it was at each change, so the publication must exist before the first change it is to
 * carry. Safe to run from several relays at once (a creation that loses the race is
 * ignored). A server without `wal_level = logical` is refused with a `ConfigError` naming
 * the setting.
 */
export async function ensureReplicationSlot(client: PgQueryable, options: { readonly slot: string; readonly publication: string; readonly table: string }): Promise<{ createdSlot: boolean }> {
  assertSlotName('slot', options.slot);
  assertSlotName('publication', options.publication);
  const level = String((await client.query('SHOW wal_level')).rows[0]?.['wal_level'] ?? '');
  if (level !== 'logical') {
    throw new ConfigError(
      `the log-tailing relay needs wal_level = logical, but the server runs with wal_level = '${level}': ` +
        `run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (or set it in postgresql.conf)`,
    );
  }
  const published = await client.query('SELECT 1 FROM pg_publication WHERE pubname = $1', [options.publication]);
  if (published.rows.length === 0) {
    await ignoreDuplicate(client.query(`CREATE PUBLICATION "${options.publication}" FOR TABLE ${options.table} WITH (publish = 'insert')`));
  }
  const slots = await client.query('SELECT plugin FROM pg_replication_slots WHERE slot_name = $1', [options.slot]);
  const existing = slots.rows[0];
  if (existing) {
    if (existing['plugin'] !== 'pgoutput') {
      throw new ConfigError(`replication slot '${options.slot}' exists with plugin '${String(existing['plugin'])}'; the log-tailing relay needs a 'pgoutput' slot: drop it or choose another name`);
    }
    return { createdSlot: false };
  }
  const created = await ignoreDuplicate(client.query(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, [options.slot]));
  return { createdSlot: created };
}

/** Reads a slot's state and lag; `undefined` when there is no such slot. */
export async function readSlotStats(client: PgQueryable, slot: string): Promise<ReplicationSlotStats | undefined> {
  const { rows } = await client.query(
    'SELECT slot_name, active, active_pid, confirmed_flush_lsn::text AS confirmed, wal_status, ' +
      'coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), coalesce(confirmed_flush_lsn, restart_lsn)), 0)::float8 AS lag_bytes, ' +
      // Read through to_jsonb: the column exists from PostgreSQL 17 on, and naming it would fail before.
      "floor(extract(epoch from (now() - (to_jsonb(s) ->> 'inactive_since')::timestamptz)) * 1000)::float8 AS inactive_ms " +
      'FROM pg_replication_slots s WHERE slot_name = $1',
    [slot],
  );
  const row = rows[0];
  if (!row) return undefined;
  return {
    slot,
    active: row['active'] === true,
    activePid: row['active_pid'] === null || row['active_pid'] === undefined ? null : Number(row['active_pid']),
    confirmedLsn: row['confirmed'] === null || row['confirmed'] === undefined ? null : String(row['confirmed']),
    lagBytes: Number(row['lag_bytes']),
    walStatus: row['wal_status'] === null || row['wal_status'] === undefined ? null : String(row['wal_status']),
    inactiveForMs: row['inactive_ms'] === null || row['inactive_ms'] === undefined ? null : Math.max(0, Number(row['inactive_ms'])),
  };
}

/**
 * Drops a slot (and, with `publication`, its publication), so the server stops keeping WAL
 * for it. Refused while a relay reads it (stop the relay first; its `ReplicationSlotStats.activePid`
 * names the server process). Nothing is lost by dropping: the outbox rows are the source of
 * truth, and a relay started afterwards creates the slot again and publishes every row still
 * pending through its sweep. Returns whether a slot was dropped.
 */
export async function dropReplicationSlot(client: PgQueryable, slot: string, options: { readonly publication?: string } = {}): Promise<boolean> {
  assertSlotName('slot', slot);
  const stats = await readSlotStats(client, slot);
  if (stats?.active) {
    throw new StorageError(`replication slot '${slot}' is in use by server process ${String(stats.activePid)}: stop its relay first`, { code: 'STORAGE', retriable: true });
  }
  let dropped = false;
  if (stats) {
    await client.query('SELECT pg_drop_replication_slot($1)', [slot]);
    dropped = true;
  }
  if (options.publication !== undefined) {
    assertSlotName('publication', options.publication);
    await client.query(`DROP PUBLICATION IF EXISTS "${options.publication}"`);
  }
  return dropped;
}

/** Resolves whether the statement created something; a `duplicate_object` (42710) from a racing creator reads as false. */
async function ignoreDuplicate(statement: Promise<unknown>): Promise<boolean> {
  try {
    await statement;
    return true;
  } catch (error) {
    if ((error as { code?: string }).code === '42710') return false;
    throw error;
  }
}
