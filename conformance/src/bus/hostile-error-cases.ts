import { REASON_LIMITS, UnrecoverableError, createBus, defineMessage, hasInboxHalts, type AppendResult, type Bus } from '@courier/core';
import { expect } from 'vitest';
import type { FixtureContext } from '../fixtures.js';
import { eventually } from '../support/eventually.js';
import { makeEnvelope } from '../support/make-envelope.js';
import { uniqueId } from '../support/unique-id.js';
import type { BusFactories } from './run-scenario.js';
import { envLogger } from './world.js';

/** Where the hostile error text starts; what every port must keep of it, sanitised. */
const START = 'hostile error start';

/**
 * A handler's error text as bad as it gets: about 100 KiB (more than a MariaDB `TEXT`
 * holds, more than an AMQP frame), with U+0000 (PostgreSQL `text` cannot hold it) and a
 * lone surrogate (no UTF-8 encoding exists) right at the start, so they survive any cut.
 */
function hostileText(messageId: string): string {
  return `${START} \u0000 nul \uD800 lone surrogate of ${messageId}: ${'payload quoted in full é😀 '.repeat(3_500)}`;
}

/** Checks what a port kept of {@link hostileText}: sanitised, bounded by the core's limit, and saying it was cut. */
function expectKeptError(text: string, what: string): void {
  expect(text, `${what}: the start of the handler's error is kept`).toContain(START);
  expect(text, `${what}: U+0000 is replaced`).not.toContain('\u0000');
  expect(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text), `${what}: no lone surrogate is left`).toBe(false);
  expect(Buffer.byteLength(text, 'utf8'), `${what}: at most REASON_LIMITS.messageBytes`).toBeLessThanOrEqual(REASON_LIMITS.messageBytes);
  expect(text, `${what}: the text says it was cut`).toMatch(/cut/);
}

/**
 * Bus case "a handler error of ~100 KiB holding U+0000 and a lone surrogate, `poison:
 * 'park'`": the message ends as a listable dead letter with its error (cut and sanitised),
 * and the key's next message is applied. Before the core bounded reasons, the SQL
 * transport's dead-letter update failed on PostgreSQL (NUL) and on MariaDB (`Data too
 * long`), so the row came back every lease for ever and blocked its key.
 *
 * `skip` is called (and never returns) when the transport keeps no dead letters.
 */
export async function runHostileErrorParkCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never): Promise<void> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  let bus: Bus<Tx, AppendResult> | undefined;
  try {
    const { transport } = fixture;
    const deadLetters = transport.deadLetters;
    if (!deadLetters) return skip('the transport has no deadLetters (nativeDeadLetter: false): nothing to list');
    const ordered = transport.capabilities.orderingByKey;
    const consumer = `${testId}.hostile-park`;
    const definition = defineMessage('conformance.HostileError', { version: 1, topic: `${testId}.hostile` });
    const poison = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'k' });
    const next = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'k' });
    bus = createBus({
      outbox: store.outbox,
      inbox: store.inbox,
      transport,
      retry: { maxAttempts: 1, initialDelayMs: 20, maxDelayMs: 100 },
      ...(envLogger() ? { logger: envLogger()! } : {}),
    });
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        if (message.messageId === poison.messageId) throw new UnrecoverableError(hostileText(message.messageId));
        await store.recordEffect(ctx.tx, message.messageId);
      },
      { concurrency: 4, ordered, poison: 'park' },
    );
    await bus.start({ relay: false, consumers: true });
    await eventually(() => expect(bus!.health().ready).toBe(true), { timeoutMs: 30_000 });
    // One after the other: on an ordered subscription the poison message is the key's head.
    for (const envelope of [poison, next]) {
      const [published] = await transport.publish([envelope]);
      expect(published?.ok, 'the broker took the message').toBe(true);
    }

    const [letter] = await eventually(
      async () => {
        const found = (await deadLetters.list(consumer)).filter((entry) => entry.envelope.messageId === poison.messageId);
        expect(found, 'the message is listed as a dead letter').toHaveLength(1);
        return found;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    expect(letter!.reason.code).toBe('UNRECOVERABLE');
    expectKeptError(letter!.reason.message, 'the dead letter\'s reason');
    await eventually(async () => expect((await store.readEffects()).filter((id) => id === next.messageId), "the key's next message is applied").toHaveLength(1), {
      timeoutMs: 30_000,
      intervalMs: 100,
    });
    expect((await store.readEffects()).filter((id) => id === poison.messageId), 'the poison message is never applied').toEqual([]);
  } finally {
    await bus?.stop({ timeoutMs: 5_000 }).catch(() => undefined);
    await fixture.close().catch(() => undefined);
    await store.close().catch(() => undefined);
  }
}

/**
 * Bus case "the same hostile error with `poison: 'halt'` on an ordered key": the key is
 * halted at the message (listed, with the error cut and sanitised, the next message held
 * behind it) and an operator's `resume(…, 'retry')` applies both in order. Before the core
 * bounded halt errors, the MikroORM inbox's halt failed on PostgreSQL (NUL): the key was
 * never halted and the message was given up on again and again.
 *
 * `skip` is called (and never returns) when the store has no halts or the transport no
 * ordering by key.
 */
export async function runHostileErrorHaltCase<Tx>(factories: BusFactories<Tx>, skip: (reason: string) => never): Promise<void> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  const fixture = await factories.transport(context);
  let bus: Bus<Tx, AppendResult> | undefined;
  try {
    const { transport } = fixture;
    const inbox = store.inbox;
    if (!hasInboxHalts(inbox)) return skip("the inbox store has no halts (InboxHalts): poison 'halt' cannot be configured with it");
    if (!transport.capabilities.orderingByKey) return skip("the transport does not declare orderingByKey: poison 'halt' is for ordered subscriptions only");
    const consumer = `${testId}.hostile-halt`;
    const definition = defineMessage('conformance.HostileError', { version: 1, topic: `${testId}.hostile` });
    const poison = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'k' });
    const next = makeEnvelope({ type: definition.type, topic: definition.topic, key: 'k' });
    let broken = true;
    bus = createBus({
      outbox: store.outbox,
      inbox,
      transport,
      retry: { maxAttempts: 1, initialDelayMs: 20, maxDelayMs: 100 },
      ...(envLogger() ? { logger: envLogger()! } : {}),
    });
    bus.subscribe(
      consumer,
      definition,
      async (message, ctx) => {
        if (broken && message.messageId === poison.messageId) throw new UnrecoverableError(hostileText(message.messageId));
        await store.recordEffect(ctx.tx, message.messageId);
      },
      { concurrency: 4, ordered: true, poison: 'halt' },
    );
    await bus.start({ relay: false, consumers: true });
    await eventually(() => expect(bus!.health().ready).toBe(true), { timeoutMs: 30_000 });
    for (const envelope of [poison, next]) {
      const [published] = await transport.publish([envelope]);
      expect(published?.ok, 'the broker took the message').toBe(true);
    }

    const halt = await eventually(
      async () => {
        const [found] = (await inbox.listHalted({ consumer })).filter((entry) => entry.key === 'k');
        expect(found?.head?.envelope.messageId, 'the key is halted at the message').toBe(poison.messageId);
        expect(found?.held, "the key's next message is held behind it").toBe(1);
        return found!;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    expectKeptError(halt.head!.error, "the halt's error");
    expect(await store.readEffects(), 'nothing of the halted key is applied').not.toContain(next.messageId);

    broken = false;
    expect(await inbox.resumeHalted(consumer, definition.topic, 'k', 'retry'), 'the halt is resumable').toBe(1);
    await eventually(
      async () => expect((await store.readEffects()).filter((id) => id === poison.messageId || id === next.messageId), 'both applied once, in order').toEqual([poison.messageId, next.messageId]),
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    await eventually(async () => expect((await inbox.listHalted({ consumer })).filter((entry) => entry.key === 'k'), 'the halt is lifted').toEqual([]), { timeoutMs: 30_000, intervalMs: 100 });
  } finally {
    await bus?.stop({ timeoutMs: 5_000 }).catch(() => undefined);
    await fixture.close().catch(() => undefined);
    await store.close().catch(() => undefined);
  }
}
