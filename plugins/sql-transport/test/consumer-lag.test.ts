// consumerLag on the SQL transport (issue 35): the group's pending rows that no live lease
// holds, read by one SELECT. Beyond the kit's case: a row in a handler's hands is not
// counted, a dead letter is not counted, a row waiting out a retry delay is, and reading
// changes no row of the queue and adds none to the groups table.
import type { Delivery } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createSqlTransportFixture, openOrm, sharedSqliteOrm, type QueueDialectName } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** Every row of the test's queue and groups tables, as the database holds them (read with the test's own connection). */
async function tableSnapshot(dialect: QueueDialectName, testId: string): Promise<{ queue: unknown[]; groups: unknown[] }> {
  const shared = dialect === 'sqlite' ? await sharedSqliteOrm(testId) : undefined;
  const orm = shared?.orm ?? (await openOrm(dialect, testId));
  const quote = (name: string) => (dialect === 'mariadb' ? `\`${name}\`` : `"${name}"`);
  try {
    const connection = orm.em.getConnection('write');
    const text = (row: Record<string, unknown>) => Object.fromEntries(Object.entries(row).map(([column, value]) => [column, value instanceof Date ? value.toISOString() : Buffer.isBuffer(value) ? value.toString('utf8') : String(value)]));
    const queue = (await connection.execute(`SELECT seq, consumer, state, available_at, attempt, claims, lease_owner FROM ${quote(`${testId}_queue`)} ORDER BY seq`, [], 'all')) as Record<string, unknown>[];
    const groups = (await connection.execute(`SELECT consumer, topic FROM ${quote(`${testId}_queue_groups`)} ORDER BY consumer, topic`, [], 'all')) as Record<string, unknown>[];
    return { queue: queue.map(text), groups: groups.map(text) };
  } finally {
    if (shared) await shared.release();
    else await orm.close(true);
  }
}

describe.each(['postgresql', 'mariadb', 'sqlite'] as const)('sql transport consumerLag on %s', (dialect) => {
  it('counts pending rows not in a handler’s hands (retry delays included, dead letters not), null without a group, and reading writes nothing', async () => {
    const testId = uniqueId();
    const fixture = await createSqlTransportFixture(dialect)({ testId });
    closers.push(() => fixture.close());
    const transport = fixture.transport;
    const topic = 'orders.placed';
    const consumer = 'billing';

    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    // Provisioned: the group has its place, and nothing waits yet.
    await transport.provision({ consumer, topics: [topic] });
    expect(await transport.consumerLag(consumer)).toBe(0);

    const waiting = Array.from({ length: 5 }, () => makeEnvelope({ topic, key: null }));
    expect((await transport.publish(waiting)).every((result) => result.ok)).toBe(true);
    const before = await tableSnapshot(dialect, testId);
    expect(await transport.consumerLag(consumer)).toBe(5);
    expect(await transport.consumerLag(consumer)).toBe(5);
    expect(await transport.consumerLag('never-subscribed')).toBeNull();
    // Passive: no row claimed, moved or added, no group registered by asking.
    expect(await tableSnapshot(dialect, testId)).toEqual(before);
    expect(before.groups).toEqual([{ consumer, topic }]);

    // One delivery held by its handler (concurrency 1): leased, so no longer waiting.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const handled: string[] = [];
    const subscription = await transport.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async (delivery: Delivery) => {
      if (handled.length === 0) await gate;
      handled.push(delivery.envelope.messageId);
      if (delivery.envelope.payload === '"retry later"') return delivery.retry(60_000, { code: 'LAG_TEST_RETRY', message: 'wait a minute' });
      if (delivery.envelope.payload === '"poison"') return delivery.deadLetter({ code: 'LAG_TEST_POISON', message: 'park it' });
      return delivery.ack();
    });
    closers.push(() => subscription.close());
    await eventually(async () => expect(await transport.consumerLag(consumer)).toBe(4), { timeoutMs: 15_000 });
    release();
    await eventually(() => expect(handled).toHaveLength(5), { timeoutMs: 20_000 });
    await eventually(async () => expect(await transport.consumerLag(consumer)).toBe(0), { timeoutMs: 15_000 });

    // A dead letter waits for no delivery; a row waiting out its retry delay does.
    const poison = makeEnvelope({ topic, key: null, payload: '"poison"' });
    const later = makeEnvelope({ topic, key: null, payload: '"retry later"' });
    expect((await transport.publish([poison, later])).every((result) => result.ok)).toBe(true);
    await eventually(() => expect(handled).toHaveLength(7), { timeoutMs: 20_000 });
    await eventually(async () => expect((await transport.deadLetters.list(consumer)).map((letter) => letter.envelope.messageId)).toEqual([poison.messageId]), { timeoutMs: 15_000 });
    await eventually(async () => expect(await transport.consumerLag(consumer)).toBe(1), { timeoutMs: 15_000 });
  }, 90_000);
});
