// The claim and prune paths must not depend on the size of the table: with ~100k rows
// (mostly published history, some pending, some dead) every statement the stores run
// for claim and prune is EXPLAINed, and none may scan a Courier table sequentially
// (PostgreSQL) or scan it fully / sort it with a filesort (MariaDB).
import { afterEach, describe, expect, it } from 'vitest';
import { NOT_PUBLISHED_AT } from '@courier/sql-engine';
import { createMikroOrmFixture, type FixtureDialect, type MikroOrmFixture } from './support/fixture.js';
import { testId } from './support/helpers.js';

const ROWS = 100_000;
const open: MikroOrmFixture[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((fixture) => fixture.close()));
});

interface Captured {
  readonly sql: string;
  readonly params: readonly unknown[];
}

/** A fresh fixture whose ORM records every statement it sends (closed after each test). */
async function capturing(dialect: FixtureDialect): Promise<{ fixture: MikroOrmFixture; captured: Captured[] }> {
  const captured: Captured[] = [];
  const fixture = await createMikroOrmFixture(
    dialect,
    { testId: testId() },
    {
      orm: {
        onQuery: (sql: string, params: readonly unknown[]) => {
          captured.push({ sql, params: [...params] });
          return sql;
        },
      },
    },
  );
  open.push(fixture);
  return { fixture, captured };
}

async function seeded(dialect: FixtureDialect): Promise<{ fixture: MikroOrmFixture; captured: Captured[]; reseed: () => Promise<void> }> {
  const { fixture, captured } = await capturing(dialect);
  let offset = 0;
  const seed = async () => {
    const outbox = fixture.table('outbox');
    const inbox = fixture.table('inbox');
    const starts = fixture.table('inbox_starts');
    // 97% published an hour ago, 2% pending (due), 1% dead; 5000 keys.
    if (dialect === 'postgresql') {
      await fixture.sql(
        `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at, published_at) ` +
          `SELECT 'seed-' || (i + ${offset}), 'seed.Type', 1, 'seed', 'k' || (i % 5000), md5('seed' || (i % 5000)), '2024-01-01T00:00:00.000Z', 'seed-' || (i + ${offset}), '{}', '{}', ` +
          `CASE WHEN i % 100 < 97 THEN 'published' WHEN i % 100 < 99 THEN 'pending' ELSE 'dead' END, now() - interval '1 hour', 0, now() - interval '1 hour', ` +
          `CASE WHEN i % 100 < 97 THEN now() - interval '1 hour' END FROM generate_series(1, ${ROWS}) AS i`,
      );
      await fixture.sql(`INSERT INTO ${inbox} (message_id, consumer, processed_at) SELECT 'm-' || (i + ${offset}), 'c', now() - (i % 2) * interval '1 day' FROM generate_series(1, ${ROWS}) AS i`);
      await fixture.sql(`INSERT INTO ${starts} (message_id, consumer, starts, updated_at) SELECT 'm-' || (i + ${offset}), 'c', 1, now() - (i % 2) * interval '1 day' FROM generate_series(1, ${ROWS}) AS i`);
      for (const table of [outbox, inbox, starts]) await fixture.sql(`ANALYZE ${table}`);
    } else {
      await fixture.sql(
        `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at, published_at) ` +
          `SELECT CONCAT('seed-', seq + ${offset}), 'seed.Type', 1, 'seed', CONCAT('k', seq % 5000), MD5(CONCAT('seed', seq % 5000)), '2024-01-01T00:00:00.000Z', CONCAT('seed-', seq + ${offset}), '{}', '{}', ` +
          `CASE WHEN seq % 100 < 97 THEN 'published' WHEN seq % 100 < 99 THEN 'pending' ELSE 'dead' END, UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, 0, UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, ` +
          `CASE WHEN seq % 100 < 97 THEN UTC_TIMESTAMP(3) - INTERVAL 1 HOUR ELSE '${NOT_PUBLISHED_AT}' END FROM seq_1_to_${ROWS}`,
      );
      await fixture.sql(`INSERT INTO ${inbox} (message_id, consumer, processed_at) SELECT CONCAT('m-', seq + ${offset}), 'c', UTC_TIMESTAMP(3) - INTERVAL (seq % 2) DAY FROM seq_1_to_${ROWS}`);
      await fixture.sql(`INSERT INTO ${starts} (message_id, consumer, starts, updated_at) SELECT CONCAT('m-', seq + ${offset}), 'c', 1, UTC_TIMESTAMP(3) - INTERVAL (seq % 2) DAY FROM seq_1_to_${ROWS}`);
      for (const table of [outbox, inbox, starts]) await fixture.sql(`ANALYZE TABLE ${table}`);
    }
    offset += ROWS;
  };
  await seed();
  captured.length = 0;
  return { fixture, captured, reseed: seed };
}

function relevantStatements(fixture: MikroOrmFixture, captured: Captured[]): string[] {
  const platform = fixture.orm.em.getPlatform();
  const relevant = new Set<string>();
  for (const { sql, params } of captured.splice(0)) {
    if (!/^\s*(SELECT|UPDATE|DELETE|WITH)/i.test(sql)) continue;
    if (!sql.includes(`${fixture.tablePrefix}outbox`) && !sql.includes(`${fixture.tablePrefix}inbox`)) continue;
    if (sql.includes(`${fixture.tablePrefix}outbox_locks`) || /schema_version|lease_token'/.test(sql)) continue;
    relevant.add(platform.formatQuery(sql, [...params]));
  }
  return [...relevant];
}

/**
 * Runs the claim paths on the full table and returns their statements; then runs both
 * prunes, seeds the table full again and returns the prune statements, so that every
 * statement is explained against ~100k rows.
 */
async function claimAndPruneStatements(fixture: MikroOrmFixture, captured: Captured[], reseed: () => Promise<void>): Promise<{ claims: string[]; prunes: string[] }> {
  const head = await fixture.outbox.claim({ owner: 'explain', limit: 50, leaseMs: 60_000, perKey: 1 });
  expect(head.records.length).toBe(50);
  const runs = await fixture.outbox.claim({ owner: 'explain', limit: 100, leaseMs: 60_000, perKey: 4 });
  expect(runs.records.length).toBe(100);
  await fixture.outbox.complete(head.lease, head.records.map((record) => record.sequence));
  const claims = relevantStatements(fixture, captured);
  await fixture.outbox.prune(60_000, { batchSize: 10_000 });
  await fixture.inbox.prune(3_600_000, { batchSize: 10_000 });
  const prunes = relevantStatements(fixture, captured);
  await reseed();
  return { claims, prunes };
}

interface PgPlanNode {
  readonly 'Node Type': string;
  readonly 'Relation Name'?: string;
  readonly Plans?: readonly PgPlanNode[];
}

function pgScans(node: PgPlanNode, out: string[] = []): string[] {
  if (node['Node Type'] === 'Seq Scan') out.push(`Seq Scan on ${node['Relation Name']}`);
  for (const child of node.Plans ?? []) pgScans(child, out);
  return out;
}

describe('claim and prune stay on indexes with a 100k-row backlog', () => {
  it('PostgreSQL: no sequential scan of a Courier table in any claim or prune statement', { timeout: 120_000 }, async () => {
    const { fixture, captured, reseed } = await seeded('postgresql');
    const { claims, prunes } = await claimAndPruneStatements(fixture, captured, reseed);
    const statements = [...claims, ...prunes];
    expect(statements.some((sql) => sql.includes('SKIP LOCKED') && sql.startsWith('WITH'))).toBe(true);
    expect(statements.some((sql) => sql.startsWith('DELETE'))).toBe(true);
    const problems: string[] = [];
    for (const sql of statements) {
      const [row] = await fixture.sql(`EXPLAIN (FORMAT JSON) ${sql}`);
      const plan = (row?.['QUERY PLAN'] as { Plan: PgPlanNode }[])[0]!.Plan;
      const scans = pgScans(plan).filter((scan) => scan.includes(fixture.tablePrefix));
      if (scans.length > 0) problems.push(`${scans.join(', ')} in: ${sql.slice(0, 300)}`);
    }
    expect(problems).toEqual([]);
  });

  it.each(['mariadb', 'mysql-driver'] as const)('MariaDB (%s): no full scan and no filesort in any claim or prune statement', { timeout: 120_000 }, async (dialect) => {
    const { fixture, captured, reseed } = await seeded(dialect);
    const { claims, prunes } = await claimAndPruneStatements(fixture, captured, reseed);
    const statements = [...claims, ...prunes];
    expect(statements.some((sql) => sql.includes('SKIP LOCKED'))).toBe(true);
    expect(statements.some((sql) => sql.startsWith('DELETE'))).toBe(true);
    const problems: string[] = [];
    for (const sql of statements) {
      const rows = await fixture.sql(`EXPLAIN ${sql}`);
      for (const row of rows) {
        const table = String(row['table'] ?? '');
        if (table.startsWith('<')) continue; // derived / union result, built from the rows checked here
        const extra = String(row['Extra'] ?? '');
        if (row['type'] === 'ALL' || /filesort/i.test(extra)) {
          problems.push(`${table}: type ${String(row['type'])}, ${extra} in: ${sql.slice(0, 300)}`);
        }
      }
    }
    expect(problems).toEqual([]);
  });
});

// A mostly keyless outbox near the end of a drain: InnoDB counts every NULL key hash as one
// value, so the probe's lookup on key_ix is estimated at the whole table and a range over
// the few pending rows of a `state` index looked cheaper to the optimizer. That range has no
// NULL shortcut: each keyless head read every earlier pending row (bench/README.md, "The
// MariaDB keyless drain at 100k — cause"). The rows are inserted in their final state, so no
// delete-marked entries inflate the range's estimate, as on a drained table after purge.
describe('MariaDB: the head scan probes key_ix on a mostly keyless outbox', () => {
  it.each(['mariadb', 'mysql-driver'] as const)('%s: the NOT EXISTS probe uses key_ix with 20,000 keyless rows, 200 pending', { timeout: 60_000 }, async (dialect) => {
    const { fixture, captured } = await capturing(dialect);
    const outbox = fixture.table('outbox');
    await fixture.sql(
      `INSERT INTO ${outbox} (message_id, message_type, message_version, topic, msg_key, key_hash, occurred_at, correlation_id, headers, payload, state, available_at, attempts, created_at, published_at) ` +
        `SELECT CONCAT('seed-', seq), 'seed.Type', 1, 'seed', NULL, NULL, '2024-01-01T00:00:00.000Z', CONCAT('seed-', seq), '{}', '{}', ` +
        `CASE WHEN seq <= 19800 THEN 'published' ELSE 'pending' END, UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, 0, UTC_TIMESTAMP(3) - INTERVAL 1 HOUR, ` +
        `CASE WHEN seq <= 19800 THEN UTC_TIMESTAMP(3) - INTERVAL 1 HOUR ELSE '${NOT_PUBLISHED_AT}' END FROM seq_1_to_20000`,
    );
    await fixture.sql(`ANALYZE TABLE ${outbox}`);
    captured.length = 0;
    const batch = await fixture.outbox.claim({ owner: 'explain', limit: 50, leaseMs: 60_000, perKey: 1 });
    expect(batch.records.length).toBe(50);
    const heads = relevantStatements(fixture, captured).filter((sql) => sql.includes('SKIP LOCKED') && sql.includes('NOT EXISTS'));
    expect(heads.length).toBe(1);
    const probe = (await fixture.sql(`EXPLAIN ${heads[0]!}`)).find((row) => row['table'] === 'e');
    expect(probe?.['key']).toBe(`${fixture.tablePrefix}outbox_key_ix`);
  });
});
