// The courier binary, run as a separate process against real PostgreSQL, MariaDB and
// SQLite: migrate and --check, stats on a seeded backlog, dead outbox rows listed, shown,
// replayed and purged, a halted key resumed with its order kept, prune under producer
// load, and the usage / unreachable-database exits.
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup, type Dialect } from './support/setup.js';

const LEASE = { leaseMs: 60_000, perKey: 1 } as const;

describe.each(['postgresql', 'mariadb', 'sqlite'] as Dialect[])('courier against %s', (dialect) => {
  const prefix = `cli${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: dialect, CLI_TEST_PREFIX: prefix };
  let stores: CliTestSetup;
  const topic = `t${prefix}`;
  const envelope = (key: string | null, overrides: Partial<Envelope> = {}): Envelope => makeEnvelope({ topic, key, type: 'cli.Tested', ...overrides });
  const append = (envelopes: readonly Envelope[]) =>
    stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, envelopes.map((item) => ({ envelope: item })));
    });

  beforeAll(async () => {
    stores = await openStores(dialect, prefix);
  });
  afterAll(async () => {
    await stores?.close();
  });

  it('migrate --check exits 1 on a missing schema, --print shows the SQL, migrate creates it, then --check exits 0', async () => {
    const before = await runCli(['migrate', '--check'], env);
    expect(before.code, before.stderr).toBe(1);
    expect(before.stderr).toMatch(/version 0, this release needs \d/);
    const printed = await runCli(['migrate', '--print'], env);
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout).toContain(`CREATE TABLE IF NOT EXISTS`);
    expect(printed.stdout).toContain(`${prefix}outbox`);
    expect((await stores.schema.status()).current).toBe(0); // --print changed nothing
    const applied = await runCli(['migrate'], env);
    expect(applied.code, applied.stderr).toBe(0);
    expect(applied.stdout).toMatch(/migrated the schema from version 0 to \d/);
    const after = await runCli(['migrate', '--check'], env);
    expect(after.code, after.stderr).toBe(0);
    expect((await runCli(['migrate', '--print'], env)).stdout).toContain('nothing to run');
  });

  // About 20 runs of the binary in a row: each starts Node, tsx and a database driver, which
  // takes seconds on a loaded 2-core machine, so the bound is generous.
  it('stats, dead list/show/replay/purge and halted list/resume act on the seeded outbox', { timeout: 900_000 }, async () => {
    await stores.outbox.ensureSchema();
    // Two rows that will die, one key that will halt with two rows held behind its head, three plain pending rows.
    const doomed = [envelope('d1'), envelope('d2', { type: 'cli.Other' })];
    const halted = [envelope('h'), envelope('h'), envelope('h')];
    await append([...doomed, halted[0]!]);
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    const seqOf = (item: Envelope) => batch.records.find((record) => record.envelope.messageId === item.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [
      { sequence: seqOf(doomed[0]!), error: 'TransportError [PUBLISH_UNROUTABLE]: no queue', outcome: 'dead' },
      { sequence: seqOf(doomed[1]!), error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'dead' },
      { sequence: seqOf(halted[0]!), error: 'TransportError [PUBLISH_REJECTED]: poison', outcome: 'halt' },
    ]);
    await append([halted[1]!, halted[2]!, envelope(null), envelope(null), envelope('p')]);

    // The inbox as a consumer leaves it: two handled, one dead-lettered and then replayed.
    const billing = `${prefix}billing`;
    for (const id of ['in-1', 'in-2']) await stores.inbox.run(id, billing, async () => undefined);
    await stores.inbox.run('in-3', `${billing}~dead`, async () => undefined);
    await stores.inbox.run('in-3', `${billing}~rerun`, async () => undefined);

    const stats = await runCli(['stats', '--json'], env);
    expect(stats.code, stats.stderr).toBe(0);
    const parsed = JSON.parse(stats.stdout) as { outbox: unknown; inbox: { consumers: unknown[] } };
    expect(parsed.outbox).toMatchObject({ pending: 5, dead: 2, haltedKeys: 1, inFlight: 0 });
    expect(parsed.inbox.consumers).toEqual([expect.objectContaining({ consumer: billing, records: 3, deadLetters: 1, replayed: 1 })]);
    const text = await runCli(['stats'], env);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(/CONSUMER\s+RECORDS\s+OLDEST\s+DEAD LETTERS\s+REPLAYED/);
    expect(text.stdout).toMatch(new RegExp(`${billing}\\s+3\\s+\\S+\\s+1\\s+1`));

    const listed = await runCli(['dead', 'list', '--json', '--topic', topic], env);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { ref: string; state: string; code: string }[];
    expect(items.map((item) => [item.ref, item.state, item.code])).toEqual([
      [`outbox:${seqOf(doomed[0]!)}`, 'dead', 'PUBLISH_UNROUTABLE'],
      [`outbox:${seqOf(doomed[1]!)}`, 'dead', 'PUBLISH_REJECTED'],
    ]); // a halted head is listed by `courier halted list`, not here
    const filtered = await runCli(['dead', 'list', '--json', '--code', 'PUBLISH_UNROUTABLE'], env);
    expect((JSON.parse(filtered.stdout) as { ref: string }[]).map((item) => item.ref)).toEqual([`outbox:${seqOf(doomed[0]!)}`]);
    const byType = await runCli(['dead', 'list', '--json', '--type', 'cli.Other'], env);
    expect((JSON.parse(byType.stdout) as { ref: string }[]).map((item) => item.ref)).toEqual([`outbox:${seqOf(doomed[1]!)}`]);
    expect(JSON.parse((await runCli(['dead', 'list', '--json', '--older-than', '1h'], env)).stdout)).toEqual([]);

    const shown = await runCli(['dead', 'show', `outbox:${seqOf(doomed[0]!)}`], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)[0].envelope).toMatchObject({ messageId: doomed[0]!.messageId, payload: doomed[0]!.payload });
    expect((await runCli(['dead', 'show', 'outbox:999999999'], env)).code).toBe(1);
    expect((await runCli(['dead', 'show', 'nonsense'], env)).code).toBe(2);

    // Destructive commands refuse without --yes when no terminal can answer, and --dry-run changes nothing.
    const refused = await runCli(['dead', 'purge', `outbox:${seqOf(doomed[1]!)}`], env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('--yes');
    const dry = await runCli(['dead', 'purge', '--all', '--code', 'PUBLISH_REJECTED', '--dry-run'], env);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain('dry run: would purge 1');
    expect((await stores.outbox.stats()).dead).toBe(2);

    const replayed = await runCli(['dead', 'replay', `outbox:${seqOf(doomed[0]!)}`, '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('replayed 1 outbox row(s)');
    const purged = await runCli(['dead', 'purge', `outbox:${seqOf(doomed[1]!)}`, '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(await stores.outbox.stats()).toMatchObject({ dead: 0, pending: 6, haltedKeys: 1 });
    // The replayed row is published with its original messageId.
    const claimed = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    expect(claimed.records.map((record) => record.envelope.messageId)).toContain(doomed[0]!.messageId);
    expect(claimed.records.map((record) => record.envelope.messageId)).not.toContain(halted[1]!.messageId);
    await stores.outbox.complete(claimed.lease, claimed.records.map((record) => record.sequence));

    const haltedList = await runCli(['halted', 'list', '--json'], env);
    expect(haltedList.code, haltedList.stderr).toBe(0);
    expect(JSON.parse(haltedList.stdout)).toMatchObject([{ topic, key: 'h', held: 2 }]);
    expect((await runCli(['halted', 'resume', topic, 'nope', '--yes'], env)).code).toBe(1);
    const resumed = await runCli(['halted', 'resume', topic, 'h', '--yes'], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    // Order within the key is kept: the head first, then the rows held behind it, one at a time.
    const order: string[] = [];
    for (let round = 0; round < 3; round += 1) {
      const next = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
      expect(next.records).toHaveLength(1);
      order.push(next.records[0]!.envelope.messageId);
      await stores.outbox.complete(next.lease, [next.records[0]!.sequence]);
    }
    expect(order).toEqual(halted.map((item) => item.messageId));
    expect(JSON.parse((await runCli(['stats', '--json'], env)).stdout).outbox).toMatchObject({ pending: 0, dead: 0, haltedKeys: 0 });
  });

  it('prune deletes published rows while producers keep committing', async () => {
    await stores.outbox.ensureSchema();
    const old = Array.from({ length: 300 }, (_, index) => envelope(`old-${index % 7}`));
    for (let start = 0; start < old.length; start += 100) await append(old.slice(start, start + 100));
    for (;;) {
      const batch = await stores.outbox.claim({ owner: 'test', limit: 1_000, ...LEASE });
      if (batch.records.length === 0) break;
      await stores.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
    }
    const pendingBefore = (await stores.outbox.stats()).pending;
    let producing = true;
    let commits = 0;
    const failures: unknown[] = [];
    const producer = (async () => {
      while (producing) {
        try {
          await append([envelope(`live-${commits % 5}`), envelope(null)]);
          commits += 1;
        } catch (error) {
          failures.push(error);
        }
      }
    })();
    const pruned = await runCli(['prune', '--older-than', '1ms', '--only', 'outbox', '--batch-size', '50'], env);
    producing = false;
    await producer;
    expect(pruned.code, pruned.stderr).toBe(0);
    // Only published rows go: at least the 300 old ones (and earlier cases' published rows), never a live pending one.
    const count = Number(/pruned (\d+) published/.exec(pruned.stdout)?.[1]);
    expect(count).toBeGreaterThanOrEqual(300);
    expect(failures).toEqual([]);
    expect(commits).toBeGreaterThan(0);
    expect((await stores.outbox.stats()).pending).toBe(pendingBefore + commits * 2);
  });

  // The case above prunes with a 1 ms cut-off, where ignoring --older-than deletes the same
  // rows (issue 29): here rows lie on both sides of a 7-day cut-off, in the outbox and the inbox.
  it('prune --older-than deletes only the rows older than the cut-off, outbox and inbox alike', async () => {
    await stores.outbox.ensureSchema();
    const tenDaysAgo = { postgresql: `now() - interval '10 days'`, mariadb: 'UTC_TIMESTAMP(3) - INTERVAL 10 DAY', sqlite: `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - 864000000` }[dialect];
    const execute = (sql: string, params: unknown[] = []) => stores.orm.em.getConnection().execute(sql, params, 'all') as Promise<Record<string, unknown>[]>;
    const marks = (ids: readonly string[]) => ids.map(() => '?').join(', ');
    const published = Array.from({ length: 12 }, (_, index) => envelope(`cut-${index}`));
    await append(published);
    for (;;) {
      const batch = await stores.outbox.claim({ owner: 'test', limit: 1_000, ...LEASE });
      if (batch.records.length === 0) break;
      await stores.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
    }
    const oldRows = published.slice(0, 5).map((item) => item.messageId);
    const newRows = published.slice(5).map((item) => item.messageId);
    await execute(`UPDATE ${prefix}outbox SET published_at = ${tenDaysAgo} WHERE message_id IN (${marks(oldRows)})`, oldRows);
    const consumer = `${prefix}cutoff`;
    const records = Array.from({ length: 9 }, (_, index) => `${prefix}record-${index}`);
    for (const id of records) await stores.inbox.run(id, consumer, async () => undefined);
    const oldRecords = records.slice(0, 4);
    await execute(`UPDATE ${prefix}inbox SET processed_at = ${tenDaysAgo} WHERE consumer = ? AND message_id IN (${marks(oldRecords)})`, [consumer, ...oldRecords]);

    const pruned = await runCli(['prune', '--older-than', '7d', '--batch-size', '2'], env);
    expect(pruned.code, pruned.stderr).toBe(0);
    // Every other row of this database was written within the last minutes: only the backdated ones are older than 7 days.
    expect(pruned.stdout).toContain('outbox: pruned 5 published row(s) older than 7d');
    expect(pruned.stdout).toContain('inbox: pruned 4 record(s) older than 7d');
    const outboxLeft = (await execute(`SELECT message_id FROM ${prefix}outbox WHERE message_id IN (${marks(published.map((item) => item.messageId))})`, published.map((item) => item.messageId))).map((row) => String(row['message_id']));
    expect(outboxLeft.sort()).toEqual([...newRows].sort());
    const inboxLeft = (await execute(`SELECT message_id FROM ${prefix}inbox WHERE consumer = ?`, [consumer])).map((row) => String(row['message_id']));
    expect(inboxLeft.sort()).toEqual(records.slice(4).sort());
  });

  it('exits 2 on a bad option and 1 with a remedy, no stack trace, when the database is unreachable', async () => {
    const bad = await runCli(['prune', '--older-than', 'seven days'], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain(`--older-than 'seven days' is not a duration`);
    if (dialect === 'sqlite') return; // a file database has no server to be unreachable
    const url = dialect === 'postgresql' ? 'postgres://nobody@127.0.0.1:1/none' : 'mysql://nobody@127.0.0.1:1/none';
    const down = await runCli(['stats'], { ...env, CLI_TEST_DB_URL: url });
    expect(down.code).toBe(1);
    expect(down.stderr).toContain('remedy:');
    expect(down.stderr).not.toMatch(/\n\s+at /);
  });
});
