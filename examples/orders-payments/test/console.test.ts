// `courier console` run the way the README says, on this folder's courier.config.ts (a kept
// postgres-rabbitmq run's schema `example_<run id>`, the payments service's tables): the
// CLI from its sources as `pnpm courier` runs it, with named tokens. The page's API shows
// the payments outbox's dead rows grouped under one error, a viewer cannot retry them, an
// operator retries the group once (the stats then count them pending, not dead; a second
// retry changes nothing) and the audit line names the operator. About 15 s.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeEnvelope } from '@courier/conformance';
import { MikroOrmInboxStore, MikroOrmOutboxStore } from '@courier/mikro-orm';
import { rabbitMqNames } from '@courier/rabbitmq';
import { connect, type ChannelModel } from 'amqplib';
import type { EntityManager, MikroORM } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openPostgresOrm, TABLE_PREFIXES } from '../src/databases.js';
import { DELAY_TIERS_MS } from '../src/distributed-config.js';
import { ORDERS_CONSUMER } from '../src/orders-service.js';
import { PAYMENTS_CONSUMER } from '../src/payments-service.js';

const HERE = join(dirname(fileURLToPath(import.meta.url)), '..');
const PG_URL = process.env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test';
const AMQP_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';

describe('courier console on the example config', () => {
  const run = `console${randomBytes(4).toString('hex')}`;
  const schema = `example_${run}`;
  const operator = `op-${randomBytes(8).toString('hex')}`;
  const viewer = `vw-${randomBytes(8).toString('hex')}`;
  let orm: MikroORM;
  let child: ChildProcess | undefined;
  let stdout = '';
  let amqp: ChannelModel;
  // The consumers' dead-letter queues a run's subscriptions declare (the console lists them, creating nothing).
  const deadQueues = [PAYMENTS_CONSUMER, ORDERS_CONSUMER].map((consumer) => rabbitMqNames(`courier-example-${run}`, consumer, DELAY_TIERS_MS).deadLetterQueue);

  beforeAll(async () => {
    orm = await openPostgresOrm(PG_URL, schema, 2);
    await orm.em.getConnection().execute(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    amqp = await connect(AMQP_URL);
    const channel = await amqp.createChannel();
    for (const queue of deadQueues) await channel.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
    await channel.close();
  });
  afterAll(async () => {
    if (child && child.exitCode === null) {
      const exited = new Promise((resolve) => child!.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    }
    if (amqp) {
      const channel = await amqp.createChannel();
      for (const queue of deadQueues) await channel.deleteQueue(queue).catch(() => undefined);
      await amqp.close();
    }
    await orm?.em.getConnection().execute(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await orm?.close();
  });

  it('groups the payments dead rows, refuses a viewer, replays the group once for an operator', { timeout: 180_000 }, async () => {
    const tables = { orm, tablePrefix: TABLE_PREFIXES.payments, schema };
    const outbox = new MikroOrmOutboxStore({ ...tables, wakeups: false });
    await outbox.ensureSchema();
    await new MikroOrmInboxStore(tables).ensureSchema?.();
    const poison = Array.from({ length: 3 }, (_, index) => makeEnvelope({ topic: 'payments', key: `order-${index}`, type: 'payments.PaymentCaptured' }));
    await orm.em.fork().transactional(async (em: EntityManager) => {
      outbox.append(em, poison.map((envelope) => ({ envelope })));
    });
    const batch = await outbox.claim({ owner: 'test', limit: 10, leaseMs: 60_000, perKey: 1 });
    await outbox.fail(
      batch.lease,
      batch.records.map((record, index) => ({ sequence: record.sequence, error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for payment ${900 + index}`, outcome: 'dead' as const })),
    );
    await outbox.close();

    const dir = mkdtempSync(join(tmpdir(), 'courier-example-tokens-'));
    writeFileSync(join(dir, 'tokens'), `olga operator ${operator}\nvera viewer ${viewer}\n`);
    // As `pnpm courier console` runs it: the CLI from its sources, this folder's config.
    child = spawn(process.execPath, ['--conditions=@courier/source', '--import', 'tsx', '../../packages/cli/src/bin.ts', 'console', '--port', '0', '--tokens-file', join(dir, 'tokens')], {
      cwd: HERE,
      env: { ...process.env, COURIER_EXAMPLE_RUN: run, COURIER_PG_URL: PG_URL },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stdout!.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`courier console did not start in 120 s: ${stderr}`)), 120_000);
      child!.stderr!.on('data', (chunk: Buffer) => {
        stderr += chunk.toString();
        const match = /serving (http:\/\/\S+?\/)/.exec(stderr);
        if (match) {
          clearTimeout(timer);
          resolve(match[1]!);
        }
      });
      child!.once('exit', (code) => reject(new Error(`courier console exited (${code}): ${stderr}`)));
    });
    const api = async (path: string, token: string, body?: unknown) => {
      const response = await fetch(new URL(`api/${path}`, url), {
        method: body === undefined ? 'GET' : 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      });
      return { status: response.status, body: (await response.json()) as Record<string, unknown> };
    };

    const stats = await api('stats', viewer);
    expect(stats.status).toBe(200);
    expect((stats.body['stats'] as { outbox: { dead: number } }).outbox.dead).toBe(3);
    const read = await api('groups', viewer);
    expect(read.status, JSON.stringify(read.body)).toBe(200);
    const groups = read.body['groups'] as { id: string; count: number; code: string; members: { ref: string; source: string }[] }[];
    const outboxGroups = groups.filter((group) => group.members.every((member) => member.source === 'outbox'));
    expect(outboxGroups.map((group) => [group.count, group.code])).toEqual([[3, 'PUBLISH_UNROUTABLE']]);
    const refs = outboxGroups[0]!.members.map((member) => member.ref);

    const refused = await api('dead/replay', viewer, { refs, group: outboxGroups[0]!.id });
    expect(refused.status).toBe(403);
    const replayed = await api('dead/replay', operator, { refs, group: outboxGroups[0]!.id });
    expect(replayed.body).toMatchObject({ requested: 3, outbox: 3, alreadyChanged: 0 });
    const again = await api('dead/replay', operator, { refs, group: outboxGroups[0]!.id });
    expect(again.body).toMatchObject({ requested: 3, outbox: 0, alreadyChanged: 3 });
    const after = (await api('stats', viewer)).body['stats'] as { outbox: { dead: number; pending: number } };
    expect(after.outbox).toMatchObject({ dead: 0, pending: 3 });
    const audit = stdout.trim().split('\n').map((line) => JSON.parse(line) as { operator: string; action: string });
    expect(audit.map((line) => [line.operator, line.action])).toEqual([
      ['vera', 'replay'],
      ['olga', 'replay'],
      ['olga', 'replay'],
    ]);
  });
});
