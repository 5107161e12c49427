// Schema creation, migrations, the schema version check and name configuration.
import { ConfigError, StorageError } from '@courier/core';
import { Migrator } from '@mikro-orm/migrations';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { courierMigrations, courierSchemaAdmin } from '../src/migrations.js';
import { MikroOrmInboxStore, MikroOrmOutboxStore, resolveTableNames } from '../src/index.js';
import { createMikroOrmFixture, FIXTURE_DIALECTS, type MikroOrmFixture } from './support/fixture.js';
import { claimAll, envelope, idsOf, testId } from './support/helpers.js';

const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

async function fixtureFor(dialect: (typeof FIXTURE_DIALECTS)[number], options: Parameters<typeof createMikroOrmFixture>[2] = {}): Promise<MikroOrmFixture> {
  const fixture = await createMikroOrmFixture(dialect, { testId: testId() }, options);
  open.push(fixture);
  return fixture;
}

describe.each(FIXTURE_DIALECTS)('schema (%s)', (dialect) => {
  it('a missing schema is a SCHEMA_MISSING StorageError that names the remedy, for store calls and flushes alike', async () => {
    const f = await fixtureFor(dialect, { withoutSchema: true });
    const error = await claimAll(f).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(StorageError);
    expect(error).toMatchObject({ code: 'SCHEMA_MISSING', retriable: false });
    expect((error as Error).message).toMatch(/ensureSchema\(\)/);
    expect((error as Error).message).toMatch(/courierMigrations\(\{ tablePrefix: "t[0-9a-f]+_" \}\)/);
    await expect(f.inbox.recordStart('m', 'c')).rejects.toMatchObject({ code: 'SCHEMA_MISSING' });
    const em = f.orm.em.fork();
    f.outbox.append(em, [{ envelope: envelope(f.tablePrefix, 'k') }]);
    await expect(em.flush()).rejects.toMatchObject({ code: 'SCHEMA_MISSING' });
    await f.outbox.ensureSchema();
    expect(idsOf(await claimAll(f))).toEqual([]);
  });

  it('a schema at version 2 is refused until upgraded; the upgrade (schema admin, as `courier migrate` runs it) adds the inbox halt tables', async () => {
    const f = await fixtureFor(dialect);
    const names = resolveTableNames({ tablePrefix: f.tablePrefix });
    for (const table of [names.inboxHalts, names.inboxHeld, names.inboxParked]) await f.sql(`DROP TABLE ${f.table(table.slice(f.tablePrefix.length))}`);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 2 WHERE name = 'schema_version'`);
    const admin = courierSchemaAdmin({ orm: f.orm, tablePrefix: f.tablePrefix });
    expect(await admin.status()).toEqual({ current: 2, target: 7 });
    const pending = await admin.pendingSql();
    expect(pending.some((sql) => sql.includes(names.inboxHalts))).toBe(true);
    await expect(new MikroOrmInboxStore({ orm: f.orm, tablePrefix: f.tablePrefix }).checkSchema()).rejects.toThrow(/version 2, this release needs 7/);
    await admin.apply();
    expect(await admin.pendingSql()).toEqual([]);
    const inbox = new MikroOrmInboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    expect(await inbox.halt('c', 'topic', 'k', envelope(f.tablePrefix, 'k'), 'E: x')).toBe('halted');
    expect((await inbox.listHalted()).map((halt) => halt.key)).toEqual(['k']);
    await inbox.close();
  });

  it('a schema at version 4 with rows in flight is upgraded to 5: old dead rows read code unknown, a row leased before the upgrade fails with its code', async () => {
    const f = await fixtureFor(dialect);
    const [dead, leased] = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'b')];
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: dead }, { envelope: leased }]));
    const batch = await f.outbox.claim({ owner: 'old-relay', limit: 10, leaseMs: 600_000, perKey: 1 });
    const sequenceOf = (id: string) => batch.records.find((record) => record.envelope.messageId === id)!.sequence;
    await f.outbox.fail(batch.lease, [{ sequence: sequenceOf(dead.messageId), error: 'TransportError [PUBLISH_UNROUTABLE]: no queue bound', outcome: 'dead' }]);
    // Back to what version 4 left: the same rows, without the failure columns.
    for (const column of ['error_code', 'error_name', 'first_failed_at', 'first_due_at']) await f.sql(`ALTER TABLE ${f.table('outbox')} DROP COLUMN ${column}`);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 4 WHERE name = 'schema_version'`);
    const admin = courierSchemaAdmin({ orm: f.orm, tablePrefix: f.tablePrefix });
    expect(await admin.status()).toEqual({ current: 4, target: 7 });
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(outbox.checkSchema()).rejects.toThrow(/version 4, this release needs 7/);
    // Two upgrades racing, as two processes' ensureSchema() would.
    await Promise.all([admin.apply(), new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix }).ensureSchema()]);
    expect(await admin.pendingSql()).toEqual([]);
    const before = await outbox.listDead();
    expect(before.map((row) => [row.envelope.messageId, row.code, row.errorName, row.firstFailedAt, row.lastError])).toEqual([
      [dead.messageId, null, null, null, 'TransportError [PUBLISH_UNROUTABLE]: no queue bound'],
    ]);
    // The lease taken before the upgrade still holds its row.
    expect(await outbox.fail(batch.lease, [{ sequence: sequenceOf(leased.messageId), error: 'TransportError [PUBLISH_UNROUTABLE]: x', outcome: 'dead', code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' }])).toBe(1);
    const after = (await outbox.listDead()).find((row) => row.envelope.messageId === leased.messageId);
    expect(after).toMatchObject({ code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError', attempts: 1 });
    expect(after!.firstFailedAt).toBeInstanceOf(Date);
    await outbox.close();
  });

  it("a schema at version 5 with rows in flight is upgraded to 6: rows failing or leased at the upgrade count their age from their insert, a row never claimed from when it is due", async () => {
    const f = await fixtureFor(dialect);
    const [failing, leased, due] = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'b'), envelope(f.tablePrefix, 'c')];
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: failing }, { envelope: leased }]));
    const waitedMs = 700;
    await sleep(waitedMs);
    const batch = await f.outbox.claim({ owner: 'old-relay', limit: 10, leaseMs: 600_000, perKey: 1 });
    const sequenceOf = (id: string) => batch.records.find((record) => record.envelope.messageId === id)!.sequence;
    await f.outbox.fail(batch.lease, [{ sequence: sequenceOf(failing.messageId), error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'retry', delayMs: 600_000 }]);
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: due }]));
    // Back to what version 5 left: the same rows, without first_due_at.
    await f.sql(`ALTER TABLE ${f.table('outbox')} DROP COLUMN first_due_at`);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 5 WHERE name = 'schema_version'`);
    const admin = courierSchemaAdmin({ orm: f.orm, tablePrefix: f.tablePrefix });
    expect(await admin.status()).toEqual({ current: 5, target: 7 });
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(outbox.checkSchema()).rejects.toThrow(/version 5, this release needs 7/);
    // Two upgrades racing, as two processes' ensureSchema() would.
    await Promise.all([admin.apply(), new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix }).ensureSchema()]);
    expect(await admin.pendingSql()).toEqual([]);
    // The backfill: the failing and the leased row get their insert time; the row never claimed keeps NULL (read as its due time).
    const count = async (where: string) => Number((await f.sql(`SELECT COUNT(*) AS n FROM ${f.table('outbox')} WHERE ${where}`))[0]?.['n']);
    expect([await count('first_due_at IS NOT NULL AND first_due_at = created_at'), await count('first_due_at IS NULL')]).toEqual([2, 1]);
    // The row in its retry's backoff is backlog, counted from its insert (before the column it read 0).
    const stats = await outbox.stats();
    expect(stats).toMatchObject({ pending: 3, inFlight: 1 });
    expect(stats.oldestPendingAgeMs).toBeGreaterThanOrEqual(waitedMs - 100);
    // The lease taken before the upgrade still holds its row; failing it keeps the age.
    expect(await outbox.fail(batch.lease, [{ sequence: sequenceOf(leased.messageId), error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'retry', delayMs: 600_000 }])).toBe(1);
    expect((await outbox.stats()).oldestPendingAgeMs).toBeGreaterThanOrEqual(stats.oldestPendingAgeMs);
    // A row appended now has its first due time written.
    await f.transaction(async (tx) => outbox.append(tx, [{ envelope: envelope(f.tablePrefix, 'd') }]));
    expect(await count('first_due_at IS NULL')).toBe(1);
    await outbox.close();
  });

  it('a schema at version 6 with rows in flight is upgraded to 7: a row leased under 6 is not claimed before its lease ends, then is, with a greater token; a due row is claimed, a delayed one is not', async () => {
    const f = await fixtureFor(dialect);
    const [leased, due, delayed] = [envelope(f.tablePrefix, 'a'), envelope(f.tablePrefix, 'b'), envelope(f.tablePrefix, 'c')];
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: leased }]));
    // Long enough for the upgrade to finish inside it on a loaded machine; the claim after the
    // upgrade must still find the lease live.
    const leaseMs = 5_000;
    const leasedAt = Date.now();
    const old = await f.outbox.claim({ owner: 'old-relay', limit: 10, leaseMs, perKey: 1 });
    expect(idsOf(old)).toEqual([leased.messageId]);
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: due }, { envelope: delayed, delayMs: 600_000 }]));
    // Back to what version 6 left: its claim kept the lease's end in available_at.
    await f.sql(`UPDATE ${f.table('outbox')} SET available_at = leased_until WHERE leased_until IS NOT NULL`);
    await f.sql(`ALTER TABLE ${f.table('outbox')} DROP COLUMN leased_until`);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 6 WHERE name = 'schema_version'`);
    const admin = courierSchemaAdmin({ orm: f.orm, tablePrefix: f.tablePrefix });
    expect(await admin.status()).toEqual({ current: 6, target: 7 });
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(outbox.checkSchema()).rejects.toThrow(/version 6, this release needs 7/);
    // Two upgrades racing, as two processes' ensureSchema() would.
    await Promise.all([admin.apply(), new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix }).ensureSchema()]);
    expect(await admin.pendingSql()).toEqual([]);
    const leasedRows = await f.sql(`SELECT COUNT(*) AS n FROM ${f.table('outbox')} WHERE leased_until IS NOT NULL`);
    expect(Number(leasedRows[0]?.['n'])).toBe(1);
    expect(await outbox.stats()).toMatchObject({ pending: 3, inFlight: 1 });
    // The lease taken under 6 still holds its row: only the due row is claimed.
    const first = await outbox.claim({ owner: 'new-relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    expect(Date.now() - leasedAt).toBeLessThan(leaseMs);
    expect(idsOf(first)).toEqual([due.messageId]);
    expect(first.lease.token).toBeGreaterThan(old.lease.token);
    // Once the lease ends, the row is claimed again, under a greater token; the delayed row still waits.
    let again = await outbox.claim({ owner: 'new-relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    while (again.records.length === 0 && Date.now() - leasedAt < leaseMs + 30_000) {
      await sleep(100);
      again = await outbox.claim({ owner: 'new-relay', limit: 10, leaseMs: 60_000, perKey: 1 });
    }
    expect(Date.now() - leasedAt).toBeGreaterThanOrEqual(leaseMs - 100);
    expect(idsOf(again)).toEqual([leased.messageId]);
    expect(again.lease.token).toBeGreaterThan(first.lease.token);
    // The old relay's late completion is fenced off; the new lease completes it.
    expect(await outbox.complete(old.lease, old.records.map((record) => record.sequence))).toBe(0);
    expect(await outbox.complete(again.lease, again.records.map((record) => record.sequence))).toBe(1);
    expect(await outbox.stats()).toMatchObject({ pending: 2, inFlight: 1 });
    await outbox.close();
  }, 60_000);

  // SQLite and MySQL have no ADD COLUMN IF NOT EXISTS: a v5 migration that stopped half-way
  // (a column added, the version not yet 5, the migrator's record not written) failed on its
  // re-run with "duplicate column", and on MariaDB one ALTER adding all three failed whole, so
  // ensureSchema() skipped it as "already upgraded" and set version 5 with two columns missing.
  it.each(['migration', 'ensureSchema'] as const)('a v4 outbox with one of the three v5 columns already there is upgraded by the %s: only the missing columns are added', async (how) => {
    const id = testId();
    const tablePrefix = `${id}_`;
    const f = await fixtureFor(dialect, {
      withoutSchema: true,
      orm: { extensions: [Migrator], migrations: { tableName: `${id}_migrations`, migrationsList: courierMigrations({ tablePrefix }).slice(4), silent: true, snapshot: false } },
    });
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix });
    await outbox.ensureSchema();
    const table = f.table('outbox').replace(f.tablePrefix, tablePrefix);
    for (const column of ['error_name', 'first_failed_at']) await f.sql(`ALTER TABLE ${table} DROP COLUMN ${column}`);
    await f.sql(`UPDATE ${f.table('meta').replace(f.tablePrefix, tablePrefix)} SET value = 4 WHERE name = 'schema_version'`);
    const admin = courierSchemaAdmin({ orm: f.orm, tablePrefix });
    expect(await admin.status()).toEqual({ current: 4, target: 7 });
    if (how === 'migration') expect((await f.orm.getMigrator().up()).map((migration) => migration.name)).toEqual([`Courier_${tablePrefix}v5`, `Courier_${tablePrefix}v6`, `Courier_${tablePrefix}v7`]);
    else await admin.apply();
    expect(await admin.status()).toEqual({ current: 7, target: 7 });
    // Every column is there and used: a dead row keeps its code, class name and first failure.
    const message = envelope(tablePrefix, 'k');
    await f.transaction(async (tx) => outbox.append(tx, [{ envelope: message }]));
    const batch = await outbox.claim({ owner: 'r', limit: 10, leaseMs: 60_000, perKey: 1 });
    await outbox.fail(batch.lease, batch.records.map((record) => ({ sequence: record.sequence, error: 'TransportError [PUBLISH_UNROUTABLE]: x', outcome: 'dead' as const, code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' })));
    const [dead] = await outbox.listDead();
    expect(dead).toMatchObject({ code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' });
    expect(dead!.firstFailedAt).toBeInstanceOf(Date);
    await outbox.close();
  });

  it('an outdated or newer schema version is reported instead of failing later', async () => {
    const f = await fixtureFor(dialect);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 0 WHERE name = 'schema_version'`);
    const stale = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix: f.tablePrefix });
    await expect(stale.checkSchema()).rejects.toThrow(/version 0, this release needs 7/);
    await f.sql(`UPDATE ${f.table('meta')} SET value = 99 WHERE name = 'schema_version'`);
    await expect(new MikroOrmInboxStore({ orm: f.orm, tablePrefix: f.tablePrefix }).checkSchema()).rejects.toThrow(/newer than this release/);
  });

  it('ensureSchema is idempotent and safe to race', async () => {
    const f = await fixtureFor(dialect);
    await Promise.all([f.outbox.ensureSchema(), f.inbox.ensureSchema(), f.outbox.ensureSchema()]);
    const message = envelope(f.tablePrefix, 'k');
    await f.transaction(async (tx) => f.outbox.append(tx, [{ envelope: message }]));
    await f.outbox.ensureSchema();
    expect(idsOf(await claimAll(f))).toEqual([message.messageId]);
  });

  it("courierMigrations() run by the application's own MikroORM migrator creates a working schema, and down() drops it", async () => {
    const id = testId();
    const tablePrefix = `${id}_`;
    const f = await fixtureFor(dialect, {
      withoutSchema: true,
      orm: {
        extensions: [Migrator],
        // No snapshot: writing one introspects every table of the shared test database, and a table
        // that parallel tests create between MikroORM's two introspection queries crashes it.
        migrations: { tableName: `${id}_migrations`, migrationsList: courierMigrations({ tablePrefix }), silent: true, snapshot: false },
      },
    });
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, tablePrefix });
    await expect(outbox.checkSchema()).rejects.toMatchObject({ code: 'SCHEMA_MISSING' });
    const migrator = f.orm.getMigrator();
    const applied = await migrator.up();
    expect(applied.map((migration) => migration.name)).toEqual([`Courier_${tablePrefix}v1`, `Courier_${tablePrefix}v2`, `Courier_${tablePrefix}v3`, `Courier_${tablePrefix}v4`, `Courier_${tablePrefix}v5`, `Courier_${tablePrefix}v6`, `Courier_${tablePrefix}v7`]);
    await outbox.checkSchema();
    const message = envelope(tablePrefix, 'k');
    await f.transaction(async (tx) => outbox.append(tx, [{ envelope: message }]));
    expect(idsOf(await outbox.claim({ owner: 'r', limit: 10, leaseMs: 10_000, perKey: 1 }))).toEqual([message.messageId]);
    const inbox = new MikroOrmInboxStore({ orm: f.orm, tablePrefix });
    expect(await inbox.run('m-1', 'c', async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
    await migrator.down({ to: 0 });
    await expect(new MikroOrmOutboxStore({ orm: f.orm, tablePrefix }).checkSchema()).rejects.toMatchObject({ code: 'SCHEMA_MISSING' });
    await outbox.close();
    await inbox.close();
  });

  // A halted head and the messages held behind it were acknowledged to the broker when the
  // inbox kept them: v3's down dropped the halt tables and lost them (issue 29).
  it('down() of v3 refuses while the halt tables keep messages, and drops them once they are empty', async () => {
    const id = testId();
    const tablePrefix = `${id}_`;
    const f = await fixtureFor(dialect, {
      withoutSchema: true,
      orm: {
        extensions: [Migrator],
        migrations: { tableName: `${id}_migrations`, migrationsList: courierMigrations({ tablePrefix }), silent: true, snapshot: false },
      },
    });
    const migrator = f.orm.getMigrator();
    await migrator.up();
    const inbox = new MikroOrmInboxStore({ orm: f.orm, tablePrefix });
    const head = envelope(tablePrefix, 'k');
    const behind = envelope(tablePrefix, 'k');
    expect(await inbox.halt('billing', head.topic, 'k', head, 'E: poison')).toBe('halted');
    expect(await inbox.halt('billing', behind.topic, 'k', behind, 'E: held')).toBe('held');
    // The migrator wraps what a migration throws (umzug's MigrationError): ours is its cause.
    let refusal: unknown = await migrator.down({ to: `Courier_${tablePrefix}v2` }).then(
      () => undefined,
      (error: unknown) => error,
    );
    while (refusal instanceof Error && !(refusal instanceof StorageError) && refusal.cause !== undefined) refusal = refusal.cause;
    expect(refusal, 'down() of v3 must refuse while messages are kept').toBeInstanceOf(StorageError);
    expect((refusal as StorageError).retriable).toBe(false);
    expect((refusal as Error).message).toContain(`refusing to undo migration 'Courier_${tablePrefix}v3': 1 row(s) in `);
    expect((refusal as Error).message).toMatch(/inbox_halts.*1 row\(s\) in .*inbox_held/);
    // Nothing was lost: the key is still halted, its held message behind it.
    expect((await inbox.listHalted()).map((key) => [key.consumer, key.key])).toEqual([['billing', 'k']]);
    const names = resolveTableNames({ tablePrefix });
    const connection = f.orm.em.getConnection();
    for (const table of [names.inboxHalts, names.inboxHeld]) await connection.execute(`DELETE FROM ${table}`);
    await migrator.down({ to: `Courier_${tablePrefix}v2` });
    await expect(inbox.listHalted()).rejects.toBeInstanceOf(StorageError);
    await migrator.down({ to: 0 });
    await inbox.close();
  });
});

describe('names', () => {
  it('derives every object name from the prefix and validates it', () => {
    const names = resolveTableNames({ tablePrefix: 'app_courier_' });
    expect(names).toMatchObject({ outbox: 'app_courier_outbox', inbox: 'app_courier_inbox', meta: 'app_courier_meta', inboxStarts: 'app_courier_inbox_starts' });
    expect(resolveTableNames().outbox).toBe('courier_outbox');
    expect(() => resolveTableNames({ tablePrefix: 'bad-prefix', schema: 'no.dots' })).toThrow(ConfigError);
    try {
      resolveTableNames({ tablePrefix: 'bad-prefix', schema: 'no.dots' });
    } catch (error) {
      expect((error as ConfigError).problems).toHaveLength(2);
    }
    expect(resolveTableNames({ schema: 'a' }).channel).not.toBe(resolveTableNames({ schema: 'b' }).channel);
  });

  it('PostgreSQL: tables can live in a schema of their own', async () => {
    const id = testId();
    const f = await fixtureFor('postgresql');
    const outbox = new MikroOrmOutboxStore({ orm: f.orm, schema: id });
    const inbox = new MikroOrmInboxStore({ orm: f.orm, schema: id });
    await outbox.ensureSchema();
    const rows = await f.sql(`SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY table_name`, [id]);
    expect(rows.map((row) => row['table_name'])).toEqual(['courier_inbox', 'courier_inbox_halts', 'courier_inbox_held', 'courier_inbox_parked', 'courier_inbox_starts', 'courier_meta', 'courier_outbox']);
    const message = envelope(id, 'k');
    await f.transaction(async (tx) => outbox.append(tx, [{ envelope: message }]));
    expect(idsOf(await outbox.claim({ owner: 'r', limit: 10, leaseMs: 10_000, perKey: 1 }))).toEqual([message.messageId]);
    expect(await inbox.run('m', 'c', async () => 1)).toEqual({ duplicate: false, value: 1 });
    await outbox.close();
    await inbox.close();
    await f.sql(`DROP SCHEMA "${id}" CASCADE`);
  });

  it('PostgreSQL: the outbox is created half full (room for the lease version on its page) and to be autovacuumed after a fixed number of dead rows, not a share of the table', async () => {
    const f = await fixtureFor('postgresql');
    const rows = await f.sql(`SELECT reloptions FROM pg_class WHERE oid = ?::regclass`, [`"${f.tablePrefix}outbox"`]);
    expect(rows[0]?.['reloptions']).toEqual(['fillfactor=50', 'autovacuum_vacuum_scale_factor=0', 'autovacuum_vacuum_threshold=10000']);
    // Set at creation only: ensureSchema on an existing table keeps what a DBA chose.
    await f.sql(`ALTER TABLE "${f.tablePrefix}outbox" SET (autovacuum_vacuum_threshold = 500)`);
    await f.outbox.ensureSchema();
    const after = await f.sql(`SELECT reloptions FROM pg_class WHERE oid = ?::regclass`, [`"${f.tablePrefix}outbox"`]);
    expect(after[0]?.['reloptions']).toEqual(['fillfactor=50', 'autovacuum_vacuum_scale_factor=0', 'autovacuum_vacuum_threshold=500']);
  });

  it('SQLite refuses a schema', async () => {
    const f = await fixtureFor('sqlite');
    expect(() => new MikroOrmOutboxStore({ orm: f.orm, schema: 'other' })).toThrow(/not supported on SQLite/);
  });
});
