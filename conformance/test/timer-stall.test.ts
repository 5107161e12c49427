// The delay, retry, release, renewal and drain-claim cases must hold on a loaded machine:
// when a step of the case takes longer than the short timer it set, the timer may rightly
// have run out, and a case that then insists "not yet" fails a correct store. Here the
// step that a loaded machine would stretch is stalled on purpose, on the in-memory
// reference store and broker (each of these failed before the cases measured their timing).
import { setTimeout as sleep } from 'node:timers/promises';
import type { InboxStore, OutboxStore, Transport } from '@courier/core';
import {
  createInMemoryStoreFixture,
  createInMemoryTransportFixture,
  inboxStoreCases,
  outboxStoreCases,
  transportCases,
  type InboxCaseEnv,
  type OutboxCaseEnv,
  type TransportCaseEnv,
} from '@courier/conformance';
import { describe, it } from 'vitest';

const TIMER_MS = 300;
const STALL_MS = TIMER_MS + 150;

type Stall = (method: string, args: readonly unknown[], call: () => Promise<unknown>) => Promise<unknown>;

/** `target` with every method call passed through `stall`, which decides when the call runs and when it answers. */
function stalled<T extends object>(target: T, stall: Stall): T {
  return new Proxy(target, {
    get(object, property) {
      const value: unknown = Reflect.get(object, property, object);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        const call = () => Promise.resolve((value as (...input: unknown[]) => unknown).apply(object, args));
        return typeof property === 'string' ? stall(property, args, call) : call();
      };
    },
  });
}

const answerLate = async (call: () => Promise<unknown>): Promise<unknown> => {
  const result = await call();
  await sleep(STALL_MS);
  return result;
};

const testId = (prefix: string) => `${prefix}${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;

const outboxOptions = { shortLeaseMs: TIMER_MS, delayMs: TIMER_MS, clockToleranceMs: 100, timeoutMs: 10_000, claimers: 8, rows: 200, largePayloadChars: 1024 };

async function runOutboxCase(name: string, stall: Stall, options: Partial<OutboxCaseEnv<unknown>['options']> = {}): Promise<void> {
  const testCase = outboxStoreCases.find((candidate) => candidate.name === name);
  if (!testCase) throw new Error(`no outbox case named '${name}'`);
  const id = testId('stall');
  const fixture = await createInMemoryStoreFixture({ testId: id });
  try {
    const env: OutboxCaseEnv<unknown> = {
      testId: id,
      skip: (reason) => {
        throw new Error(`skipped: ${reason}`);
      },
      fixture,
      outbox: stalled(fixture.outbox as OutboxStore<unknown>, stall),
      topic: `${id}.outbox`,
      options: { ...outboxOptions, ...options },
    };
    await testCase.run(env);
  } finally {
    await fixture.close();
  }
}

describe('outbox cases with a step stalled past the short timer pass against a correct store', () => {
  it("'respects delayMs and notBefore' when the first claim runs after the delay", async () => {
    let stalls = 1;
    await runOutboxCase('respects delayMs and notBefore: not claimed before, claimed promptly after; a delayed head holds its key', async (method, args, call) => {
      if (method === 'claim' && (args[0] as { owner: string }).owner === 'relay-a' && stalls-- > 0) await sleep(STALL_MS);
      return call();
    });
  });

  it("'a retry is claimable again only after its delay' when fail answers after the delay", async () => {
    await runOutboxCase('a retry is claimable again only after its delay', (method, _args, call) => (method === 'fail' ? answerLate(call) : call()));
  });

  it("'release gives rows back … after an optional delay' when the delayed release answers after the delay", async () => {
    await runOutboxCase('release gives rows back without counting an attempt, after an optional delay', (method, args, call) =>
      method === 'release' && args[2] !== undefined ? answerLate(call) : call(),
    );
  });

  it("'renewed rows are re-claimable only after the renewed lease expires' when the last renewal answers after the lease", async () => {
    // The case renews in a loop for three leases after relay-a's claim, then once more and
    // stops: only that last renewal answers late.
    let claimedAt = Number.POSITIVE_INFINITY;
    await runOutboxCase('renewed rows are re-claimable only after the renewed lease expires', async (method, args, call) => {
      if (method === 'claim' && (args[0] as { owner: string }).owner === 'relay-a') {
        const result = await call();
        claimedAt = Date.now();
        return result;
      }
      if (method === 'renew' && Date.now() >= claimedAt + 3 * TIMER_MS - 30) return answerLate(call);
      return call();
    });
  });
});

describe('an outbox case bounded by timeoutMs on a store slower than that in all', () => {
  it("'never hands one row to two concurrent claimers' when every completion takes 150 ms and all of them more than timeoutMs", async () => {
    // Each key's rows go one at a time (claim, complete, next head): ten or so rounds of 150 ms
    // against a 1 s bound. The bound is for a store that stops handing rows out.
    await runOutboxCase(
      'never hands one row to two concurrent claimers',
      async (method, _args, call) => {
        if (method === 'complete') await sleep(150);
        return call();
      },
      { timeoutMs: 1_000 },
    );
  });
});

describe('inbox cases with a step stalled past the short timer pass against a correct store', () => {
  it("'halts: resume marks once; one drainer at a time…' when drainer a's claim answers after its lease", async () => {
    const name = 'halts: resume marks once; one drainer at a time holds the claim, which another takes after its lease ran out';
    const testCase = inboxStoreCases.find((candidate) => candidate.name === name);
    if (!testCase) throw new Error(`no inbox case named '${name}'`);
    const id = testId('stall');
    const fixture = await createInMemoryStoreFixture({ testId: id });
    try {
      const env: InboxCaseEnv<unknown> = {
        testId: id,
        skip: (reason) => {
          throw new Error(`skipped: ${reason}`);
        },
        fixture,
        inbox: stalled(fixture.inbox as InboxStore<unknown>, (method, args, call) =>
          method === 'claimResumed' && args[1] === 'a' && args[2] === TIMER_MS ? answerLate(call) : call(),
        ),
        outbox: fixture.outbox as OutboxStore<unknown>,
        consumer: `${id}-consumer`,
        options: { concurrentRuns: 8, timeoutMs: 10_000 },
      };
      await testCase.run(env);
    } finally {
      await fixture.close();
    }
  });
});

describe('transport cases with a step stalled past the short timer pass against a correct broker', () => {
  it("'retry(delay) redelivers … without blocking other messages' when the other messages are confirmed after the delay", async () => {
    const name = 'retry(delay) redelivers with attempt + 1 after about the delay, without blocking other messages';
    const testCase = transportCases.find((candidate) => candidate.name === name);
    if (!testCase) throw new Error(`no transport case named '${name}'`);
    const id = testId('stall');
    const fixture = await createInMemoryTransportFixture({ testId: id });
    let publishes = 0;
    try {
      const env: TransportCaseEnv = {
        testId: id,
        skip: (reason) => {
          throw new Error(`skipped: ${reason}`);
        },
        fixture,
        // The second publish (the other messages) reaches the broker only after the retry's delay.
        transport: stalled(fixture.transport, async (method, _args, call) => {
          if (method === 'publish' && ++publishes === 2) await sleep(TIMER_MS + 200);
          return call();
        }) as Transport,
        topic: `${id}.transport`,
        consumer: (consumerName) => `${id}-${consumerName}`,
        options: { timeoutMs: 15_000, retryDelayMs: TIMER_MS, delayToleranceMs: 50, orderedKeys: 4, messagesPerKey: 12, maxOversizeBytes: 1024 * 1024, largePayloadChars: 1024 },
      };
      await testCase.run(env);
    } finally {
      await fixture.close();
    }
  });
});
