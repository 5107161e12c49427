// What joining a Prisma interactive transaction means beyond the conformance suite: the
// refusals name Prisma's own API, a nested $transaction (a savepoint) that rolls back takes
// the message with it, and the migration SQL Courier prints creates a schema the stores accept.
import { ConfigError, createBus, defineMessage, InMemoryBroker } from '@courier/core';
import { uniqueId } from '@courier/conformance';
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { courierMigrationSql, PrismaOutboxStore, prismaSchemaAdmin } from '../src/index.js';
import { createPrismaFixture, FIXTURE_TRANSACTION_OPTIONS, openPrisma, PG_URL, type PrismaFixture } from './support/fixture.js';

const Ping = defineMessage('prisma.Ping', { version: 1 });
const fixtures: PrismaFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function setup() {
  const fixture = await createPrismaFixture('postgresql', { testId: uniqueId() });
  fixtures.push(fixture);
  const transport = new InMemoryBroker().connect();
  const bus = createBus({ outbox: fixture.outbox, transport });
  const count = async () => Number((await fixture.prisma.$queryRawUnsafe<{ n: bigint }[]>(`SELECT count(*) AS n FROM ${fixture.table('outbox')}`))[0]?.n);
  return { fixture, bus, count };
}

describe('@courier/prisma on PostgreSQL', () => {
  it('refuses the PrismaClient itself (it would autocommit) with a ConfigError naming $transaction, writing nothing', async () => {
    const { fixture, bus, count } = await setup();
    const error = await Promise.resolve()
      .then(() => bus.outbox(fixture.prisma as never).publish(Ping, { n: 1 }))
      .catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).code).toBe('UNIT_OF_WORK_REQUIRED');
    expect((error as Error).message).toContain('prisma.$transaction(async (tx)');
    expect(await count()).toBe(0);
  });

  it('refuses a transaction client whose transaction has ended, with UNIT_OF_WORK_ENDED', async () => {
    const { fixture, bus, count } = await setup();
    const ended = await fixture.transaction(async (tx) => tx);
    const error = await bus.outbox(ended).publish(Ping, { n: 1 }).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).code).toBe('UNIT_OF_WORK_ENDED');
    expect(await count()).toBe(0);
  });

  it('refuses a transaction client as the store\'s client', async () => {
    const { fixture } = await setup();
    await fixture.transaction(async (tx) => {
      expect(() => new PrismaOutboxStore({ prisma: tx as never })).toThrow(/client of an interactive transaction/);
    });
  });

  it('a nested $transaction (savepoint) that rolls back after publishing leaves nothing; the outer transaction commits its own message', async () => {
    const { fixture, bus, count } = await setup();
    const kept = await fixture.transaction(async (tx) => {
      const id = await bus.outbox(tx).publish(Ping, { n: 1 });
      await (tx as unknown as typeof fixture.prisma)
        .$transaction(async (inner) => {
          await bus.outbox(inner).publish(Ping, { n: 2 });
          throw new Error('roll the savepoint back');
        })
        .catch((error: unknown) => {
          if (!(error instanceof Error) || error.message !== 'roll the savepoint back') throw error;
        });
      return id;
    });
    const rows = await fixture.prisma.$queryRawUnsafe<{ message_id: string }[]>(`SELECT message_id FROM ${fixture.table('outbox')}`);
    expect(rows.map((row) => row.message_id)).toEqual([kept]);
    expect(await count()).toBe(1);
  });

  it('courierMigrationSql is one script (as prisma migrate applies it) that creates a schema the stores accept, and is idempotent', async () => {
    const tablePrefix = `${uniqueId()}_`;
    const script = courierMigrationSql({ provider: 'postgresql', tablePrefix });
    const client = new pg.Client({ connectionString: PG_URL });
    await client.connect();
    try {
      await client.query(script);
      await client.query(script);
    } finally {
      await client.end();
    }
    const prisma = await openPrisma('postgresql', tablePrefix);
    const outbox = new PrismaOutboxStore({ prisma, tablePrefix });
    try {
      const admin = prismaSchemaAdmin({ prisma, tablePrefix });
      expect(await admin.pendingSql()).toEqual([]);
      expect((await admin.status()).current).toBe((await admin.status()).target);
      const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
      const id = await prisma.$transaction((tx) => bus.outbox(tx).publish(Ping, { n: 1 }), FIXTURE_TRANSACTION_OPTIONS);
      const batch = await outbox.claim({ owner: 'test', limit: 10, leaseMs: 30_000, perKey: 1 });
      expect(batch.records.map((record) => record.envelope.messageId)).toEqual([id]);
    } finally {
      await outbox.close();
      await prisma.$disconnect();
    }
  });

  it('prismaSchemaAdmin (courier migrate) reads a missing schema as version 0 with the SQL to create it, creating nothing', async () => {
    const tablePrefix = `${uniqueId()}_`;
    const prisma = await openPrisma('postgresql', tablePrefix);
    try {
      const admin = prismaSchemaAdmin({ prisma, tablePrefix });
      expect((await admin.status()).current).toBe(0);
      expect((await admin.pendingSql()).length).toBeGreaterThan(0);
      const tables = await prisma.$queryRawUnsafe<unknown[]>(`SELECT 1 FROM pg_tables WHERE tablename LIKE '${tablePrefix}%'`);
      expect(tables).toEqual([]);
    } finally {
      await prisma.$disconnect();
    }
  });

  it('courierMigrationSql names a bad provider', () => {
    expect(() => courierMigrationSql({ provider: 'sqlserver' as never })).toThrow(/'provider' must be 'postgresql', 'mysql' or 'sqlite', got "sqlserver"/);
  });
});
