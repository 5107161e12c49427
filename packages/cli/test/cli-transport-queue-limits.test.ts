// Issue 39 through the compiled binary: a message that expired in a consumer's queue
// (queueLimits messageTtlMs) or was dropped by its max length (maxLength + drop-head)
// reaches the dead letters with that reason — BROKER_EXPIRED, BROKER_MAXLEN — and
// `courier dead list` (text and --json) shows it; `courier dead replay` of one sends it
// back to its consumer, which handles it once.
import { randomBytes } from 'node:crypto';
import { eventually, makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { deleteBrokerObjects, openStores, openTransport, type CliTestSetup } from './support/setup.js';

interface Listed {
  readonly ref: string;
  readonly state: string;
  readonly consumer: string;
  readonly code: string;
  readonly error: string;
  readonly envelope: { readonly messageId: string };
}

describe('courier dead: RabbitMQ messages expired or dropped by queueLimits (postgresql stores)', () => {
  const prefix = `cli${randomBytes(4).toString('hex')}_`;
  const expiring = `${prefix}expiring`;
  const bounded = `${prefix}bounded`;
  const limits = { [expiring]: { messageTtlMs: 300 }, [bounded]: { maxLength: 2, overflow: 'drop-head' as const } };
  const env = {
    CLI_TEST_DIALECT: 'postgresql',
    CLI_TEST_PREFIX: prefix,
    CLI_TEST_BROKER_PREFIX: prefix,
    CLI_TEST_CONSUMERS: `${expiring},${bounded}`,
    CLI_TEST_QUEUE_LIMITS: JSON.stringify(limits),
  };
  const cleanup: (() => Promise<void>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close();
    await deleteBrokerObjects(prefix, [expiring, bounded]);
  });

  it('lists expired and max-length drops with their codes, and replays one of each once', async () => {
    // `dead list` reads the outbox too: its tables must exist (none of these messages is in it).
    const stores: CliTestSetup = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix, limits);
    cleanup.push(() => transport.close());
    const endpoints = [
      { consumer: expiring, topics: [`${prefix}jobs`], ordered: false, concurrency: 1 },
      { consumer: bounded, topics: [`${prefix}orders`], ordered: false, concurrency: 1 },
    ];
    for (const endpoint of endpoints) await transport.provision(endpoint);

    // Nobody consumes yet: both `jobs` messages wait past their TTL; of four `orders`, the queue keeps the newest two.
    const jobs = [0, 1].map((n) => makeEnvelope({ topic: `${prefix}jobs`, type: 'cli.Job', key: null, payload: JSON.stringify({ n }) }));
    const orders = [0, 1, 2, 3].map((n) => makeEnvelope({ topic: `${prefix}orders`, type: 'cli.Order', key: null, payload: JSON.stringify({ n }) }));
    expect((await transport.publish(jobs)).every((result) => result.ok)).toBe(true);
    // One at a time: each confirmed before the next, so the oldest are the ones dropped.
    for (const order of orders) expect((await transport.publish([order]))[0]!.ok).toBe(true);
    await eventually(async () => expect((await transport.deadLetters.list(expiring)).length).toBe(2), { timeoutMs: 30_000 });
    await eventually(async () => expect((await transport.deadLetters.list(bounded)).length).toBe(2), { timeoutMs: 30_000 });

    const listed = await runCli(['dead', 'list', '--source', 'transport', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as Listed[];
    const summary = (consumer: string) =>
      items
        .filter((item) => item.consumer === consumer)
        .map((item) => ({ id: item.envelope.messageId, code: item.code, state: item.state, error: item.error }))
        .sort((a, b) => a.id.localeCompare(b.id));
    const expected = (sent: readonly Envelope[], code: string, why: string) =>
      sent.map((message) => ({ id: message.messageId, code, state: 'dead-letter', error: `dead-lettered by RabbitMQ (${why})` })).sort((a, b) => a.id.localeCompare(b.id));
    expect(summary(expiring)).toEqual(expected(jobs, 'BROKER_EXPIRED', 'expired'));
    expect(summary(bounded)).toEqual(expected(orders.slice(0, 2), 'BROKER_MAXLEN', 'maxlen'));
    expect(items).toHaveLength(4);

    // The text listing names each one's code too.
    const text = await runCli(['dead', 'list', '--source', 'transport'], env);
    expect(text.code, text.stderr).toBe(0);
    for (const item of items) {
      const line = text.stdout.split('\n').find((row) => row.includes(item.ref));
      expect(line, `${item.ref} in:\n${text.stdout}`).toBeDefined();
      expect(line).toContain(item.code);
    }
    const byCode = await runCli(['dead', 'list', '--json', '--code', 'BROKER_MAXLEN'], env);
    expect((JSON.parse(byCode.stdout) as Listed[]).map((item) => item.envelope.messageId).sort()).toEqual(orders.slice(0, 2).map((m) => m.messageId).sort());

    // Consumers now run (the bounded one takes the two orders still queued), then one of each kind is replayed.
    const handled = new Map<string, number>();
    for (const endpoint of endpoints) {
      const subscription = await transport.subscribe(endpoint, async (delivery) => {
        handled.set(delivery.envelope.messageId, (handled.get(delivery.envelope.messageId) ?? 0) + 1);
        await delivery.ack();
      });
      cleanup.push(() => subscription.close());
    }
    await eventually(() => expect([...handled.keys()].sort()).toEqual(orders.slice(2).map((m) => m.messageId).sort()), { timeoutMs: 30_000 });
    const replayExpired = items.find((item) => item.envelope.messageId === jobs[0]!.messageId)!;
    const replayDropped = items.find((item) => item.envelope.messageId === orders[0]!.messageId)!;
    const replayed = await runCli(['dead', 'replay', replayExpired.ref, replayDropped.ref, '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('2 transport dead letter(s)');
    await eventually(() => expect(handled.get(jobs[0]!.messageId)).toBe(1), { timeoutMs: 30_000 });
    await eventually(() => expect(handled.get(orders[0]!.messageId)).toBe(1), { timeoutMs: 30_000 });

    // A later message on each goes through after the replays: by then a second copy of a replayed one would have arrived.
    const sentinels = [makeEnvelope({ topic: `${prefix}jobs`, type: 'cli.Job', key: null }), makeEnvelope({ topic: `${prefix}orders`, type: 'cli.Order', key: null })];
    expect((await transport.publish(sentinels)).every((result) => result.ok)).toBe(true);
    await eventually(() => expect(sentinels.map((message) => handled.get(message.messageId))).toEqual([1, 1]), { timeoutMs: 30_000 });
    expect(Object.fromEntries(handled)).toEqual(
      Object.fromEntries([jobs[0]!, orders[0]!, orders[2]!, orders[3]!, ...sentinels].map((message) => [message.messageId, 1])),
    );
    // The two not replayed are still dead letters, with their codes.
    const left = JSON.parse((await runCli(['dead', 'list', '--source', 'transport', '--json'], env)).stdout) as Listed[];
    expect(left.map((item) => [item.envelope.messageId, item.code]).sort()).toEqual(
      [
        [jobs[1]!.messageId, 'BROKER_EXPIRED'],
        [orders[1]!.messageId, 'BROKER_MAXLEN'],
      ].sort(),
    );
  });
});
