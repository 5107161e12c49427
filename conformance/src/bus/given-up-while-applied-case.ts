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
 * Bus case "a copy given up on while another copy is applied: applied once, replays
 * included". Two copies of one message are in hand at once — what a rebalance does when a
 * partition moves while its old owner still runs, or a broker redelivering after a lapsed
 * lock or a lost connection. The first copy's run fails for good (an unrecoverable error,
 * one attempt) while the second copy's run commits. The message is applied: the failed
 * copy must not leave a dead letter whose replay applies it a second time.
 *
 * The worst interleaving is forced rather than hoped for: the second copy is handed over
 * once the first copy's run has started, and the first copy's dead-lettering is held until
 * the second copy's run has committed or its handling returned (or, at most, many times as
 * long as the first copy took to get there: a consumer that claims the message's inbox
 * record before it dead-letters blocks that commit, and is not waited for forever). Then every dead letter of the message is replayed, and the effect must have
 * committed exactly once: either the failed copy left no dead letter, or replaying it
 * changes nothing. That is judged once the consumer is done with every replayed copy (see
 * {@link DeliveryWatch}), not after a pause, so a replayed run that commits late still counts.
 *
 * `skip` is called (and never returns) when the transport keeps no dead letters.
 */
export async function runGivenUpWhileAppliedCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never): Promise<void> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    const deadLetters = fixture.transport.deadLetters;
    if (!deadLetters) return skip('the transport has no deadLetters (nativeDeadLetter: false): a dead letter could not be replayed');
    const consumer = `${testId}.twice`;
    const definition = defineMessage('conformance.HeldTwice', { version: 1, topic: `${testId}.held-twice` });
    const envelope = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'held-twice' });
    const target = envelope.messageId;

    const firstRunStarted = deferred();
    const appliedCommitted = deferred();
    const inbox: InboxStore<Tx> = {
      run: async (messageId, name, work, options) => {
        const watched = messageId === target && name === consumer;
        const result = await store.inbox.run(
          messageId,
          name,
          async (tx) => {
            if (watched) firstRunStarted.resolve();
            return work(tx);
          },
          options,
        );
        if (watched && !result.duplicate && !('held' in result)) appliedCommitted.resolve();
        return result;
      },
      recordStart: (messageId, name) => store.inbox.recordStart(messageId, name),
      forget: (messageId, name) => store.inbox.forget(messageId, name),
      prune: (olderThanMs, options) => store.inbox.prune(olderThanMs, options),
      ...(store.inbox.limits ? { limits: store.inbox.limits } : {}),
    };

    let copies = 0;
    let bothSettled = false;
    const replays = new DeliveryWatch();
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, async (delivery) => {
        if (delivery.envelope.messageId === target && delivery.replayed === true) return replays.during(handler(replays.track(delivery)));
        if (delivery.envelope.messageId !== target || delivery.replayed === true || copies > 0) return handler(delivery);
        copies += 1;
        const handedAt = performance.now();
        const copyReturned = deferred();
        // The broker's delivery: its dead-lettering waits for the other copy to commit, or
        // for its handling to return (it will not commit after that). A consumer that claims
        // the message's inbox record before it dead-letters blocks that commit for good, and
        // nothing shows it: so that is not waited for longer than many times what this copy
        // took to get here (a loaded machine stretches both copies' work alike), nor less than 10 s.
        const held: Delivery = {
          envelope: delivery.envelope,
          attempt: delivery.attempt,
          replayed: delivery.replayed,
          redelivered: delivery.redelivered,
          ack: () => delivery.ack(),
          retry: (delayMs, reason) => delivery.retry(delayMs, reason),
          deadLetter: async (reason) => {
            const tookMs = performance.now() - handedAt;
            await Promise.race([appliedCommitted.promise, copyReturned.promise, after(Math.max(10_000, 10 * tookMs))]);
            return delivery.deadLetter(reason);
          },
        };
        // The second copy (a rebalance's new owner), settled on its own: the broker
        // forgets the message once either copy settles it.
        const copy: Delivery = {
          envelope: delivery.envelope,
          attempt: delivery.attempt,
          replayed: delivery.replayed,
          redelivered: delivery.redelivered,
          ack: async () => {},
          retry: async () => {},
          deadLetter: async () => {},
        };
        await Promise.all([handler(held), firstRunStarted.promise.then(() => handler(copy)).finally(() => copyReturned.resolve())]);
        bothSettled = true;
      }),
    );

    let runs = 0;
    const bus = createBus({ outbox: store.outbox, inbox, transport, retry: { maxAttempts: 1, initialDelayMs: 20, maxDelayMs: 100 } });
    closers.unshift(() => bus.stop({ timeoutMs: 10_000 }));
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        runs += 1;
        // The first copy's run fails for good; every later run (the other copy, a replay) succeeds.
        if (runs === 1) throw new UnrecoverableError(`held-twice case: the first copy of ${message.messageId} fails`);
        await store.recordEffect(ctx.tx, message.messageId);
      },
      { concurrency: 4 },
    );
    await bus.start({ relay: false, consumers: true });
    await eventually(() => expect(bus.health().ready).toBe(true), { timeoutMs: 30_000 });
    const [published] = await fixture.transport.publish([envelope]);
    expect(published?.ok, 'the broker took the message').toBe(true);

    const applied = async () => (await store.readEffects()).filter((id) => id === target);
    await eventually(async () => expect(await applied(), 'the other copy applied the message').toHaveLength(1), { timeoutMs: 30_000, intervalMs: 50 });
    expect(copies, 'the message reached the consumer and was handed over twice').toBe(1);
    // Both copies' handling has returned: dead letter, inbox records and marks are as the
    // consumer leaves them.
    await eventually(() => expect(bothSettled, 'both copies were settled').toBe(true), { timeoutMs: 30_000, intervalMs: 50 });

    // An operator replays whatever was dead-lettered: that must not apply it again.
    const letters = (await deadLetters.list(consumer)).filter((letter) => letter.envelope.messageId === target);
    if (letters.length > 0) {
      expect(await deadLetters.replay(consumer, letters.map((letter) => letter.id))).toBe(letters.length);
      await eventually(async () => expect((await deadLetters.list(consumer)).filter((letter) => letter.envelope.messageId === target)).toEqual([]), { timeoutMs: 30_000, intervalMs: 100 });
      // Every replayed copy handled and settled for good: a replayed run, had it run, has committed.
      await eventually(() => expect(replays.done(letters.length), `the consumer is done with the replayed copies (${replays.describe()})`).toBe(true), { timeoutMs: 30_000, intervalMs: 50 });
    }
    expect(await applied(), `applied once (dead letters replayed: ${letters.length})`).toHaveLength(1);
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}
