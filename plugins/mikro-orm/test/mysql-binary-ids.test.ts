// MySQL/MariaDB schema version 2: id columns compare byte for byte, and tables of version 1
// (utf8mb4_bin, which pads trailing spaces on MariaDB) are upgraded in place.
import { Migrator } from '@mikro-orm/migrations';
import { afterEach, describe, expect, it } from 'vitest';
import { courierMigrations } from '../src/migrations.js';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '../src/index.js';
import { createMikroOrmFixture, type MikroOrmFixture } from './support/fixture.js';
import { envelope, idsOf, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

/** Turns the fixture's tables back into schema version 1: the columns as that release created them. */
async function downgradeToV1(f: MikroOrmFixture): Promise<void> {
  const v1 = (size: number, nullable = false) => `VARCHAR(${size}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin ${nullable ? 'NULL' : 'NOT NULL'}`;
  await f.sql(`ALTER TABLE ${f.table('outbox')} MODIFY message_id ${v1(200)}, MODIFY topic ${v1(249)}, MODIFY msg_key ${v1(1024, true)}`);
  await f.sql(`ALTER TABLE ${f.table('inbox')} MODIFY message_id ${v1(200)}, MODIFY consumer ${v1(200)}`);
  await f.sql(`ALTER TABLE ${f.table('inbox_starts')} MODIFY message_id ${v1(200)}, MODIFY consumer ${v1(200)}`);
  // Nor had version 1 the version 5 failure columns or the version 6 first_due_at.
  await f.sql(`ALTER TABLE ${f.table('outbox')} DROP COLUMN error_code, DROP COLUMN error_name, DROP COLUMN first_failed_at, DROP COLUMN first_due_at`);
  await f.sql(`UPDATE ${f.table('meta')} SET value = 1 WHERE name = 'schema_version'`);
}

async function idColumnTypes(f: MikroOrmFixture): Promise<string[]> {
  const rows = await f.sql(
    `SELECT CONCAT(table_name, '.', column_name, ' ', column_type) AS c FROM information_schema.columns ` +
      `WHERE table_schema = DATABASE() AND table_name IN (?) AND column_name IN ('message_id', 'consumer', 'topic', 'msg_key') ORDER BY c`,
    [[`${f.tablePrefix}outbox`, `${f.tablePrefix}inbox`, `${f.tablePrefix}inbox_starts`]],
  );
  return rows.map((row) => String(row['c']).replace(f.tablePrefix, ''));
}

const V2_COLUMNS = [
  'inbox.consumer varbinary(800)',
  'inbox.message_id varbinary(800)',
  'inbox_starts.consumer varbinary(800)',
  'inbox_starts.message_id varbinary(800)',
  'outbox.message_id varbinary(800)',
  'outbox.msg_key varbinary(4096)',
  'outbox.topic varbinary(996)',
];

describe.each(['mariadb', 'mysql-driver'] as const)('binary ids (%s)', (dialect) => {
  /** A fixture whose tables are at version 1, holding an outbox row and an inbox record ('m1', 'c'). */
  async function v1Fixture(id: string, options: Parameters<typeof createMikroOrmFixture>[2] = {}) {
    const f = await createMikroOrmFixture(dialect, { testId: id }, options);
    open.push(f);
    await downgradeToV1(f);
    const kept = envelope(f.tablePrefix, 'k', { messageId: `${f.tablePrefix}x` });
    await f.sql(
      `INSERT INTO ${f.table('outbox')} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, available_at, created_at) ` +
        `VALUES (?, 'mikroorm.Tested', 1, ?, 'k', NULL, ?, ?, '{}', '{}', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))`,
      [kept.messageId, kept.topic, kept.occurredAt, kept.correlationId],
    );
    await f.sql(`INSERT INTO ${f.table('inbox')} (message_id, consumer, processed_at) VALUES ('m1', 'c', UTC_TIMESTAMP(3))`);
    return { f, kept };
  }

  async function expectUpgraded(f: MikroOrmFixture, outbox: MikroOrmOutboxStore, inbox: MikroOrmInboxStore, kept: ReturnType<typeof envelope>): Promise<void> {
    expect(await idColumnTypes(f)).toEqual(V2_COLUMNS);
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([7]);
    await outbox.checkSchema();
    // What version 1 held survives, and now tells trailing spaces apart.
    const padded = envelope(f.tablePrefix, 'k', { messageId: `${kept.messageId} ` });
    await f.transaction(async (tx) => outbox.append(tx, [{ envelope: padded }]));
    const batch = await outbox.claim({ owner: 'r', limit: 10, leaseMs: 60_000, perKey: 2 });
    expect(idsOf(batch)).toEqual([kept.messageId, padded.messageId].sort());
    expect(await inbox.run('m1', 'c', async () => 'again')).toEqual({ duplicate: true });
    expect(await inbox.run('m1 ', 'c', async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
    expect(await inbox.run('m1', 'c ', async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
  }

  it('tables of version 1 are refused until upgraded; ensureSchema upgrades them in place', async () => {
    const { f, kept } = await v1Fixture(testId());
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    const inbox = new MikroOrmInboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(outbox.checkSchema()).rejects.toThrow(/version 1, this release needs 7/);
    expect(await idColumnTypes(f)).not.toEqual(V2_COLUMNS);
    await outbox.ensureSchema();
    await outbox.ensureSchema();
    await expectUpgraded(f, outbox, inbox, kept);
    await outbox.close();
    await inbox.close();
  });

  it("courierMigrations' v2 upgrades tables a v1 migration created; down takes the version back and a second up is harmless", async () => {
    const id = testId();
    const { f, kept } = await v1Fixture(id, {
      // No snapshot: it would introspect every table of the shared test database (see schema.test.ts).
      orm: { extensions: [Migrator], migrations: { tableName: `${id}_migrations`, migrationsList: courierMigrations({ tablePrefix: `${id}_` }), silent: true, snapshot: false } },
    });
    // The application's migrator had applied v1 (the fixture created the tables); v2 is new.
    const migrator = f.orm.getMigrator();
    await migrator.up({ to: `Courier_${f.tablePrefix}v1` });
    expect(await idColumnTypes(f)).not.toEqual(V2_COLUMNS);
    const applied = await migrator.up();
    // v2 brings the tables to the latest version; v3 to v7 then find nothing to do.
    expect(applied.map((migration) => migration.name)).toEqual([`Courier_${f.tablePrefix}v2`, `Courier_${f.tablePrefix}v3`, `Courier_${f.tablePrefix}v4`, `Courier_${f.tablePrefix}v5`, `Courier_${f.tablePrefix}v6`, `Courier_${f.tablePrefix}v7`]);
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    const inbox = new MikroOrmInboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expectUpgraded(f, outbox, inbox, kept);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([6]);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([5]);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([4]);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([3]);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([2]);
    await migrator.down();
    expect((await f.sql(`SELECT value FROM ${f.table('meta')} WHERE name = 'schema_version'`)).map((row) => Number(row['value']))).toEqual([1]);
    expect((await migrator.up()).map((migration) => migration.name)).toEqual([`Courier_${f.tablePrefix}v2`, `Courier_${f.tablePrefix}v3`, `Courier_${f.tablePrefix}v4`, `Courier_${f.tablePrefix}v5`, `Courier_${f.tablePrefix}v6`, `Courier_${f.tablePrefix}v7`]);
    expect(await idColumnTypes(f)).toEqual(V2_COLUMNS);
    await outbox.close();
    await inbox.close();
  });
});
