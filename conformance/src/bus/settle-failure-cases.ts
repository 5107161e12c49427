import { UnrecoverableError, createBus, defineMessage, type Bus, type Transport } from '@courier/core';
import { expect } from 'vitest';
import type { FixtureContext, StoreFixture, TransportFixture } from '../fixtures.js';
import { eventually } from '../support/eventually.js';
import { makeEnvelope } from '../support/make-envelope.js';
import { uniqueId } from '../support/unique-id.js';
import { withSettles, withSubscribe } from '../support/wrap-transport.js';
import type { BusFactories } from './run-scenario.js';
import { WaitBudget, cutNote } from './wait-budget.js';
import { envLogger } from './world.js';

/** The longest single wait of these cases: a consumer getting ready, a message settling (a failed settle's message comes back after the pause, and a lease or lock may have to lapse first). */
const WAIT_MS = 45_000;
/** Kept back from the case's deadline for its assertions and for closing what it opened. */
const RESERVE_MS = 3_000;
/**
 * The consumer's pause, which is also how long a message whose settle failed waits before it
 * is asked back: short, so the case does not wait the default 5 s for each.
 */
const PAUSE = { initialDelayMs: 50, maxDelayMs: 500 } as const;
/** Three attempts: the `retry` case's message fails once, its retry settle fails, and it is handled on its next attempt. */
const RETRY = { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 100 } as const;

/** A kind of settle a fixture can make fail (`TransportFixture.failSettles`). */
export type SettleKind = 'ack' | 'retry' | 'deadLetter';

/** Options of {@link runSettleFailsOnceCase}. */
export interface SettleFailsOnceOptions {
  readonly kind: SettleKind;
  /** Subscribe ordered (skipped, saying why, without `orderingByKey`): the key's next message waits behind the first. */
  readonly ordered: boolean;
}

/** A bus that only consumes, over `transport`, with the cases' retry policy and pause and the suite's logger. */
function consumingBus<Tx>(store: StoreFixture<Tx>, transport: Transport): Bus<Tx> {
  const logger = envLogger();
  return createBus({ outbox: store.outbox, inbox: store.inbox, transport, retry: RETRY, relay: { pause: PAUSE }, ...(logger ? { logger } : {}) });
}

/** The fixture's dead letters of `consumer`, by messageId, or 'no deadLetters' when the transport keeps none. */
async function deadLettersOf(fixture: TransportFixture, consumer: string): Promise<string[] | 'no deadLetters'> {
  const deadLetters = fixture.transport.deadLetters;
  if (!deadLetters) return 'no deadLetters';
  return (await deadLetters.list(consumer)).map((letter) => letter.envelope.messageId);
}

/**
 * Bus case "a settle that fails once" (issue 29, shared cause 2): the fixture makes the
 * broker fail the next settle of `kind` (`TransportFixture.failSettles`) — a retry copy or
 * dead-letter copy it refuses, a nak, abandon, dead-letter disposition or ack that fails —
 * and the consumer settles a message that way: `ack` for a message it applied, `retry` for
 * one whose handler fails on its first attempt, `deadLetter` for one whose handler throws an
 * `UnrecoverableError`. Whatever the transport makes of the failure, the message is not
 * lost (applied once, or dead-lettered and listable), not applied twice, and its key's next
 * message, published with it, still runs — a delivery a failed settle left in hand for ever
 * (a Kafka record, a JetStream message whose in-progress heartbeat goes on) stops that key
 * (ordered) or never comes back (unordered). The failure must also be seen: counted in
 * `ackFailures` (ack) or `settleFailures` (retry, dead letter) — a count of 0 says the fault
 * never happened, which fails the case too (a fixture whose `failSettles` does nothing).
 *
 * `skip` is called (and never returns) when the fixture has no `failSettles`, or for the
 * ordered variant when the transport does not declare `orderingByKey`. Every wait ends by
 * `deadline`.
 */
export async function runSettleFailsOnceCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never, options: SettleFailsOnceOptions, deadline: number): Promise<void> {
  const { kind, ordered } = options;
  const budget = new WaitBudget(deadline, RESERVE_MS);
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    if (!fixture.failSettles) return skip('the transport fixture has no failSettles: the broker cannot be made to fail a settle');
    if (ordered && !fixture.transport.capabilities.orderingByKey) return skip('the transport does not declare orderingByKey: no ordered subscription to hold the key');
    // Lower case: Service Bus entity names are case-insensitive.
    const name = `${testId}.settle-${kind.toLowerCase()}`;
    const consumer = name;
    const definition = defineMessage('conformance.SettleFails', { version: 1, topic: name });
    const first = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'settle-fails' });
    const next = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'settle-fails' });

    const runs = new Map<string, number>();
    /** Settles asked, per messageId, in order: `ack`, `retry`, `deadLetter`, or that with ` failed` when it rejected. */
    const settled = new Map<string, string[]>();
    const note = (messageId: string, what: string) => settled.set(messageId, [...(settled.get(messageId) ?? []), what]);
    const watch = async (messageId: string, what: string, settle: () => Promise<void>): Promise<void> => {
      try {
        await settle();
      } catch (error) {
        note(messageId, `${what} failed`);
        throw error;
      }
      note(messageId, what);
    };
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, (delivery) => {
        const { messageId } = delivery.envelope;
        return handler(withSettles(delivery, {
          ack: () => watch(messageId, 'ack', () => delivery.ack()),
          retry: (delayMs, reason) => watch(messageId, 'retry', () => delivery.retry(delayMs, reason)),
          deadLetter: (reason) => watch(messageId, 'deadLetter', () => delivery.deadLetter(reason)),
        }));
      }),
    );

    const bus = consumingBus(store, transport);
    closers.unshift(() => bus.stop({ timeoutMs: 10_000 }));
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        runs.set(message.messageId, (runs.get(message.messageId) ?? 0) + 1);
        if (message.messageId === first.messageId) {
          if (kind === 'deadLetter') throw new UnrecoverableError(`settle-failure case: '${first.messageId}' is poison`);
          if (kind === 'retry' && ctx.attempt === 1) throw new Error(`settle-failure case: '${first.messageId}' fails its first attempt`);
        }
        await store.recordEffect(ctx.tx, message.messageId);
      },
      ordered ? { ordered: true, concurrency: 4 } : { concurrency: 4 },
    );
    await bus.start({ relay: false, consumers: true });
    const ready = budget.wait(WAIT_MS);
    await eventually(() => expect(bus.health().ready, `the consumer subscribed${cutNote(ready.cut)}`).toBe(true), { timeoutMs: ready.ms });

    await fixture.failSettles(kind, 1);
    const published = await fixture.transport.publish([first, next]);
    expect(published.map((result) => result.ok), 'the broker took both messages').toEqual([true, true]);

    const firstEnd = kind === 'deadLetter' ? 'deadLetter' : 'ack';
    // An ack that failed after the inbox recorded the message ends it (the inbox drops any
    // copy that comes back); a retry or dead letter that failed does not.
    const ended = (what: string) => what === firstEnd || (kind === 'ack' && what === 'ack failed');
    // Unordered, the key's next message may be handled first and take the one failing ack:
    // then it is the one that has ended with 'ack failed' (waiting for its copy to come back
    // would wait out a Service Bus lock, on a loaded machine more than the budget).
    const done = () =>
      (settled.get(first.messageId) ?? []).some(ended) &&
      (settled.get(next.messageId) ?? []).some((what) => what === 'ack' || (kind === 'ack' && !ordered && what === 'ack failed'));
    // Twice a single wait: an ack that failed for real on a loaded machine (a lock that lapsed)
    // brings its message back only after a Service Bus lock or a SQL transport lease.
    const wait = budget.wait(2 * WAIT_MS);
    await eventually(
      () =>
        expect(done(), `both messages settled for good: the first ${firstEnd === 'ack' ? 'applied' : 'dead-lettered'}, the key's next applied (settles that went through: ${JSON.stringify(Object.fromEntries(settled))}; handler runs: ${JSON.stringify(Object.fromEntries(runs))}; counters: ${JSON.stringify(bus.health().counters)})${cutNote(wait.cut)}`).toBe(true),
      { timeoutMs: wait.ms, intervalMs: 50 },
    );

    const effects = (await store.readEffects()).filter((id) => id === first.messageId || id === next.messageId);
    const { ackFailures, settleFailures } = bus.health().counters;
    // Unordered, the key's next message may overtake the first while it comes back.
    const applied = kind === 'deadLetter' ? [next.messageId] : [first.messageId, next.messageId];
    expect({
      effects: ordered ? effects : [...effects].sort(),
      deadLetters: await deadLettersOf(fixture, consumer),
      // The fault happened, and was seen as the kind of failure it is. Not for a retry: a
      // transport may do a retry's broker part after the settle resolved (Service Bus abandons
      // after the delay), where only the transport itself sees it fail.
      faultSeen: kind === 'ack' ? ackFailures >= 1 : kind === 'deadLetter' ? settleFailures >= 1 : true,
      connected: bus.health().consumers.map((entry) => entry.connected),
    }).toEqual({
      effects: ordered ? applied : [...applied].sort(),
      deadLetters: fixture.transport.deadLetters ? (kind === 'deadLetter' ? [first.messageId] : []) : 'no deadLetters',
      faultSeen: true,
      connected: [true],
    });
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}

/**
 * Bus case "a dead letter the broker refuses for its size" (issue 29, shared causes 1 and 2):
 * a message whose payload is exactly the transport's declared `maxMessageBytes` and whose
 * handler throws an `UnrecoverableError` with a 1 MiB message is given up on. Its
 * dead-letter copy carries the whole message and the reason, more than the broker takes
 * whole — so the transport (or the core, which bounds the reason text) must still park it: a
 * dead letter that is refused and tried again for ever, or a record left in hand, stops the
 * key. The message must end dead-lettered (listed by `deadLetters`, its payload whole), never
 * applied; the key's next message must be applied. A transport whose declared
 * `maxMessageBytes` leaves no room for its dead-letter headers fails here.
 *
 * Subscribes ordered where the transport declares `orderingByKey` (the key must move on),
 * else unordered. `skip` is not used: every transport runs it. Every wait ends by `deadline`.
 */
export async function runOversizedDeadLetterCase<Tx>(factories: BusFactories<Tx>, deadline: number): Promise<void> {
  const budget = new WaitBudget(deadline, RESERVE_MS);
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    const consumer = `${testId}.oversized-dead`;
    const definition = defineMessage('conformance.OversizedDeadLetter', { version: 1, topic: `${testId}.oversized-dead` });
    const max = fixture.transport.capabilities.maxMessageBytes;
    // A JSON string of exactly `max` UTF-8 bytes: '"' + padding + '"'.
    const payload = `"${'p'.repeat(max - 2)}"`;
    const big = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'oversized-dead', payload });
    const next = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'oversized-dead' });
    const longError = `settle-failure case: poison; ${'e'.repeat(1024 * 1024)}`;

    let nextAcked = false;
    let bigDead = false;
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, (delivery) =>
        handler(withSettles(delivery, {
          ack: async () => {
            await delivery.ack();
            if (delivery.envelope.messageId === next.messageId) nextAcked = true;
          },
          retry: (delayMs, reason) => delivery.retry(delayMs, reason),
          deadLetter: async (reason) => {
            await delivery.deadLetter(reason);
            if (delivery.envelope.messageId === big.messageId) bigDead = true;
          },
        })),
      ),
    );
    const bus = consumingBus(store, transport);
    closers.unshift(() => bus.stop({ timeoutMs: 10_000 }));
    const ordered = fixture.transport.capabilities.orderingByKey;
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        if (message.messageId === big.messageId) throw new UnrecoverableError(longError);
        await store.recordEffect(ctx.tx, message.messageId);
      },
      ordered ? { ordered: true, concurrency: 2 } : { concurrency: 2 },
    );
    await bus.start({ relay: false, consumers: true });
    const ready = budget.wait(WAIT_MS);
    await eventually(() => expect(bus.health().ready, `the consumer subscribed${cutNote(ready.cut)}`).toBe(true), { timeoutMs: ready.ms });

    // A message this large may outlast a fixture's short publish timeout (16 MiB on RabbitMQ):
    // one whose answer did not come in time may still arrive (the waits below tell), so only
    // another failure fails the case here.
    const published = await fixture.transport.publish([big, next]);
    const outcome = published.map((result) => (result.ok ? 'ok' : result.error.code === 'PUBLISH_TIMEOUT' ? 'ok (answer timed out)' : `${result.error.code}: ${result.error.message}`));
    expect(outcome.map((entry) => entry.startsWith('ok')), `the broker took a payload of maxMessageBytes (${max}) and its key's next message: ${outcome.join('; ')}`).toEqual([true, true]);

    const wait = budget.wait(WAIT_MS);
    await eventually(
      () =>
        expect({ bigDead, nextAcked }, `the oversized message dead-lettered and the key's next message applied (publish results: ${outcome.join('; ')}; counters: ${JSON.stringify(bus.health().counters)})${cutNote(wait.cut)}`).toEqual({ bigDead: true, nextAcked: true }),
      { timeoutMs: wait.ms, intervalMs: 100 },
    );
    const effects = (await store.readEffects()).filter((id) => id === big.messageId || id === next.messageId);
    const letters = fixture.transport.deadLetters ? await fixture.transport.deadLetters.list(consumer) : undefined;
    const letter = letters?.find((entry) => entry.envelope.messageId === big.messageId);
    expect({
      effects,
      listed: letters ? letter !== undefined : 'no deadLetters',
      payloadWhole: letters ? letter?.envelope.payload === payload : 'no deadLetters',
      code: letters ? letter?.reason.code : 'no deadLetters',
    }).toEqual({
      effects: [next.messageId],
      listed: letters ? true : 'no deadLetters',
      payloadWhole: letters ? true : 'no deadLetters',
      code: letters ? 'UNRECOVERABLE' : 'no deadLetters',
    });
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}
