import { TransportError, createBus, defineMessage, hasInboxHalts, type AppendResult, type Bus, type BusCounters, type Delivery, type Transport } from '@courier/core';
import { expect } from 'vitest';
import type { FixtureContext, StoreFixture, TransportFixture } from '../fixtures.js';
import { eventually } from '../support/eventually.js';
import { makeEnvelope } from '../support/make-envelope.js';
import { uniqueId } from '../support/unique-id.js';
import { withSettles, withSubscribe } from '../support/wrap-transport.js';
import type { BusFactories } from './run-scenario.js';
import { WaitBudget, cutNote } from './wait-budget.js';
import { envLogger } from './world.js';

/**
 * The longest single wait of these cases: a consumer getting ready, a delivery arriving. A
 * broker's redelivery of a delivery left unsettled on a killed connection gets twice as
 * long (a Kafka group's session timeout, a lock or lease that must lapse first).
 */
const WAIT_MS = 30_000;
/** Kept back from the case's deadline for its assertions and for closing what it opened. */
const RESERVE_MS = 3_000;
/** The one retry policy of these cases: a message's first failure is its last, so a failed ack taken for one shows as a dead letter or a halted key rather than a retry. */
const ONE_ATTEMPT = { maxAttempts: 1, initialDelayMs: 20, maxDelayMs: 100 } as const;

/** Options of {@link runAckAnswerLostCase}. */
export interface AckAnswerLostOptions {
  /** Subscribe ordered with `poison: 'halt'`, so a failed ack taken for the handler's failure would halt the key. */
  readonly orderedHalt: boolean;
}

/** The settles the consumer asked of one delivery, in order: `ack`, `retry <code>`, `deadLetter <code>`. */
type SettleCalls = string[];

/**
 * `delivery` with every settle the consumer asks of it appended to `calls` before it goes on.
 * `ack` runs `firstAck` instead for the first ack asked (what the broker and the connection
 * make of it), and `later` runs every settle after that one (as the broker would take it:
 * through to the delivery, which ignores settles after the first, or refused).
 */
function recording(delivery: Delivery, calls: SettleCalls, firstAck: () => Promise<void>, later: (settle: () => Promise<void>) => Promise<void>): Delivery {
  let acked = false;
  return withSettles(delivery, {
    ack: async () => {
      calls.push('ack');
      if (!acked) {
        acked = true;
        return firstAck();
      }
      return later(() => delivery.ack());
    },
    retry: async (delayMs, reason) => {
      calls.push(`retry ${reason.code}`);
      return later(() => delivery.retry(delayMs, reason));
    },
    deadLetter: async (reason) => {
      calls.push(`deadLetter ${reason.code}`);
      return later(() => delivery.deadLetter(reason));
    },
  });
}

/** What a connection that dropped says about a settle it could not carry: retriable, as the Delivery contract has it. */
function connectionLost(messageId: string, what: string): TransportError {
  return new TransportError(`lost-ack case: settling '${messageId}': the connection dropped ${what}`);
}

/** The counters a failed ack moves: the ones that must stay 0, and `ackFailures`, summed over `buses`. */
function ackCounters(buses: readonly Bus<unknown, AppendResult>[]): Pick<BusCounters, 'retries' | 'deadLettered' | 'haltedKeys' | 'ackFailures'> {
  const sum = (name: 'retries' | 'deadLettered' | 'haltedKeys' | 'ackFailures') => buses.reduce((total, bus) => total + bus.health().counters[name], 0);
  return { retries: sum('retries'), deadLettered: sum('deadLettered'), haltedKeys: sum('haltedKeys'), ackFailures: sum('ackFailures') };
}

/** The fixture's dead letters of `consumer`, by messageId, or 'no deadLetters' when the transport keeps none. */
async function deadLettersOf(fixture: TransportFixture, consumer: string): Promise<string[] | 'no deadLetters'> {
  const deadLetters = fixture.transport.deadLetters;
  if (!deadLetters) return 'no deadLetters';
  return (await deadLetters.list(consumer)).map((letter) => letter.envelope.messageId);
}

/** A bus that only consumes, over `transport`, with one attempt per message and the suite's logger. */
function consumingBus<Tx>(store: StoreFixture<Tx>, transport: Transport): Bus<Tx, AppendResult> {
  const logger = envLogger();
  return createBus({ outbox: store.outbox, inbox: store.inbox, transport, retry: ONE_ATTEMPT, ...(logger ? { logger } : {}) });
}

/**
 * Bus case "an ack that reached the broker but whose answer was lost": the consumer's ack
 * of a message is carried out by the broker, and then the connection drops before its
 * answer arrives, so `ack()` rejects with a retriable `TransportError` although the message
 * is gone from the subscription. The inbox had recorded the message: it is applied, and
 * nothing of the failed ack may be taken for the handler's failure — no retry, no dead
 * letter (on its last attempt), no halted key (ordered, `poison: 'halt'`), and no other
 * settle of that delivery (a second settle of an acknowledged delivery tag closes a
 * RabbitMQ channel). The key's next message must then be applied, and the counters of
 * retries, dead letters and halted keys stay 0.
 *
 * The next message is published once the consumer has returned from the first, and the
 * case is judged once its delivery was settled (acknowledged, whether applied or held
 * behind a halt): a key halted for the failed ack shows as that message missing from the
 * effects, not as a wait that times out.
 *
 * `skip` is called (and never returns) for the ordered variant when the store has no
 * halts or the transport no per-key ordering. Every wait ends by `deadline`.
 */
export async function runAckAnswerLostCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never, options: AckAnswerLostOptions, deadline: number): Promise<void> {
  const budget = new WaitBudget(deadline, RESERVE_MS);
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    if (options.orderedHalt) {
      if (!hasInboxHalts(store.inbox)) return skip("the inbox store has no halts (InboxHalts): poison 'halt' cannot be configured with it");
      if (!fixture.transport.capabilities.orderingByKey) return skip("the transport does not declare orderingByKey: poison 'halt' is for ordered subscriptions only");
    }
    const consumer = `${testId}.answer-lost`;
    const definition = defineMessage('conformance.AckAnswerLost', { version: 1, topic: `${testId}.answer-lost` });
    const first = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'lost-answer' });
    const next = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'lost-answer' });

    const calls: SettleCalls = [];
    let handedOver = 0;
    let firstDone = false;
    let nextDone = false;
    const transport = withSubscribe(fixture.transport, (endpoint, handler) =>
      fixture.transport.subscribe(endpoint, async (delivery) => {
        const { messageId } = delivery.envelope;
        if (messageId === next.messageId) {
          // Settled for good once its ack went through (applied, or held behind a halt).
          return handler(withSettles(delivery, {
            ack: async () => {
              await delivery.ack();
              nextDone = true;
            },
            retry: (delayMs, reason) => delivery.retry(delayMs, reason),
            deadLetter: async (reason) => {
              await delivery.deadLetter(reason);
              nextDone = true;
            },
          }));
        }
        if (messageId !== first.messageId || handedOver > 0) return handler(delivery);
        handedOver += 1;
        const watched = recording(
          delivery,
          calls,
          async () => {
            // The broker takes the ack; its answer is lost with the connection.
            await delivery.ack();
            throw connectionLost(messageId, 'after the ack reached the broker, before its answer');
          },
          // Later settles go to the delivery, as a consumer's would: it ignores them (the
          // Delivery contract), so what the case sees of them is the calls recorded.
          (settle) => settle(),
        );
        await handler(watched).finally(() => (firstDone = true));
      }),
    );

    const bus = consumingBus(store, transport);
    closers.unshift(() => bus.stop({ timeoutMs: 10_000 }));
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        await store.recordEffect(ctx.tx, message.messageId);
      },
      options.orderedHalt ? { ordered: true, poison: 'halt', concurrency: 4 } : { concurrency: 4 },
    );
    await bus.start({ relay: false, consumers: true });
    const ready = budget.wait(WAIT_MS);
    await eventually(() => expect(bus.health().ready, `the consumer subscribed${cutNote(ready.cut)}`).toBe(true), { timeoutMs: ready.ms });

    const [published] = await fixture.transport.publish([first]);
    expect(published?.ok, 'the broker took the message').toBe(true);
    // Whatever the consumer makes of the failed ack, it has made it once its handling returned.
    const handled = budget.wait(WAIT_MS);
    await eventually(() => expect(firstDone, `the consumer handled the message and returned from it (settles asked: ${calls.join(', ') || 'none'})${cutNote(handled.cut)}`).toBe(true), {
      timeoutMs: handled.ms,
      intervalMs: 50,
    });

    const [publishedNext] = await fixture.transport.publish([next]);
    expect(publishedNext?.ok, "the broker took the key's next message").toBe(true);
    const settled = budget.wait(WAIT_MS);
    await eventually(() => expect(nextDone, `the consumer settled the key's next message (settles asked of the first: ${calls.join(', ')})${cutNote(settled.cut)}`).toBe(true), { timeoutMs: settled.ms, intervalMs: 50 });

    const effects = (await store.readEffects()).filter((id) => id === first.messageId || id === next.messageId);
    // One comparison, so that a failure shows the whole outcome at once.
    expect({
      settlesOfTheFirstDelivery: calls,
      effects,
      counters: ackCounters([bus]),
      deadLetters: await deadLettersOf(fixture, consumer),
      connected: bus.health().consumers.map((entry) => entry.connected),
    }).toEqual({
      settlesOfTheFirstDelivery: ['ack'],
      effects: [first.messageId, next.messageId],
      // The one ack that failed, seen and counted as such.
      counters: { retries: 0, deadLettered: 0, haltedKeys: 0, ackFailures: 1 },
      deadLetters: fixture.transport.deadLetters ? [] : 'no deadLetters',
      connected: [true],
    });
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}

/**
 * Bus case "an ack that never reached the broker": the connection drops as the consumer
 * acknowledges a message it has applied, so `ack()` rejects with a retriable
 * `TransportError` and the broker still holds the delivery, unsettled. Every settle of that
 * delivery after it is refused the same way (the connection is gone). The broker brings an
 * unsettled delivery back — at once where a handler that returns without settling gives it
 * back, or once its connection is gone (the Transport contract: a delivery not settled
 * before its connection dies is redelivered) — and the consumer must acknowledge that copy
 * as a duplicate: the effect applied once, nothing retried, dead-lettered or halted, and no
 * settle other than the one ack asked of the first delivery.
 *
 * To bring it back on every transport alike, the first consumer's connection is then
 * killed as a crash would (`TransportFixture.kill`) and its bus stopped, and a second bus of
 * the same consumer starts on a new connection. Where the copy came back to the first bus
 * before that, it is judged there: counters are summed over both buses. The case is judged
 * once a later delivery of the message was acknowledged.
 *
 * Every wait ends by `deadline`; the redelivery gets the longest (twice a single wait):
 * a Kafka group's session timeout, a JetStream `AckWait`, a Service Bus lock or a SQL
 * transport lease must pass before the copy comes back.
 */
export async function runAckNeverArrivedCase<Tx>(factories: BusFactories<Tx>, deadline: number): Promise<void> {
  const budget = new WaitBudget(deadline, RESERVE_MS);
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  const closers: (() => Promise<void>)[] = [() => store.close(), () => fixture.close()];
  try {
    const consumer = `${testId}.never-arrived`;
    const definition = defineMessage('conformance.AckNeverArrived', { version: 1, topic: `${testId}.never-arrived` });
    const envelope = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'never-arrived' });
    const target = envelope.messageId;

    const calls: SettleCalls = [];
    let handedOver = 0;
    let laterAcks = 0;
    let firstDone = false;
    const wrap = (connection: Transport) =>
      withSubscribe(connection, (endpoint, handler) =>
        connection.subscribe(endpoint, async (delivery) => {
          if (delivery.envelope.messageId !== target) return handler(delivery);
          handedOver += 1;
          if (handedOver > 1) {
            // A later copy: its ack counts once the broker took it.
            return handler(withSettles(delivery, {
              ack: async () => {
                await delivery.ack();
                laterAcks += 1;
              },
              retry: (delayMs, reason) => delivery.retry(delayMs, reason),
              deadLetter: (reason) => delivery.deadLetter(reason),
            }));
          }
          const watched = recording(
            delivery,
            calls,
            async () => {
              throw connectionLost(target, 'before the ack reached the broker');
            },
            async () => {
              throw connectionLost(target, 'before a settle after the failed ack reached the broker');
            },
          );
          await handler(watched).finally(() => (firstDone = true));
        }),
      );

    const subscribeTo = (bus: Bus<Tx, AppendResult>) =>
      bus.subscribe(
        consumer,
        definition,
        async (message, ctx) => {
          await store.recordEffect(ctx.tx, message.messageId);
        },
        { concurrency: 4 },
      );
    const whenReady = async (bus: Bus<Tx, AppendResult>, which: string) => {
      await bus.start({ relay: false, consumers: true });
      const ready = budget.wait(WAIT_MS);
      await eventually(() => expect(bus.health().ready, `the ${which} consumer subscribed${cutNote(ready.cut)}`).toBe(true), { timeoutMs: ready.ms });
    };

    const firstConnection = await fixture.connect();
    const firstBus = consumingBus(store, wrap(firstConnection));
    closers.unshift(() => firstBus.stop({ timeoutMs: 10_000 }));
    subscribeTo(firstBus);
    await whenReady(firstBus, 'first');

    const [published] = await fixture.transport.publish([envelope]);
    expect(published?.ok, 'the broker took the message').toBe(true);
    const handled = budget.wait(WAIT_MS);
    await eventually(() => expect(firstDone, `the consumer handled the message and returned from it (settles asked: ${calls.join(', ') || 'none'})${cutNote(handled.cut)}`).toBe(true), { timeoutMs: handled.ms, intervalMs: 50 });

    // The first connection dies (it already had: the ack never got through), and a new
    // instance of the consumer takes over on a connection of its own.
    await fixture.kill(firstConnection);
    await firstBus.stop({ timeoutMs: 0 });
    const secondBus = consumingBus(store, wrap(await fixture.connect()));
    closers.unshift(() => secondBus.stop({ timeoutMs: 10_000 }));
    subscribeTo(secondBus);
    await whenReady(secondBus, 'second');

    const back = budget.wait(2 * WAIT_MS);
    await eventually(() => expect(laterAcks, `a later delivery of the message was acknowledged (deliveries so far: ${handedOver})${cutNote(back.cut)}`).toBeGreaterThanOrEqual(1), {
      timeoutMs: back.ms,
      intervalMs: 50,
    });

    const buses = [firstBus, secondBus];
    const duplicates = buses.reduce((total, bus) => total + bus.health().counters.duplicates, 0);
    const { ackFailures, ...counters } = ackCounters(buses);
    expect({
      settlesOfTheFirstDelivery: calls,
      effects: (await store.readEffects()).filter((id) => id === target),
      counters,
      deadLetters: await deadLettersOf(fixture, consumer),
    }).toEqual({
      settlesOfTheFirstDelivery: ['ack'],
      effects: [target],
      counters: { retries: 0, deadLettered: 0, haltedKeys: 0 },
      deadLetters: fixture.transport.deadLetters ? [] : 'no deadLetters',
    });
    // At least the one the case refused: a copy in hand on the first bus as its connection
    // was killed may have had its ack refused as well.
    expect(ackFailures, 'the consumer counted the refused ack as an ack failure').toBeGreaterThanOrEqual(1);
    expect(duplicates, 'the copy the broker brought back was acknowledged as a duplicate').toBeGreaterThanOrEqual(1);
  } finally {
    for (const close of closers) await close().catch(() => undefined);
  }
}
