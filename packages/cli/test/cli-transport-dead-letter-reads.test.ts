// Concurrent reads of RabbitMQ dead letters through the compiled binary: three `courier dead
// list` and three `courier dead purge --all --dry-run` at once each see every one of 28 dead
// letters, in one stable order (oldest first), and a --limit says "N of M shown". Before,
// reads took the messages off the queue while they read: 23, 28 and 5 of 28 (issue 35).
import { randomBytes } from 'node:crypto';
import { eventually, makeEnvelope } from '@courier/conformance';
import { createBus, defineMessage, noopLogger, UnrecoverableError, type Bus, type Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { AMQP_URL, deleteBrokerObjects, openStores, openTransport, type CliTestSetup } from './support/setup.js';

const DEAD = 28;

describe('courier dead: concurrent reads of RabbitMQ dead letters', () => {
  const prefix = `cli${randomBytes(4).toString('hex')}_`;
  const consumer = `${prefix}payments`;
  const topic = `${prefix}orders`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: consumer };
  const cleanup: (() => Promise<void>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close();
    await deleteBrokerObjects(prefix, [consumer]);
  });

  it('three concurrent lists and three concurrent purge dry runs each see all 28, oldest first; --limit says N of M', async () => {
    const stores: CliTestSetup = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Charge = defineMessage('cli.Charge', { version: 1, topic });
    const bus: Bus<EntityManager> = createBus({ outbox: stores.outbox, inbox: stores.inbox, transport, logger: noopLogger });
    bus.subscribe(consumer, Charge, async () => {
      throw new UnrecoverableError('card refused');
    });
    await bus.start({ consumers: true, relay: false });
    cleanup.push(() => bus.stop());
    const sent: Envelope[] = Array.from({ length: DEAD }, (_, n) => makeEnvelope({ topic, type: 'cli.Charge', key: null, payload: JSON.stringify({ n }) }));
    // In batches, so dead-letter times differ between batches (the order is by dead-letter time).
    for (let at = 0; at < DEAD; at += 7) {
      await transport.publish(sent.slice(at, at + 7));
      await eventually(async () => expect(await transport.deadLetters!.count!(consumer)).toBe(Math.min(at + 7, DEAD)), { timeoutMs: 30_000 });
    }

    const lists = await Promise.all([1, 2, 3].map(() => runCli(['dead', 'list', '--source', 'transport', '--json'], env)));
    const orders = lists.map((listed) => {
      expect(listed.code, listed.stderr).toBe(0);
      return (JSON.parse(listed.stdout) as { envelope: { messageId: string }; parkedAt: string }[]).map((item) => ({ id: item.envelope.messageId, at: Date.parse(item.parkedAt) }));
    });
    for (const order of orders) {
      expect(order.map((item) => item.id).sort()).toEqual(sent.map((item) => item.messageId).sort());
      // Oldest first.
      expect(order.map((item) => item.at)).toEqual([...order.map((item) => item.at)].sort((a, b) => a - b));
    }
    // One stable order: every reader lists them alike.
    expect(orders[1]!.map((item) => item.id)).toEqual(orders[0]!.map((item) => item.id));
    expect(orders[2]!.map((item) => item.id)).toEqual(orders[0]!.map((item) => item.id));

    const dryRuns = await Promise.all([1, 2, 3].map(() => runCli(['dead', 'purge', '--all', '--source', 'transport', '--dry-run'], env)));
    for (const dry of dryRuns) {
      expect(dry.code, dry.stderr).toBe(0);
      expect(dry.stdout).toContain(`dry run: would purge ${DEAD} message(s); nothing changed`);
    }

    const limited = await runCli(['dead', 'list', '--source', 'transport', '--limit', '5', '--json'], env);
    expect(limited.code, limited.stderr).toBe(0);
    expect((JSON.parse(limited.stdout) as { envelope: { messageId: string } }[]).map((item) => item.envelope.messageId)).toEqual(orders[0]!.slice(0, 5).map((item) => item.id));
    expect(limited.stderr).toContain(`5 of ${DEAD} shown`);

    // The depth (stats, metrics) is read without taking messages, and nothing was lost.
    const stats = await runCli(['stats', '--json'], env);
    expect(JSON.parse(stats.stdout).transport).toEqual([{ consumer, deadLetters: DEAD, atLeast: false }]);
    expect(await transport.deadLetters!.count!(consumer)).toBe(DEAD);
  });

  // Issue 35: a mistyped prefix answered "no dead letters", exit 0 — an operator concluded all was well.
  it('a mistyped broker prefix says "no such dead-letter queue" (exit 1) and creates nothing: no exchange, no queue (dead list, stats, a purge dry run)', async () => {
    const typo = `${prefix}typo`;
    const wrong = { ...env, CLI_TEST_BROKER_PREFIX: typo, CLI_TEST_CONSUMERS: `${typo}payments` };
    for (const args of [['dead', 'list', '--source', 'transport'], ['stats'], ['dead', 'purge', '--all', '--source', 'transport', '--dry-run'], ['dead', 'groups', '--source', 'transport']]) {
      const result = await runCli(args, wrong);
      expect(result.code, `${args.join(' ')}: ${result.stdout} ${result.stderr}`).toBe(1);
      // `stats` prints what it read, with this under "could not read" (stdout); the others on stderr.
      expect(result.stdout + result.stderr, args.join(' ')).toContain(`no such dead-letter queue on the broker for consumer '${typo}payments'`);
      expect(result.stdout + result.stderr, args.join(' ')).toContain('check the prefix');
      expect(result.stdout, args.join(' ')).not.toMatch(/no dead letters|nothing to purge/);
    }
    // The right prefix with a consumer that never subscribed is told apart the same way.
    const unknown = await runCli(['dead', 'list', '--source', 'transport', '--consumer', `${prefix}nobody`], env);
    expect(unknown.code, unknown.stderr).toBe(1);
    expect(unknown.stderr).toContain(`'${prefix}nobody'`);
    // stats, with the right prefix, shows a configured consumer that never subscribed as
    // "no queue yet" beside one that has a queue, and succeeds (the prefix is evidently right).
    const mixed = await runCli(['stats'], { ...env, CLI_TEST_CONSUMERS: `${consumer},${prefix}nobody` });
    expect(mixed.code, `${mixed.stdout} ${mixed.stderr}`).toBe(0);
    expect(mixed.stdout).toMatch(new RegExp(`${prefix}nobody\\s+no queue yet`));
    expect(mixed.stdout).not.toContain('could not read');
    const { connect } = await import('amqplib');
    const connection = await connect(AMQP_URL);
    try {
      // Passive declares: 404 (the channel closes) when the object does not exist.
      const exists = async (check: (channel: import('amqplib').Channel) => Promise<unknown>): Promise<boolean> => {
        const channel = await connection.createChannel();
        channel.on('error', () => undefined);
        try {
          await check(channel);
          await channel.close();
          return true;
        } catch (error) {
          if ((error as { code?: unknown }).code === 404) return false;
          throw error;
        }
      };
      expect(await exists((channel) => channel.checkExchange(`${typo}.topics`))).toBe(false);
      expect(await exists((channel) => channel.checkQueue(`${typo}.q.${typo}payments.dead`))).toBe(false);
      // The check itself can see what exists.
      expect(await exists((channel) => channel.checkExchange(`${prefix}.topics`))).toBe(true);
    } finally {
      await connection.close();
    }
  });
});
