import { UnrecoverableError, createBus, defineMessage, type Delivery, type InboxStore } from '@courier/core';
import { expect } from 'vitest';
import type { FixtureContext } from '../fixtures.js';
import { after } from '../support/after.js';
import { deferred } from '../support/deferred.js';
import { eventually } from '../support/eventually.js';
import { makeEnvelope } from '../support/make-envelope.js';
import { uniqueId } from '../support/unique-id.js';
import { withSubscribe } from '../support/wrap-transport.js';
import { DeliveryWatch } from './delivery-watch.js';
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
 * The case is judged once the consumer is done with the message (both copies handled, the
 * broker's delivery settled for good; see {@link DeliveryWatch}), not after a pause: a
 * second run that commits late, as on a loaded machine, is still counted.
 *
 * `skip` is called (and never returns) when the transport keeps no dead letters.
 */
export async function runReplayedDuplicateCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never): Promise<void> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  // Resolved as the case ends, so that no handler stays held past it.
  const ending = deferred();
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
    // Resolved once either copy's handling has returned: a copy held in `forget` has not, so
    // it is the other one, which will never reach `forget` (or run) after that.
    const aCopyReturned = deferred();
    let copiesStartedAt = 0;
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
          if (forgets === 1) {
            // The other copy may never come here first: a consumer that runs copies of one
            // message one after the other (a lock, or an exclusive gate for redeliveries)
            // keeps it waiting behind this one, and it leaves no trace to wait for. So after
            // its handling returned, or once it has had many times as long as this copy took
            // to get here (both started together and do the same work, so a loaded machine
            // stretches both alike; never less than 3 s), this copy goes on alone.
            const tookMs = performance.now() - copiesStartedAt;
            await Promise.race([secondCopyHere.promise, aCopyReturned.promise, ending.promise, after(Math.max(3_000, 10 * tookMs))]);
          } else {
            secondCopyHere.resolve();
            // No timer: this copy has made no store call yet, so it holds nothing the first
            // copy's run could wait for; that run commits, or fails and its handling returns.
            await Promise.race([firstRunCommitted.promise, aCopyReturned.promise, ending.promise]);
          }
        }
        return store.inbox.forget(messageId, name);
      },
      prune: (olderThanMs, options) => store.inbox.prune(olderThanMs, options),
      ...(store.inbox.limits ? { limits: store.inbox.limits } : {}),
    };

    let duplicated = 0;
    const watch = new DeliveryWatch();
    // The first delivery's handling, dead-lettering included: it writes the message's inbox
    // records after the dead letter is listed, and those writes must not pass for the replay's.
    const original = new DeliveryWatch();
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, async (delivery) => {
        if (delivery.envelope.messageId === target && delivery.replayed !== true) return original.during(handler(original.track(delivery)));
        if (!(delivery.replayed === true && delivery.envelope.messageId === target)) return handler(delivery);
        const tracked = watch.track(delivery);
        if (duplicated > 0) return watch.during(handler(tracked));
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
        copiesStartedAt = performance.now();
        const handled = (handling: Promise<void>) => handling.finally(() => aCopyReturned.resolve());
        await watch.during(Promise.all([handled(handler(tracked)), handled(handler(copy))]));
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

    await eventually(() => expect(original.done(), `the consumer is done with the first delivery (${original.describe()})`).toBe(true), { timeoutMs: 30_000, intervalMs: 50 });
    broken = false;
    replaying = true;
    expect(await deadLetters.replay(consumer, letters.map((letter) => letter.id))).toBe(1);
    // Done when both copies' handling has returned and the broker's delivery was settled for
    // good: a second run, had there been one, has committed by then, however late.
    await eventually(() => expect(watch.done(), `the consumer is done with the replayed message (copies handed over: ${duplicated}; ${watch.describe()})`).toBe(true), { timeoutMs: 60_000, intervalMs: 50 });
    expect(duplicated, 'the replayed copy reached the consumer').toBe(1);
    expect((await store.readEffects()).filter((id) => id === target), 'the replay ran once').toHaveLength(1);
    expect(bus.health().counters.duplicates, 'the second copy was taken for a duplicate').toBeGreaterThanOrEqual(1);
    expect((await deadLetters.list(consumer)).filter((letter) => letter.envelope.messageId === target), 'nothing dead-lettered again').toEqual([]);
  } finally {
    ending.resolve();
    for (const close of closers) await close().catch(() => undefined);
  }
}
