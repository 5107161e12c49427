// A settle the broker fails, and a handler that ends without settling, on a healthy
// connection (issue 29, shared cause 2). The subscription used to mark a delivery settled
// before its settle was answered, so a failed one left it in hand for ever: the in-progress
// heartbeat kept telling the server it was being worked on (a failed dead-letter or retry
// copy), or the redelivery AckWait did bring was dropped as "already in hand" (a failed ack);
// the `retry` the core asks for after a failed settle was ignored, and an ordered key's next
// message never ran. The handlers here settle as the core does: a settle that rejects is
// followed by `retry` (`ConsumerRunner.#handle`); a failed ack by nothing (`#ackSettled`).
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import type { Delivery, Envelope, Transport } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { ACK_WAIT_MS, createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** The core's delay for a retry after a failed settle is its pause; short here. */
const RETRY_AFTER_FAILURE_MS = 200;

interface Seen {
  readonly id: string;
  readonly attempt: number;
  readonly redelivered: boolean;
  at: number;
}

async function setup(ordered: boolean) {
  const testId = uniqueId();
  const fixture = await createJetStreamFixture({ testId });
  closers.push(() => fixture.close());
  const topic = `${testId}.settles`;
  const seen: Seen[] = [];
  const failures: string[] = [];
  /** Subscribes `settle` the way the core does: a settle that rejects is followed by `retry`. */
  const subscribe = async (settle: (delivery: Delivery, index: number) => Promise<void>, transport: Transport = fixture.transport) => {
    const subscription = await transport.subscribe({ consumer: `${testId}-c`, topics: [topic], ordered, concurrency: 2 }, async (delivery) => {
      const index = seen.filter((entry) => entry.id === delivery.envelope.messageId).length;
      seen.push({ id: delivery.envelope.messageId, attempt: delivery.attempt, redelivered: delivery.redelivered, at: Date.now() });
      try {
        await settle(delivery, index);
      } catch (error) {
        failures.push(`${delivery.envelope.messageId}: ${(error as Error).message}`);
        await delivery.retry(RETRY_AFTER_FAILURE_MS, { code: 'SETTLE_FAILED', message: (error as Error).message });
      }
    });
    closers.push(() => subscription.close());
    return subscription;
  };
  const publish = async (...envelopes: Envelope[]) => {
    for (const result of await fixture.transport.publish(envelopes)) expect(result.ok).toBe(true);
  };
  const runsOf = (id: string) => seen.filter((entry) => entry.id === id);
  return { testId, fixture, topic, seen, failures, subscribe, publish, runsOf, consumer: `${testId}-c` };
}

describe.each([false, true])('a settle the broker fails (ordered: %s)', (ordered) => {
  it('a dead letter refused once: the message comes back, is dead-lettered, and the key moves on', async () => {
    const { fixture, topic, failures, subscribe, publish, runsOf, consumer } = await setup(ordered);
    const first = makeEnvelope({ topic, key: 'k' });
    const second = makeEnvelope({ topic, key: 'k' });
    await fixture.failSettles!('deadLetter');
    await subscribe(async (delivery) => {
      if (delivery.envelope.messageId === first.messageId) await delivery.deadLetter({ code: 'TEST_POISON', message: 'poison' });
      else await delivery.ack();
    });
    await publish(first, second);
    // Within a few AckWaits: held by the heartbeat it never came back (seen: once in 30 s).
    await eventually(() => expect(runsOf(first.messageId)).toHaveLength(2), { timeoutMs: 4 * ACK_WAIT_MS });
    expect(failures).toEqual([expect.stringMatching(new RegExp(`^${first.messageId}: could not dead-letter '${first.messageId}'`))]);
    await eventually(async () => expect((await fixture.transport.deadLetters!.list(consumer)).map((dead) => dead.envelope.messageId)).toEqual([first.messageId]), { timeoutMs: 10_000 });
    await eventually(() => expect(runsOf(second.messageId)).toHaveLength(1), { timeoutMs: 10_000 });
    // The attempt is not spent on the broker's failure.
    expect(runsOf(first.messageId).map((run) => run.attempt)).toEqual([1, 1]);
    if (ordered) expect(runsOf(second.messageId)[0]!.at).toBeGreaterThanOrEqual(runsOf(first.messageId)[1]!.at);
  }, 30_000);

  it('an ack that fails: the message is not kept in hand, it comes back, and the key moves on', async () => {
    const { fixture, topic, failures, subscribe, publish, runsOf } = await setup(ordered);
    const first = makeEnvelope({ topic, key: 'k' });
    const second = makeEnvelope({ topic, key: 'k' });
    await fixture.failSettles!('ack');
    // As the core does after a failed ack: nothing more (the inbox drops the copy that comes back).
    await subscribe(async (delivery) => delivery.ack().catch((error: unknown) => void failures.push(`${delivery.envelope.messageId}: ${(error as Error).message}`)));
    await publish(first, second);
    await eventually(() => expect(runsOf(second.messageId)).toHaveLength(1), { timeoutMs: 4 * ACK_WAIT_MS });
    // The ack may have been lost on its way: AckWait brings the message back, and it is handed out again.
    await eventually(() => expect(runsOf(first.messageId)).toHaveLength(2), { timeoutMs: 4 * ACK_WAIT_MS });
    expect(failures).toEqual([expect.stringMatching(new RegExp(`^${first.messageId}: could not acknowledge '${first.messageId}'`))]);
  }, 30_000);

  it('a delivery whose handler returns without settling comes back, with its attempt', async () => {
    const { topic, subscribe, publish, runsOf } = await setup(ordered);
    const first = makeEnvelope({ topic, key: 'k' });
    const second = makeEnvelope({ topic, key: 'k' });
    await subscribe(async (delivery, index) => {
      if (delivery.envelope.messageId === first.messageId && index === 0) return;
      await delivery.ack();
    });
    await publish(first, second);
    await eventually(() => expect(runsOf(first.messageId)).toHaveLength(2), { timeoutMs: 4 * ACK_WAIT_MS });
    await eventually(() => expect(runsOf(second.messageId)).toHaveLength(1), { timeoutMs: 10_000 });
    expect(runsOf(first.messageId).map((run) => run.attempt)).toEqual([1, 1]);
    if (ordered) expect(runsOf(second.messageId)[0]!.at).toBeGreaterThanOrEqual(runsOf(first.messageId)[1]!.at);
  }, 30_000);

  it('a delivery whose handler throws without settling comes back', async () => {
    const { fixture, topic, publish, consumer } = await setup(ordered);
    const first = makeEnvelope({ topic, key: 'k' });
    const second = makeEnvelope({ topic, key: 'k' });
    const runs: string[] = [];
    // Straight to the transport: the DeliveryHandler itself rejects (the core never lets a
    // handler's error out; this is the transport's own safety net).
    const subscription = await fixture.transport.subscribe({ consumer, topics: [topic], ordered, concurrency: 2 }, async (delivery) => {
      runs.push(delivery.envelope.messageId);
      if (runs.filter((id) => id === first.messageId).length === 1 && delivery.envelope.messageId === first.messageId) throw new Error('handler failed before settling');
      await delivery.ack();
    });
    closers.push(() => subscription.close());
    await publish(first, second);
    await eventually(() => expect(runs.filter((id) => id === first.messageId)).toHaveLength(2), { timeoutMs: 4 * ACK_WAIT_MS });
    await eventually(() => expect(runs).toContain(second.messageId), { timeoutMs: 10_000 });
    if (ordered) expect(runs).toEqual([first.messageId, first.messageId, second.messageId]);
  }, 30_000);
});

describe('a retry copy the broker fails (unordered)', () => {
  it('the message comes back with the attempt the retry asked for', async () => {
    const { fixture, topic, failures, subscribe, publish, runsOf } = await setup(false);
    const first = makeEnvelope({ topic, key: null });
    await fixture.failSettles!('retry');
    await subscribe(async (delivery) => {
      if (delivery.attempt === 1) await delivery.retry(100, { code: 'TEST_RETRY', message: 'later' });
      else await delivery.ack();
    });
    await publish(first);
    await eventually(() => expect(runsOf(first.messageId).map((run) => run.attempt)).toEqual([1, 2]), { timeoutMs: 4 * ACK_WAIT_MS });
    expect(failures).toEqual([expect.stringMatching(new RegExp(`^${first.messageId}: could not publish the retry of '${first.messageId}'`))]);
    // Put back by this subscription, not left by a crash.
    expect(runsOf(first.messageId).map((run) => run.redelivered)).toEqual([false, false]);
  }, 30_000);
});

describe('a dead letter always fits', () => {
  it('a payload at maxMessageBytes with a reason far over max_payload is dead-lettered, its reason cut', async () => {
    const testId = uniqueId();
    const fixture = await createJetStreamFixture({ testId });
    closers.push(() => fixture.close());
    const topic = `${testId}.large`;
    const consumer = `${testId}-c`;
    const { maxMessageBytes } = fixture.transport.capabilities;
    const large = makeEnvelope({ topic, key: 'k', payload: JSON.stringify('x'.repeat(maxMessageBytes - 2)) });
    const next = makeEnvelope({ topic, key: 'k' });
    // A handler's error that quotes the payload (JSON escapes make it longer still), as the did.
    const reason = { code: 'TEST_POISON', message: `bad payload: ${JSON.stringify(large.payload).repeat(3)}` };
    const failures: string[] = [];
    const acked: string[] = [];
    const subscription = await fixture.transport.subscribe({ consumer, topics: [topic], ordered: true, concurrency: 1 }, async (delivery) => {
      try {
        if (delivery.envelope.messageId === large.messageId) await delivery.deadLetter(reason);
        else await delivery.ack().then(() => void acked.push(delivery.envelope.messageId));
      } catch (error) {
        failures.push((error as Error).message);
        await delivery.retry(RETRY_AFTER_FAILURE_MS, { code: 'SETTLE_FAILED', message: (error as Error).message });
      }
    });
    closers.push(() => subscription.close());
    for (const result of await fixture.transport.publish([large, next])) expect(result.ok || result.error.message).toBe(true);
    const [dead] = await eventually(
      async () => {
        const list = await fixture.transport.deadLetters!.list(consumer);
        expect(list).toHaveLength(1);
        return list;
      },
      { timeoutMs: 15_000 },
    );
    expect(failures.map((failure) => failure.slice(0, 200))).toEqual([]);
    expect(dead!.envelope.payload).toBe(large.payload);
    expect(dead!.reason.code).toBe('TEST_POISON');
    expect(dead!.reason.message.startsWith('bad payload: "\\"xxx')).toBe(true);
    expect(dead!.reason.message).toMatch(/… \(cut; \d+ bytes in all\)$/);
    await eventually(() => expect(acked).toEqual([next.messageId]), { timeoutMs: 10_000 });
  }, 40_000);
});
