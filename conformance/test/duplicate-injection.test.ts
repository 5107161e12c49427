import { InMemoryBroker, type Envelope, type PublishResult, type Transport } from '@courier/core';
import { describe, expect, it } from 'vitest';
import { runInProcessScenario } from '../src/bus/run-scenario.js';
import { SCENARIOS } from '../src/bus/scenarios.js';
import type { TransportFixture } from '../src/fixtures.js';
import { createInMemoryStoreFixture } from '../src/in-memory-fixtures.js';

/**
 * An in-memory broker that de-duplicates by messageId, as JetStream does with
 * `Nats-Msg-Id` (or Service Bus with duplicate detection): a message whose id it has
 * already stored is confirmed and dropped.
 */
function dedupingFixture(options: { injectDuplicate: boolean }): TransportFixture {
  const broker = new InMemoryBroker();
  const stored = new Set<string>();
  const inner = new Map<Transport, Transport>();
  const wrap = (connection: Transport): Transport => {
    const wrapper: Transport = {
      capabilities: connection.capabilities,
      publish: async (messages, publishOptions) => {
        // A copy is dropped whether the first one came in an earlier call or this one.
        const taken = new Set<string>();
        const fresh = messages.filter((envelope) => {
          if (stored.has(envelope.messageId) || taken.has(envelope.messageId)) return false;
          taken.add(envelope.messageId);
          return true;
        });
        const results = await connection.publish(fresh, publishOptions);
        for (const result of results) if (result.ok) stored.add(result.messageId);
        const byId = new Map(results.map((result) => [result.messageId, result]));
        return messages.map((envelope): PublishResult => byId.get(envelope.messageId) ?? { messageId: envelope.messageId, ok: true });
      },
      subscribe: (endpoint, handler) => connection.subscribe(endpoint, handler),
      close: () => connection.close(),
      ...(connection.deadLetters ? { deadLetters: connection.deadLetters } : {}),
    };
    inner.set(wrapper, connection);
    return wrapper;
  };
  const raw = broker.connect();
  return {
    transport: wrap(broker.connect()),
    connect: async () => wrap(broker.connect()),
    kill: async (transport) => broker.kill(inner.get(transport) ?? transport),
    // A real JetStream fixture would publish under another Nats-Msg-Id; here the copy
    // goes past the de-duplication.
    ...(options.injectDuplicate
      ? {
          injectDuplicate: async (envelope: Envelope) => {
            const [result] = await raw.publish([envelope]);
            if (!result?.ok) throw new Error('the broker refused the injected copy');
          },
        }
      : {}),
    close: () => broker.close(),
  };
}

describe('concurrent-duplicate-delivery on a broker that de-duplicates by messageId', () => {
  it('delivers the second copy through the fixture\'s injectDuplicate(): the fault happens and the effect is applied once', async () => {
    const result = await runInProcessScenario(
      { store: createInMemoryStoreFixture, transport: async () => dedupingFixture({ injectDuplicate: true }) },
      SCENARIOS['concurrent-duplicate-delivery'],
      'freeze',
      { seed: 11, timeoutMs: 30_000 },
    );
    expect(result.faultFired, 'both copies reached the consumer').toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.observed.effects.filter((id) => id === result.target)).toHaveLength(1);
    expect(result.deadLettered).toBe(0);
  }, 60_000);

  it('without injectDuplicate() the re-published copy is dropped, so the scenario reports the fault never happened', async () => {
    const result = await runInProcessScenario(
      { store: createInMemoryStoreFixture, transport: async () => dedupingFixture({ injectDuplicate: false }) },
      SCENARIOS['concurrent-duplicate-delivery'],
      'freeze',
      { seed: 11, timeoutMs: 30_000 },
    );
    expect(result.faultFired).toBe(false);
  }, 60_000);
});
