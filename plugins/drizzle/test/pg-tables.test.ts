// courierPgTables() must describe exactly what ensureSchema() creates, or drizzle-kit would
// generate a migration that drifts from the tables the engine's SQL expects. Read back from
// PostgreSQL's catalog after ensureSchema(): every column (type, NOT NULL, has a default) and
// every index/constraint name, table by table; and the token sequence exists.
import { randomUUID } from 'node:crypto';
import { getTableConfig, PgTable } from 'drizzle-orm/pg-core';
import { is, sql } from 'drizzle-orm';
import { afterAll, expect, it } from 'vitest';
import { courierPgTables, DrizzleOutboxStore } from '../src/index.js';
import { openDrizzle } from './support/fixture.js';

const testId = `t${randomUUID().replaceAll('-', '').slice(0, 12)}`;
const tablePrefix = `${testId}_`;
let cleanup: (() => Promise<void>) | undefined;
afterAll(async () => cleanup?.());

/** Drizzle's SQL type names as PostgreSQL's format_type() spells them. */
function catalogType(drizzleType: string): string {
  return drizzleType
    .replace(/^varchar\((\d+)\)$/, 'character varying($1)')
    .replace(/^char\((\d+)\)$/, 'character($1)')
    .replace(/^bigserial$/, 'bigint');
}

it('courierPgTables matches the tables ensureSchema creates, column for column, index for index', async () => {
  const { db, close } = await openDrizzle('postgresql', testId);
  const store = new DrizzleOutboxStore({ db, tablePrefix });
  cleanup = async () => {
    await store.close();
    const tables = courierPgTables({ tablePrefix });
    for (const definition of Object.values(tables)) {
      if (is(definition, PgTable)) await db.execute(sql.raw(`DROP TABLE IF EXISTS "${getTableConfig(definition).name}"`));
    }
    await db.execute(sql.raw(`DROP SEQUENCE IF EXISTS "${tables.tokenSequence.seqName}"`));
    await close();
  };
  await store.ensureSchema();
  const definitions = Object.values(courierPgTables({ tablePrefix })).filter((value) => is(value, PgTable));
  expect(definitions).toHaveLength(7);
  for (const definition of definitions) {
    const config = getTableConfig(definition);
    const { rows: columns } = await db.execute(
      sql`SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null, a.atthasdef AS has_default
          FROM pg_attribute a WHERE a.attrelid = to_regclass(${config.name}) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`,
    );
    expect(columns.length, `table ${config.name} exists`).toBeGreaterThan(0);
    const expected = config.columns.map((column) => ({
      name: column.name,
      type: catalogType(column.getSQLType()),
      not_null: column.notNull,
      has_default: column.hasDefault || column.getSQLType() === 'bigserial',
    }));
    expect([...columns].sort((a, b) => String(a['name']).localeCompare(String(b['name']))), config.name).toEqual(
      expected.sort((a, b) => a.name.localeCompare(b.name)),
    );
    const { rows: indexes } = await db.execute(sql`SELECT indexname FROM pg_indexes WHERE tablename = ${config.name}`);
    const declared = [
      ...config.indexes.map((index) => index.config.name),
      ...config.uniqueConstraints.map((constraint) => constraint.getName()),
      ...config.primaryKeys.map((key) => key.getName()),
    ];
    const names = (indexes as Record<string, unknown>[]).map((row) => String(row['indexname'])).filter((name) => !name.endsWith('_pkey'));
    expect(names.sort(), config.name).toEqual(declared.filter((name): name is string => name !== undefined && !name.endsWith('_pk')).sort());
  }
  const sequence = courierPgTables({ tablePrefix }).tokenSequence.seqName;
  const { rows: sequences } = await db.execute(sql`SELECT relkind FROM pg_class WHERE oid = to_regclass(${sequence})`);
  expect(sequences).toEqual([{ relkind: 'S' }]);
});
