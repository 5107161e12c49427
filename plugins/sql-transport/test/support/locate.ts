// Diagnostics for the bus suite's `locate` (a scenario that did not settle names where each
// unsettled message is): reads the outbox, inbox and queue tables of one test as they are.
import type { MikroORM } from '@mikro-orm/core';
import type { QueueDialectName } from './fixture.js';

/** Milliseconds from the database's clock to the timestamp column `column` (negative: already due). */
function dueInMs(dialect: QueueDialectName, column: string): string {
  switch (dialect) {
    case 'postgresql':
      return `floor(extract(epoch from (${column} - now())) * 1000)`;
    case 'mariadb':
      return `(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), ${column}) DIV 1000)`;
    case 'sqlite':
      return `(${column} - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))`;
  }
}

function quote(dialect: QueueDialectName, name: string): string {
  return dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`;
}

async function rows(orm: MikroORM, sql: string, params: readonly unknown[]): Promise<Record<string, unknown>[]> {
  return (await orm.em.getConnection('write').execute(sql, [...params], 'all')) as Record<string, unknown>[];
}

function text(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

/**
 * The frame both locates share: `collect` adds lines about messages, and each message found
 * gets one answer, its lines joined in the order they came. No ids, no query.
 */
async function perMessage(ids: readonly string[], collect: (add: (id: string, line: string) => void, marks: string) => Promise<void>): Promise<ReadonlyMap<string, string>> {
  const found = new Map<string, string[]>();
  if (ids.length === 0) return new Map();
  await collect((id, line) => found.set(id, [...(found.get(id) ?? []), line]), ids.map(() => '?').join(', '));
  return new Map([...found].map(([id, lines]) => [id, lines.join(', ')]));
}

function due(ms: unknown): string {
  const value = Number(ms);
  return value > 0 ? `due in ${value} ms` : `due ${-value} ms ago`;
}

/** Where each message is in the store of `testId`: its outbox row, inbox record and start count. */
export function locateInStore(orm: MikroORM, dialect: QueueDialectName, testId: string, ids: readonly string[]): Promise<ReadonlyMap<string, string>> {
  return perMessage(ids, async (add, marks) => {
    const outbox = await rows(
      orm,
      `SELECT message_id, seq, state, attempts, lease_owner, lease_token, last_error, ${dueInMs(dialect, 'available_at')} AS due_ms FROM ${quote(dialect, `${testId}_outbox`)} WHERE message_id IN (${marks})`,
      ids,
    );
    for (const row of outbox) {
      const lease = row['lease_owner'] === null || row['lease_owner'] === undefined ? 'no lease' : `lease ${text(row['lease_owner'])}#${text(row['lease_token'])}`;
      const error = row['last_error'] ? `, last error: ${text(row['last_error']).slice(0, 160)}` : '';
      add(text(row['message_id']), `outbox seq ${text(row['seq'])} ${text(row['state'])}, attempts ${text(row['attempts'])}, ${due(row['due_ms'])}, ${lease}${error}`);
    }
    const inbox = await rows(orm, `SELECT message_id, consumer FROM ${quote(dialect, `${testId}_inbox`)} WHERE message_id IN (${marks})`, ids);
    for (const row of inbox) add(text(row['message_id']), `inbox record for '${text(row['consumer'])}' (recorded, yet no effect)`);
    const starts = await rows(orm, `SELECT message_id, starts FROM ${quote(dialect, `${testId}_inbox_starts`)} WHERE message_id IN (${marks})`, ids);
    for (const row of starts) add(text(row['message_id']), `consumer started it ${text(row['starts'])} time(s) alone`);
  });
}

/** Where each message is in the queue of `testId`: its rows per consumer group, state, attempt, claims, due time (the lease's end for a claimed row), lease. */
export function locateInQueue(orm: MikroORM, dialect: QueueDialectName, testId: string, ids: readonly string[]): Promise<ReadonlyMap<string, string>> {
  return perMessage(ids, async (add, marks) => {
    const queue = await rows(
      orm,
      `SELECT message_id, seq, consumer, state, attempt, claims, lease_owner, reason_code, ${dueInMs(dialect, 'available_at')} AS due_ms FROM ${quote(dialect, `${testId}_queue`)} WHERE message_id IN (${marks}) ORDER BY seq`,
      ids,
    );
    for (const row of queue) {
      const leased = row['lease_owner'] !== null && row['lease_owner'] !== undefined;
      const where =
        text(row['state']) === 'dead'
          ? `dead (${text(row['reason_code'])})`
          : leased
            ? Number(row['due_ms']) > 0
              ? `claimed, lease ends in ${Number(row['due_ms'])} ms`
              : `claimed, lease ran out ${-Number(row['due_ms'])} ms ago (claimable)`
            : Number(row['due_ms']) > 0
              ? `waiting for a retry, ${due(row['due_ms'])}`
              : `queued, ${due(row['due_ms'])}`;
      add(text(row['message_id']), `queue seq ${text(row['seq'])} for '${text(row['consumer'])}': ${where}, attempt ${text(row['attempt'])}, claims ${text(row['claims'])}`);
    }
  });
}
