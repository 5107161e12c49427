// The bus on JetStream, on a healthy connection: a handler that throws is retried by the core
// (attempt 2), and a settle the broker fails once — the dead letter refused by the
// server, an ack refused — ends where it should: the message dead-lettered (or applied once),
// and the key's next message applied after it. Before, a refused dead letter kept the
// message in hand for ever (seen: run once in 30 s with AckWait 2 s) and its key stopped.
import { eventually, uniqueId } from '@courier/conformance';
import { createBus, defineMessage, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, UnrecoverableError, type Bus, type InMemoryTransaction } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { ACK_WAIT_MS, createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

async function setup(ordered: boolean) {
  const testId = uniqueId();
  const fixture = await createJetStreamFixture({ testId });
  closers.push(() => fixture.close());
  const database = new InMemoryDatabase();
  const outbox = new InMemoryOutboxStore({ database });
  const inbox = new InMemoryInboxStore({ database });
  const bus: Bus<InMemoryTransaction> = createBus({
    outbox,
    inbox,
    transport: fixture.transport,
    retry: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 200, jitter: 0 },
    // The consumer's wait after a failed settle is the relay's pause.
    relay: { pollIntervalMs: 50, pause: { initialDelayMs: 50, maxDelayMs: 200 } },
  });
  closers.push(() => bus.stop({ timeoutMs: 5_000 }));
  const Work = defineMessage(`${testId}.Work`, { version: 1 });
  const runs: { n: number; attempt: number }[] = [];
  const applied: number[] = [];
  const start = async (handle: (n: number, attempt: number) => void) => {
    bus.subscribe(
      'c',
      Work,
      async (message, ctx) => {
        const { n } = message.payload as { n: number };
        runs.push({ n, attempt: ctx.attempt });
        handle(n, ctx.attempt);
        applied.push(n);
      },
      { ordered, concurrency: 2 },
    );
    await bus.start();
  };
  const publish = (...ns: number[]) => database.transaction(async (tx) => ns.map((n) => bus.outbox(tx).publish(Work, { n }, { key: 'k' })));
  const dead = async () => (await fixture.transport.deadLetters!.list('c')).map((letter) => (JSON.parse(letter.envelope.payload) as { n: number }).n);
  return { fixture, bus, runs, applied, start, publish, dead };
}

describe.each([false, true])('the bus on JetStream (ordered: %s)', (ordered) => {
  it('a handler that throws is retried by the core with the next attempt', async () => {
    const { runs, applied, start, publish } = await setup(ordered);
    await start((n, attempt) => {
      if (n === 1 && attempt === 1) throw new Error('transient');
    });
    await publish(1, 2);
    await eventually(() => expect(applied.sort()).toEqual([1, 2]), { timeoutMs: 15_000 });
    expect(runs.filter((run) => run.n === 1).map((run) => run.attempt)).toEqual([1, 2]);
    if (ordered) expect(runs.map((run) => run.n)).toEqual([1, 1, 2]);
  }, 30_000);

  it('a dead letter the broker refuses once: the message is dead-lettered, the key moves on', async () => {
    const { fixture, applied, start, publish, dead } = await setup(ordered);
    await fixture.failSettles!('deadLetter');
    await start((n) => {
      if (n === 1) throw new UnrecoverableError('poison');
    });
    await publish(1, 2);
    await eventually(async () => expect(await dead()).toEqual([1]), { timeoutMs: 6 * ACK_WAIT_MS });
    await eventually(() => expect(applied).toEqual([2]), { timeoutMs: 10_000 });
    // Refused once, then written: one dead letter kept.
    expect(await dead()).toEqual([1]);
  }, 30_000);

  it('an ack the broker refuses once: applied once, counted, the key moves on', async () => {
    const { fixture, bus, applied, start, publish } = await setup(ordered);
    await fixture.failSettles!('ack');
    await start(() => undefined);
    await publish(1, 2);
    await eventually(() => expect(applied.sort()).toEqual([1, 2]), { timeoutMs: 6 * ACK_WAIT_MS });
    await eventually(() => expect(bus.health().counters.ackFailures).toBe(1), { timeoutMs: 10_000 });
    // AckWait brings the refused one back; the inbox drops it.
    await eventually(() => expect(bus.health().counters.duplicates).toBe(1), { timeoutMs: 6 * ACK_WAIT_MS });
    expect(applied.sort()).toEqual([1, 2]);
  }, 40_000);
});
