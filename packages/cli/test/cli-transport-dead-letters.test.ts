// `courier dead` over the transport's dead-letter queue (RabbitMQ, PostgreSQL stores):
// a consumer dead-letters two messages, the binary lists and shows them, replays one —
// which the consumer then handles exactly once — and purges the other.
import { randomBytes } from 'node:crypto';
import { eventually } from '@courier/conformance';
import { createBus, defineMessage, UnrecoverableError, type Bus } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { deleteBrokerObjects, openStores, openTransport, type CliTestSetup } from './support/setup.js';

describe('courier dead over RabbitMQ dead letters (postgresql stores)', () => {
  const prefix = `cli${randomBytes(4).toString('hex')}_`;
  const consumer = `${prefix}payments`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: consumer };
  const cleanup: (() => Promise<void>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close();
    await deleteBrokerObjects(prefix, [consumer]);
  });

  it('lists, shows, replays (handled once) and purges transport dead letters', async () => {
    const stores: CliTestSetup = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Charge = defineMessage('cli.Charge', { version: 1, topic: `${prefix}orders` });
    let refuse = true;
    const handled = new Map<string, number>();
    const bus: Bus<EntityManager> = createBus({ outbox: stores.outbox, inbox: stores.inbox, transport, relay: { pollIntervalMs: 100 } });
    bus.subscribe(consumer, Charge, async (message) => {
      if (refuse) throw new UnrecoverableError(`refused ${String((message.payload as { n: number }).n)}`);
      handled.set(message.messageId, (handled.get(message.messageId) ?? 0) + 1);
    });
    await bus.start();
    cleanup.push(() => bus.stop());
    const ids: string[] = [];
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      ids.push(bus.outbox(em).publish(Charge, { n: 1 }), bus.outbox(em).publish(Charge, { n: 2 }));
    });
    await eventually(async () => expect((await transport.deadLetters!.list(consumer)).length).toBe(2), { timeoutMs: 30_000 });

    const listed = await runCli(['dead', 'list', '--source', 'transport', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { ref: string; state: string; consumer: string; code: string; envelope: { messageId: string } }[];
    expect(items.map((item) => item.envelope.messageId).sort()).toEqual([...ids].sort());
    expect(items.every((item) => item.state === 'dead-letter' && item.consumer === consumer && item.code.length > 0)).toBe(true);
    const [first, second] = [items.find((item) => item.envelope.messageId === ids[0])!, items.find((item) => item.envelope.messageId === ids[1])!];
    const byCode = await runCli(['dead', 'list', '--json', '--consumer', consumer, '--code', first.code], env);
    expect(JSON.parse(byCode.stdout)).toHaveLength(2);
    expect(JSON.parse((await runCli(['dead', 'list', '--json', '--code', 'NO_SUCH_CODE'], env)).stdout)).toEqual([]);

    const shown = await runCli(['dead', 'show', first.ref], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)[0]).toMatchObject({ ref: first.ref, envelope: { messageId: ids[0], payload: '{"n":1}' } });
    expect(JSON.parse(shown.stdout)[0].error).toContain('refused 1');

    const stats = await runCli(['stats', '--json'], env);
    expect(JSON.parse(stats.stdout).transport).toEqual([{ consumer, deadLetters: 2, atLeast: false }]);

    refuse = false;
    const dry = await runCli(['dead', 'replay', first.ref, '--dry-run'], env);
    expect(dry.stdout).toContain('nothing changed');
    expect(handled.size).toBe(0);
    const replayed = await runCli(['dead', 'replay', first.ref, '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('1 transport dead letter(s)');
    await eventually(() => expect(handled.get(ids[0]!)).toBe(1), { timeoutMs: 30_000 });

    const purged = await runCli(['dead', 'purge', second.ref, '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(await transport.deadLetters!.list(consumer)).toEqual([]);

    // A later message goes through after the replay; the replayed one still ran once, the purged one never.
    let sentinel = '';
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      sentinel = bus.outbox(em).publish(Charge, { n: 3 });
    });
    await eventually(() => expect(handled.get(sentinel)).toBe(1), { timeoutMs: 30_000 });
    expect(Object.fromEntries(handled)).toEqual({ [ids[0]!]: 1, [sentinel]: 1 });
  });
});
