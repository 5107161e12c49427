import { setTimeout as sleep } from 'node:timers/promises';
import { UnrecoverableError, createBus, defineMessage, type Delivery, type InboxStore } from '@courier/core';
import { expect } from 'vitest';
import type { FixtureContext } from '../fixtures.js';
import { deferred } from '../support/deferred.js';
import { eventually } from '../support/eventually.js';
import { makeEnvelope } from '../support/make-envelope.js';
import { uniqueId } from '../support/unique-id.js';
import { withSubscribe } from '../support/wrap-transport.js';
import type { BusFactories } from './run-scenario.js';

/**
 * Bus case "a replayed dead letter delivered twice runs once": a message is dead-lettered
 * by its consumer, an operator replays it, and the broker hands the replayed copy over
 * twice at the same moment (as a broker does after a lost acknowledgement or a publish
 * retried under the hood). The handler's effect must commit exactly once.
 *
 * To make the worst interleaving of the two copies happen every time rather than by luck,
 * the inbox store is wrapped: while the replay is in progress, a consumer that removes the
 * message's inbox record (what "run the replay from a clean slate" does) is held until
 * the other copy has reached the same point, and the second one until the first copy's
 * run has committed. A consumer that never removes that record is never held. Calls go
 * through to the fixture's store unchanged otherwise.
 *
 * `skip` is called (and never returns) when the transport keeps no dead letters.
 */
export async function runReplayedDuplicateCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never): Promise<void> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    const deadLetters = fixture.transport.deadLetters;
    if (!deadLetters) return skip('the transport has no deadLetters (nativeDeadLetter: false): nothing can be replayed');
    const consumer = `${testId}.replay`;
    const definition = defineMessage('conformance.Replayed', { version: 1, topic: `${testId}.replayed` });
    const envelope = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'replayed' });
    const target = envelope.messageId;

    let replaying = false;
    let forgets = 0;
    const secondCopyHere = deferred();
    const firstRunCommitted = deferred();
    const held = (promise: Promise<void>, ms: number) => Promise.race([promise, sleep(ms)]);
    const inbox: InboxStore<Tx> = {
      run: async (messageId, name, work, options) => {
        const result = await store.inbox.run(messageId, name, work, options);
        if (replaying && messageId === target && !result.duplicate) firstRunCommitted.resolve();
        return result;
      },
      recordStart: (messageId, name) => store.inbox.recordStart(messageId, name),
      forget: async (messageId, name) => {
        if (replaying && messageId === target && name === consumer) {
          forgets += 1;
          if (forgets === 1) await held(secondCopyHere.promise, 3_000);
          else {
            secondCopyHere.resolve();
            await held(firstRunCommitted.promise, 10_000);
          }
        }
        return store.inbox.forget(messageId, name);
      },
      prune: (olderThanMs, options) => store.inbox.prune(olderThanMs, options),
      ...(store.inbox.limits ? { limits: store.inbox.limits } : {}),
    };

    let duplicated = 0;
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, async (delivery) => {
        if (!(delivery.replayed === true && delivery.envelope.messageId === target && duplicated === 0)) return handler(delivery);
        duplicated += 1;
        // The broker's second copy: the same message, settled on its own (the broker
        // forgets it once either copy is acknowledged, so its settles change nothing here).
        const copy: Delivery = {
          envelope: delivery.envelope,
          attempt: delivery.attempt,
          replayed: true,
          redelivered: delivery.redelivered,
          ack: async () => {},
          retry: async () => {},
          deadLetter: async () => {},
        };
        await Promise.all([handler(delivery), handler(copy)]);
      }),
    );

    let broken = true;
    const bus = createBus({ outbox: store.outbox, inbox, transport, retry: { maxAttempts: 1, initialDelayMs: 20, maxDelayMs: 100 } });
    closers.unshift(() => bus.stop({ timeoutMs: 10_000 }));
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        if (broken) throw new UnrecoverableError(`replay case: ${message.messageId} fails until replayed`);
        await store.recordEffect(ctx.tx, message.messageId);
      },
      { concurrency: 4 },
    );
    await bus.start({ relay: false, consumers: true });
    await eventually(() => expect(bus.health().ready).toBe(true), { timeoutMs: 30_000 });
    const [published] = await fixture.transport.publish([envelope]);
    expect(published?.ok, 'the broker took the message').toBe(true);

    const letters = await eventually(
      async () => {
        const found = (await deadLetters.list(consumer)).filter((letter) => letter.envelope.messageId === target);
        expect(found, 'the message is dead-lettered once').toHaveLength(1);
        return found;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );

    broken = false;
    replaying = true;
    expect(await deadLetters.replay(consumer, letters.map((letter) => letter.id))).toBe(1);
    await eventually(async () => expect((await store.readEffects()).filter((id) => id === target)).toHaveLength(1), { timeoutMs: 30_000, intervalMs: 50 });
    expect(duplicated, 'the replayed copy reached the consumer').toBe(1);
    // Long enough for a second run of the duplicate to commit, had it run: it was held only
    // until the first copy's run committed.
    await sleep(1_000);
    expect((await store.readEffects()).filter((id) => id === target), 'the replay ran once').toHaveLength(1);
    await eventually(() => expect(bus.health().counters.duplicates, 'the second copy was taken for a duplicate').toBeGreaterThanOrEqual(1), { timeoutMs: 15_000, intervalMs: 50 });
    expect((await deadLetters.list(consumer)).filter((letter) => letter.envelope.messageId === target), 'nothing dead-lettered again').toEqual([]);
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}
