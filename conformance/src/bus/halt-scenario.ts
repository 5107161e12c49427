import { UnrecoverableError, createBus, defineMessage, hasInboxHalts, newMessageId, type InboxResumeAction } from '@courier/core';
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
          await bus.outbox(tx).publish(Work, {}, { key, messageId: id! });
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

/**
 * Bus case: a replayed dead letter on the halt path keeps its replay's inbox identity. A
 * keyed message is dead-lettered while the ordered subscription parks its poison; the
 * subscription moves to `poison: 'halt'`, the operator replays the dead letter, and it fails
 * again: its key halts at it, and a later message of the key is held behind it. Once the
 * handler is fixed and the key resumed, the drain applies the replay (recorded under the
 * replay's record, not the consumer's own, which its dead-lettering left) and then the held
 * message, in order, once each. A drain that recorded the replay under the consumer's own
 * record would take it for a duplicate: never applied, with its dead letter gone.
 *
 * Returns a reason to skip when the fixtures cannot run it (no halts, no per-key ordering,
 * no dead letters to replay), else undefined once every check passed.
 */
export async function runHaltReplayCase<Tx>(factories: BusFactories<Tx>, testId: string): Promise<string | undefined> {
  const context = { testId };
  const store = await factories.store(context);
  const transportFixture = await factories.transport(context);
  try {
    const inbox = store.inbox;
    const { transport } = transportFixture;
    if (!hasInboxHalts(inbox)) return "the inbox store has no halts (InboxHalts): poison 'halt' cannot be configured with it";
    if (!transport.capabilities.orderingByKey) return "the transport does not declare orderingByKey: poison 'halt' is for ordered subscriptions only";
    const deadLetters = transport.deadLetters;
    if (!deadLetters) return 'the transport has no deadLetters (nativeDeadLetter: false): nothing can be replayed';
    const Work = defineMessage(`${testId}.haltreplay.Work`, { version: 1, topic: `${testId}.haltreplay` });
    const consumer = `${testId}-hr`;
    const broken = new Set<string>();
    const seen: Record<string, string>[] = [];
    const busWith = (poison: 'park' | 'halt') => {
      const bus = createBus({
        outbox: store.outbox,
        inbox,
        transport,
        retry: { maxAttempts: 2, initialDelayMs: 20, maxDelayMs: 50, jitter: 0 },
        relay: { pollIntervalMs: 50, pause: { initialDelayMs: 20, maxDelayMs: 250 } },
        ...(envLogger() ? { logger: envLogger()! } : {}),
      });
      bus.subscribe(
        consumer,
        Work,
        async (message, ctx) => {
          seen.push({ ...message.headers });
          if (broken.has(message.messageId)) throw new UnrecoverableError(`${message.messageId} fails until the operator fixes it`);
          await store.recordEffect(ctx.tx, message.messageId);
        },
        { ordered: true, poison },
      );
      return bus;
    };
    const [replayed, later] = [`${testId}-r-${newMessageId()}`, `${testId}-n-${newMessageId()}`];
    broken.add(replayed);
    const parking = busWith('park');
    await parking.start();
    let letterId: string;
    try {
      await store.transaction(async (tx) => {
        await parking.outbox(tx).publish(Work, {}, { key: 'a', messageId: replayed });
      });
      parking.wake();
      letterId = await eventually(
        async () => {
          const letter = (await deadLetters.list(consumer)).find((candidate) => candidate.envelope.messageId === replayed);
          expect(letter, 'the message was dead-lettered under park').toBeDefined();
          return letter!.id;
        },
        { timeoutMs: 30_000 },
      );
    } finally {
      await parking.stop({ timeoutMs: 5_000 });
    }
    const halting = busWith('halt');
    await halting.start();
    try {
      const ofKey = async () => (await inbox.listHalted({ consumer })).filter((halt) => halt.key === 'a');
      // Still broken: the replay fails again and halts its key.
      expect(await deadLetters.replay(consumer, [letterId])).toBe(1);
      await eventually(async () => expect((await ofKey())[0]?.head?.envelope.messageId, 'the replay halted its key').toBe(replayed), { timeoutMs: 30_000 });
      await store.transaction(async (tx) => {
        await halting.outbox(tx).publish(Work, {}, { key: 'a', messageId: later });
      });
      halting.wake();
      await eventually(async () => expect((await ofKey())[0]?.held, 'the later message is held').toBe(1), { timeoutMs: 30_000 });
      broken.delete(replayed);
      expect(await inbox.resumeHalted(consumer, Work.topic, 'a', 'retry')).toBe(1);
      const mine = async () => (await store.readEffects()).filter((id) => id === replayed || id === later);
      await eventually(async () => expect(await mine(), 'the replay was applied when drained, then the held message').toEqual([replayed, later]), { timeoutMs: 30_000 });
      await eventually(async () => expect(await ofKey()).toEqual([]), { timeoutMs: 30_000 });
      expect(await deadLetters.list(consumer)).toEqual([]);
      expect(seen.filter((headers) => Object.keys(headers).some((name) => name.toLowerCase().startsWith('courier-'))), 'a handler saw a Courier header').toEqual([]);
    } finally {
      await halting.stop({ timeoutMs: 5_000 });
    }
    return undefined;
  } finally {
    await transportFixture.close();
    await store.close();
  }
}
