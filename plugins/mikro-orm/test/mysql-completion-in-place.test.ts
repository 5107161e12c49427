// MySQL/MariaDB schema version 4: the columns a completion changes keep their stored size
// (`state` an ENUM, `published_at` never NULL), so InnoDB rewrites the row in place instead of
// re-inserting it into a full page; tables of version 3 are upgraded keeping every row.
import { afterEach, describe, expect, it } from 'vitest';
import { NOT_PUBLISHED_AT } from '@courier/sql-engine';
import { MikroOrmOutboxStore } from '../src/index.js';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, idsOf, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

const V4_COLUMNS = ["published_at datetime(3) NO '1970-01-01 00:00:00.000'", "state enum('pending','published','dead','halted') NO 'pending'"];

/** `state` and `published_at` of the fixture's outbox: name, type, nullable, default. */
async function completionColumns(f: MikroOrmFixture): Promise<string[]> {
  const rows = await f.sql(
    `SELECT column_name AS n, column_type AS t, is_nullable AS nullable, column_default AS d FROM information_schema.columns ` +
      `WHERE table_schema = DATABASE() AND table_name = ? AND column_name IN ('state', 'published_at') ORDER BY column_name`,
    [`${f.tablePrefix}outbox`],
  );
  // MariaDB reports a default as a quoted literal, MySQL 8 unquoted.
  return rows.map((row) => `${String(row['n'])} ${String(row['t'])} ${String(row['nullable'])} '${String(row['d']).replace(/^'|'$/g, '')}'`);
}

/** message id → state and publish time (`not published` for the v4 marker, `NULL` for a NULL). */
async function outboxRows(f: MikroOrmFixture): Promise<Record<string, string>> {
  const rows = await f.sql(
    `SELECT message_id AS id, state, CASE WHEN published_at IS NULL THEN 'NULL' WHEN published_at = ? THEN 'not published' ` +
      `WHEN published_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE THEN 'just now' ELSE 'earlier' END AS published FROM ${f.table('outbox')}`,
    [NOT_PUBLISHED_AT],
  );
  return Object.fromEntries(rows.map((row) => [Buffer.isBuffer(row['id']) ? row['id'].toString('utf8') : String(row['id']), `${String(row['state'])}, ${String(row['published'])}`]));
}

/** Turns the fixture's outbox back into schema version 3: the two columns as that release created them. */
async function downgradeToV3(f: MikroOrmFixture): Promise<void> {
  await f.sql(`ALTER TABLE ${f.table('outbox')} MODIFY state VARCHAR(9) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending', MODIFY published_at DATETIME(3) NULL`);
  await f.sql(`UPDATE ${f.table('outbox')} SET published_at = NULL WHERE published_at = ?`, [NOT_PUBLISHED_AT]);
  await f.sql(`ALTER TABLE ${f.table('outbox')} DROP COLUMN error_code, DROP COLUMN error_name, DROP COLUMN first_failed_at, DROP COLUMN first_due_at`);
  await f.sql(`UPDATE ${f.table('meta')} SET value = 3 WHERE name = 'schema_version'`);
}

/** Inserts a row the way a v3 store left it: `state`, and a publish time `daysAgo` or NULL. */
async function insertV3Row(f: MikroOrmFixture, id: string, state: string, daysAgo: number | null): Promise<void> {
  await f.sql(
    `INSERT INTO ${f.table('outbox')} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, created_at, published_at) ` +
      `VALUES (?, 'mikroorm.Tested', 1, ?, NULL, NULL, '2026-01-01T00:00:00.000Z', ?, '{}', '{}', ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), ${daysAgo === null ? 'NULL' : `UTC_TIMESTAMP(3) - INTERVAL ${daysAgo} DAY`})`,
    [id, f.tablePrefix, id, state],
  );
}

describe.each(['mariadb', 'mysql-driver'] as const)('completion in place (%s)', (dialect) => {
  it('a fresh outbox has fixed-size completion columns; appended rows are not published, complete sets the publish time', async () => {
    const f = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(f);
    expect(await completionColumns(f)).toEqual(V4_COLUMNS);
    const first = envelope(f.tablePrefix, 'a');
    const second = envelope(f.tablePrefix, 'b');
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: first }, { envelope: second }]));
    expect(await outboxRows(f)).toEqual({ [first.messageId]: 'pending, not published', [second.messageId]: 'pending, not published' });
    const batch = await f.outbox.claim({ owner: 'r', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(idsOf(batch)).toEqual([first.messageId, second.messageId].sort());
    const firstSeq = batch.records.find((record) => record.envelope.messageId === first.messageId)?.sequence;
    expect(await f.outbox.complete(batch.lease, firstSeq === undefined ? [] : [firstSeq])).toBe(1);
    expect(await outboxRows(f)).toEqual({ [first.messageId]: 'published, just now', [second.messageId]: 'pending, not published' });
  });

  it('tables of version 3 are refused until upgraded; the upgrade keeps every state and publish time, and prune still takes only old published rows', async () => {
    const f = await createMikroOrmFixture(dialect, { testId: testId() });
    open.push(f);
    await downgradeToV3(f);
    const id = (name: string) => `${f.tablePrefix}${name}`;
    await insertV3Row(f, id('pending'), 'pending', null);
    await insertV3Row(f, id('old'), 'published', 2);
    await insertV3Row(f, id('dead'), 'dead', null);
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(outbox.checkSchema()).rejects.toThrow(/version 3, this release needs 7/);
    await outbox.ensureSchema();
    await outbox.ensureSchema();
    await outbox.checkSchema();
    expect(await completionColumns(f)).toEqual(V4_COLUMNS);
    expect(await outboxRows(f)).toEqual({ [id('pending')]: 'pending, not published', [id('old')]: 'published, earlier', [id('dead')]: 'dead, not published' });
    const batch = await outbox.claim({ owner: 'r', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(idsOf(batch)).toEqual([id('pending')]);
    expect(await outbox.complete(batch.lease, batch.records.map((record) => record.sequence))).toBe(1);
    expect(await outbox.prune(24 * 3_600_000)).toBe(1);
    expect(await outboxRows(f)).toEqual({ [id('pending')]: 'published, just now', [id('dead')]: 'dead, not published' });
    await outbox.close();
  });
});
