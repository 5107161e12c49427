// `courier stats` on a log-tailing outbox (`@courier/pg-logical`): the replication slot the
// relay reads. A slot nobody reads keeps WAL on the server until the disk fills, so an
// operator looking at the backlog must see the slot too. Kept apart from cli.ts: the CLI
// does not depend on the plugin and finds the slot through optional members, at runtime.
import { hasLogSlot, type LogSlotOperations } from '@courier/core';
import { formatDuration, table } from './format.js';

/**
 * The log-tail slot as `courier stats` reports it. `exists: false` when the server has no
 * such slot (nothing is created by reading: the relay creates it when it starts); the other
 * fields are then null/false/0. `inactiveForMs` is the server's `inactive_since` (PostgreSQL
 * 17 and later; null before, and while the slot is read).
 */
export interface CliLogSlot {
  readonly slot: string;
  readonly exists: boolean;
  readonly active: boolean;
  readonly activePid: number | null;
  readonly lagBytes: number;
  readonly inactiveForMs: number | null;
  readonly walStatus: string | null;
}

/** The outbox's slot members when the outbox tails a replication slot (`PgLogicalOutboxStore`); undefined otherwise. */
export function logSlotOf(outbox: unknown): LogSlotOperations | undefined {
  return hasLogSlot(outbox) ? outbox : undefined;
}

/**
 * Reads the slot from the server (one query on the store's pool; it reads `pg_replication_slots`
 * and creates neither the slot nor its publication). The store's in-process figures
 * (`unacknowledgedAgeMs`) are left out: in the CLI's process nobody streams the slot, so they
 * would always read 0.
 */
export async function readLogSlot(source: LogSlotOperations): Promise<CliLogSlot> {
  const stats = await source.slotStats();
  if (!stats) return { slot: source.slot, exists: false, active: false, activePid: null, lagBytes: 0, inactiveForMs: null, walStatus: null };
  return {
    slot: source.slot,
    exists: true,
    active: stats.active,
    activePid: stats.activePid,
    lagBytes: stats.lagBytes,
    inactiveForMs: stats.inactiveForMs ?? null,
    walStatus: stats.walStatus,
  };
}

/** The `courier stats` section for the slot (lines, the first one its title). */
export function renderLogSlot(slot: CliLogSlot): string[] {
  if (!slot.exists) {
    return ['log-tail slot', `slot '${slot.slot}' does not exist on the server (a log-tail relay creates it when it starts; until then no WAL is held for it)`];
  }
  return [
    'log-tail slot',
    table(
      ['SLOT', 'READER', 'LAG', 'UNREAD FOR', 'WAL STATUS'],
      [
        [
          slot.slot,
          slot.active ? `active (server pid ${slot.activePid ?? '?'})` : 'none',
          formatBytes(slot.lagBytes),
          slot.inactiveForMs === null ? '-' : formatDuration(slot.inactiveForMs),
          slot.walStatus ?? '-',
        ],
      ],
    ),
  ];
}

function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}
