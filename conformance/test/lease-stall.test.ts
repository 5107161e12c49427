// The lease cases must hold on a loaded machine: a claim that takes longer than the short
// lease lets another relay rightly take the row, and a case that then insists "nobody else
// gets it" fails a correct store (seen: MariaDB under load ~11 failed 'an expired lease is
// claimed again…'). Here relay-b's first claims stall for longer than the lease.
import { setTimeout as sleep } from 'node:timers/promises';
import type { OutboxStore } from '@courier/core';
import { createInMemoryStoreFixture, outboxStoreCases, type OutboxCaseEnv } from '@courier/conformance';
import { describe, it } from 'vitest';

const SHORT_LEASE_MS = 300;

/** `outbox` whose first `stalls` claims by relay-b wait longer than the short lease first. */
function stalling<Tx>(outbox: OutboxStore<Tx>, stalls: number): OutboxStore<Tx> {
  let left = stalls;
  return new Proxy(outbox, {
    get(target, property) {
      if (property === 'claim') {
        return async (request: Parameters<OutboxStore<Tx>['claim']>[0]) => {
          if (request.owner === 'relay-b' && left > 0) {
            left -= 1;
            await sleep(SHORT_LEASE_MS + 150);
          }
          return target.claim(request);
        };
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

describe.each([
  ['an expired lease is claimed again with a greater fencing token', 1],
  ['renewed rows are re-claimable only after the renewed lease expires', 1],
  ['renewed rows are re-claimable only after the renewed lease expires', 2],
])('the case %s, with relay-b stalling %i time(s)', (name, stalls) => {
  it('passes against a correct store', async () => {
    const testCase = outboxStoreCases.find((candidate) => candidate.name === name);
    if (!testCase) throw new Error(`no outbox case named '${name}'`);
    const testId = `stall${Date.now().toString(36)}`;
    const fixture = await createInMemoryStoreFixture({ testId });
    try {
      const env: OutboxCaseEnv<unknown> = {
        testId,
        skip: (reason) => {
          throw new Error(`skipped: ${reason}`);
        },
        fixture,
        outbox: stalling(fixture.outbox, stalls),
        topic: `${testId}.outbox`,
        options: { shortLeaseMs: SHORT_LEASE_MS, delayMs: 300, clockToleranceMs: 100, timeoutMs: 10_000, claimers: 8, rows: 200, largePayloadChars: 1024 },
      };
      await testCase.run(env);
    } finally {
      await fixture.close();
    }
  });
});
