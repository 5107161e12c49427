// The courier binary with a courier.config.ts built on @courier/pg (node-postgres, no ORM):
// stats and dead list read the pg adapter's tables, and `courier relay` drains them to
// RabbitMQ and stops on SIGTERM with nothing leased — so the CLI takes any adapter, not
// only MikroORM.
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { eventually } from '@courier/conformance';
import { createBus, defineMessage } from '@courier/core';
import { PgInboxStore, PgOutboxStore, withTransaction } from '@courier/pg';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { PACKAGE_DIR, runCli, startCli } from './support/run-cli.js';
import { deleteBrokerObjects, openTransport, PG_URL } from './support/setup.js';

const PG_CONFIG = join(PACKAGE_DIR, 'test', 'support', 'pg.config.ts');
const LEASE = { leaseMs: 60_000, perKey: 1 } as const;

describe('courier with a @courier/pg config (postgresql + rabbitmq)', () => {
  const prefix = `clipg${randomBytes(4).toString('hex')}_`;
  const sinkName = `${prefix}sink`;
  const env = { CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: sinkName };
  const cleanup: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close().catch(() => undefined);
    await deleteBrokerObjects(prefix, [sinkName]);
  });

  it('stats and dead list read what pg wrote; relay drains it and stops on SIGTERM with nothing leased', { timeout: 240_000 }, async () => {
    const pool = new pg.Pool({ connectionString: PG_URL, max: 4 });
    pool.on('error', () => undefined);
    cleanup.push(() => pool.end());
    const outbox = new PgOutboxStore({ pool, tablePrefix: prefix });
    const inbox = new PgInboxStore({ pool, tablePrefix: prefix });
    cleanup.push(() => inbox.close(), () => outbox.close());
    await outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Work = defineMessage('cli.PgWork', { version: 1, topic: `${prefix}work` });
    const copies = new Map<string, number>();
    const subscription = await transport.subscribe({ consumer: sinkName, topics: [Work.topic], ordered: false, concurrency: 16 }, async (delivery) => {
      copies.set(delivery.envelope.messageId, (copies.get(delivery.envelope.messageId) ?? 0) + 1);
      await delivery.ack();
    });
    cleanup.push(() => subscription.close());

    // Two rows dead (as a relay leaves them), then a backlog, each written on a PoolClient in BEGIN … COMMIT.
    const producer = createBus({ outbox, transport });
    const doomed = await withTransaction(pool, async (client) => [
      await producer.outbox(client).publish(Work, { n: -1 }, { key: 'd1' }),
      await producer.outbox(client).publish(Work, { n: -2 }, { key: 'd2' }),
    ]);
    const batch = await outbox.claim({ owner: 'test', limit: 10, ...LEASE });
    expect(batch.records.map((record) => record.envelope.messageId).sort()).toEqual([...doomed].sort());
    await outbox.fail(
      batch.lease,
      batch.records.map((record) => ({ sequence: record.sequence, error: 'TransportError [PUBLISH_UNROUTABLE]: no queue', outcome: 'dead' as const })),
    );
    const total = 300;
    for (let chunk = 0; chunk < total; chunk += 100) {
      await withTransaction(pool, async (client) => {
        for (let index = chunk; index < chunk + 100; index += 1) await producer.outbox(client).publish(Work, { n: index }, index % 2 === 0 ? {} : { key: `k-${index % 8}` });
      });
    }
    // The inbox as a consumer leaves it: two handled, one dead-lettered.
    const billing = `${prefix}billing`;
    for (const id of ['in-1', 'in-2']) await inbox.run(id, billing, async () => undefined);
    await inbox.run('in-3', `${billing}~dead`, async () => undefined);

    const stats = await runCli(['stats', '--json'], env, 60_000, PG_CONFIG);
    expect(stats.code, stats.stderr).toBe(0);
    const parsed = JSON.parse(stats.stdout) as { outbox: unknown; inbox: { consumers: unknown[] } };
    expect(parsed.outbox).toMatchObject({ pending: total, dead: 2, inFlight: 0 });
    expect(parsed.inbox.consumers).toEqual([expect.objectContaining({ consumer: billing, records: 2, deadLetters: 1 })]);
    const listed = await runCli(['dead', 'list', '--json', '--topic', Work.topic], env, 60_000, PG_CONFIG);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { ref: string; state: string; code: string; messageId?: string }[];
    expect(items.map((item) => [item.ref, item.state, item.code])).toEqual(
      batch.records.map((record) => [`outbox:${record.sequence}`, 'dead', 'PUBLISH_UNROUTABLE']).sort((a, b) => a[0]!.localeCompare(b[0]!, 'en', { numeric: true })),
    );

    // The relay process drains the backlog through the pg adapter, then stops on SIGTERM.
    const relay = startCli(['relay', '--port', '0', '--stop-timeout', '20s'], env, PG_CONFIG);
    let output = '';
    relay.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    relay.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => relay.on('close', (code) => resolve(code)));
    cleanup.push(async () => {
      if (relay.exitCode === null) relay.kill('SIGKILL');
    });
    await eventually(() => expect(copies.size, `relay output: ${output.slice(-2_000)}`).toBe(total), { timeoutMs: 120_000, intervalMs: 100 });
    relay.kill('SIGTERM');
    expect(await exited, output.slice(-2_000)).toBe(0);
    expect([...copies.keys()].filter((id) => doomed.includes(id)), 'dead rows stay dead').toEqual([]);
    const leased = await pool.query<{ n: string }>(`SELECT COUNT(*) AS n FROM "${prefix}outbox" WHERE state = 'pending' AND lease_token IS NOT NULL`);
    expect(Number(leased.rows[0]!.n)).toBe(0);
    const after = await runCli(['stats', '--json'], env, 60_000, PG_CONFIG);
    expect(after.code, after.stderr).toBe(0);
    expect((JSON.parse(after.stdout) as { outbox: unknown }).outbox).toMatchObject({ pending: 0, dead: 2, inFlight: 0 });
  });
});
