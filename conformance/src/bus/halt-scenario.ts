import { createBus, defineMessage, hasInboxHalts, newMessageId, type InboxResumeAction } from '@courier/core';
import { expect } from 'vitest';
import { eventually } from '../support/eventually.js';
import type { BusFactories } from './run-scenario.js';
import { envLogger } from './world.js';

/**
 * The `halt` poison policy end to end, over a plugin's store and transport: an ordered
 * subscription with `poison: 'halt'`, key `a` whose head always fails and key `b` that is
 * healthy. While `a` is halted nothing later of it is applied and `b` flows; the halt is
 * listed with what it holds. After the operator's `resume(action)`:
 * - `retry` (the handler now succeeds): the head, then the held messages, in order, once each;
 * - `park`: the head is parked (listed, never applied), the held messages applied in order;
 * and the halt is lifted, nothing dead-lettered through the transport.
 *
 * Returns a reason to skip when the fixtures cannot run it (no halts in the inbox store,
 * no per-key ordering in the transport), else undefined once every check passed.
 */
export async function runHaltScenario<Tx>(factories: BusFactories<Tx>, action: InboxResumeAction, testId: string): Promise<string | undefined> {
  const context = { testId };
  const store = await factories.store(context);
  const transportFixture = await factories.transport(context);
  try {
    const inbox = store.inbox;
    if (!hasInboxHalts(inbox)) return "the inbox store has no halts (InboxHalts): poison 'halt' cannot be configured with it";
    if (!transportFixture.transport.capabilities.orderingByKey) return "the transport does not declare orderingByKey: poison 'halt' is for ordered subscriptions only";
    const Work = defineMessage(`${testId}.halt.Work`, { version: 1, topic: `${testId}.halt` });
    const consumer = `${testId}-halt`;
    const bus = createBus({
      outbox: store.outbox,
      inbox,
      transport: transportFixture.transport,
      retry: { maxAttempts: 2, initialDelayMs: 20, maxDelayMs: 50, jitter: 0 },
      relay: { pollIntervalMs: 50, pause: { initialDelayMs: 20, maxDelayMs: 250 } },
      ...(envLogger() ? { logger: envLogger()! } : {}),
    });
    const broken = new Set<string>();
    const runs: string[] = [];
    bus.subscribe(
      consumer,
      Work,
      async (message, ctx) => {
        runs.push(message.messageId);
        if (broken.has(message.messageId)) throw new Error(`${message.messageId} fails until the operator fixes it`);
        await store.recordEffect(ctx.tx, message.messageId);
      },
      { ordered: true, poison: 'halt', concurrency: 4 },
    );
    const a = [1, 2, 3].map((n) => `${testId}-a${n}-${newMessageId()}`);
    const b = [1, 2].map((n) => `${testId}-b${n}-${newMessageId()}`);
    broken.add(a[0]!);
    await bus.start();
    try {
      // One transaction per message, a's and b's interleaved: commit order is publish order per key.
      for (const [key, id] of [['a', a[0]], ['b', b[0]], ['a', a[1]], ['a', a[2]], ['b', b[1]]] as const) {
        await store.transaction(async (tx) => {
          bus.outbox(tx).publish(Work, {}, { key, messageId: id! });
        });
      }
      bus.wake();
      const ofConsumer = async () => (await inbox.listHalted({ consumer })).filter((halt) => halt.key === 'a');
      await eventually(async () => expect((await ofConsumer())[0]?.held, 'key a halted with a2, a3 held').toBe(2), { timeoutMs: 30_000 });
      await eventually(async () => expect((await store.readEffects()).filter((id) => b.includes(id))).toEqual(b), { timeoutMs: 30_000 });
      const [halt] = await ofConsumer();
      expect(halt!.head!.envelope.messageId).toBe(a[0]);
      expect(halt!.head!.error).toContain('ATTEMPTS_EXHAUSTED');
      expect((await store.readEffects()).filter((id) => a.includes(id)), 'nothing of a halted key is applied').toEqual([]);
      expect(runs.filter((id) => id === a[1] || id === a[2])).toEqual([]);

      if (action === 'retry') broken.delete(a[0]!);
      expect(await inbox.resumeHalted(consumer, Work.topic, 'a', action)).toBe(1);
      const expected = action === 'retry' ? a : a.slice(1);
      await eventually(async () => expect((await store.readEffects()).filter((id) => a.includes(id))).toEqual(expected), { timeoutMs: 30_000 });
      await eventually(async () => expect(await ofConsumer()).toEqual([]), { timeoutMs: 30_000 });
      const parked = (await inbox.listParked({ consumer })).map((entry) => entry.envelope.messageId);
      expect(parked).toEqual(action === 'park' ? [a[0]] : []);
      if (transportFixture.transport.deadLetters) expect(await transportFixture.transport.deadLetters.list(consumer)).toEqual([]);
      // Each applied once, in order per key, b untouched.
      expect((await store.readEffects()).filter((id) => a.includes(id) || b.includes(id)).sort()).toEqual([...expected, ...b].sort());
    } finally {
      await bus.stop({ timeoutMs: 5_000 });
    }
    return undefined;
  } finally {
    await transportFixture.close();
    await store.close();
  }
}
