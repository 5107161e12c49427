// The transport, like the stores, gives every connection of the application's ORM the
// SQLite busy timeout when it opens: @mikro-orm/libsql 6.6.16 replaces its connection every
// 10 s and libsql opens it with none, so the application's own transactions on the shared
// file would fail at once with "database is locked" (and wedge the connection). The store's
// test (plugins/mikro-orm/test/sqlite-fresh-connection.test.ts) shows that failure with a
// second process; this one checks that the transport alone sets the timeout.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually } from '@courier/conformance';
import type { MikroORM } from '@mikro-orm/core';
import { MikroORM as LibSqlOrm } from '@mikro-orm/libsql';
import { afterEach, describe, expect, it } from 'vitest';
import { SqlTransport } from '../src/index.js';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

type PoolClient = { acquireConnection(): Promise<unknown>; releaseConnection(connection: unknown): Promise<void> };

async function rawConnection(orm: MikroORM): Promise<unknown> {
  const client = (orm.em.getConnection() as unknown as { getKnex(): { client: PoolClient } }).getKnex().client;
  const raw = await client.acquireConnection();
  await client.releaseConnection(raw);
  return raw;
}

describe('sql transport on a SQLite file', () => {
  it('gives a connection the ORM opens later the 30 s busy timeout', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'courier-sql-transport-connections-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const orm = (await LibSqlOrm.init({ dbName: join(dir, 'queue.db'), entities: [], discovery: { warnWhenNoEntities: false }, debug: false })) as unknown as MikroORM;
    cleanups.push(() => orm.close(true));
    const transport = new SqlTransport({ orm });
    cleanups.push(() => transport.close());
    await transport.ensureSchema();

    const first = await rawConnection(orm);
    await eventually(async () => expect(await rawConnection(orm)).not.toBe(first), { timeoutMs: 30_000, intervalMs: 500 });
    // Outside any transaction of the transport's: what the application's own statements get.
    const rows = await orm.em.getConnection().execute('PRAGMA busy_timeout', [], 'all');
    expect(rows).toEqual([{ timeout: 30_000 }]);
  }, 60_000);
});
