// A transport that keeps a retrying delivery in hand only for so long (Azure Service Bus: the
// lock the SDK renews within maxLockRenewalMs) declares `retryDelayLimit`; a longer retry
// delay would let the message come back with its old attempt (issue 29), so the bus refuses it.
import { describe, expect, it } from 'vitest';
import { ConfigError, createBus, defineMessage, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore, type Transport } from '@courier/core';

const Note = defineMessage('notes.NoteTaken', { version: 1 });

function limited(inner: Transport, maxMs: number): Transport {
  return {
    capabilities: { ...inner.capabilities, retryDelayLimit: { maxMs, setting: 'maxLockRenewalMs' } },
    publish: (messages, options) => inner.publish(messages, options),
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}

function stores() {
  const database = new InMemoryDatabase();
  return { outbox: new InMemoryOutboxStore({ database }), inbox: new InMemoryInboxStore({ database }) };
}

const problemsOf = (work: () => unknown): readonly string[] => {
  try {
    work();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return (error as ConfigError).problems;
  }
  throw new Error('expected a ConfigError');
};

describe("the transport's retryDelayLimit", () => {
  it('createBus refuses a retry maxDelayMs (and a relay pause maxDelayMs) above it, naming both settings', async () => {
    const broker = new InMemoryBroker();
    try {
      const transport = limited(broker.connect(), 60_000);
      const problems = problemsOf(() => createBus({ ...stores(), transport, retry: { maxDelayMs: 120_000 }, relay: { pause: { maxDelayMs: 90_000 } } }));
      expect(problems).toEqual([
        expect.stringMatching(/^'retry\.maxDelayMs' \(120000 ms\) is longer than the transport's 'maxLockRenewalMs' \(60000 ms\)/),
        expect.stringMatching(/^'relay\.pause\.maxDelayMs' \(90000 ms\) is longer than the transport's 'maxLockRenewalMs' \(60000 ms\)/),
      ]);
      // At the limit, and the defaults under a generous one, are accepted.
      expect(() => createBus({ ...stores(), transport, retry: { maxDelayMs: 60_000 } })).not.toThrow();
      expect(() => createBus({ ...stores(), transport: limited(broker.connect(), 360_000) })).not.toThrow();
    } finally {
      await broker.close();
    }
  });

  it("subscribe refuses a consumer's own retry maxDelayMs above it", async () => {
    const broker = new InMemoryBroker();
    try {
      const bus = createBus({ ...stores(), transport: limited(broker.connect(), 60_000), retry: { maxDelayMs: 30_000 } });
      const problems = problemsOf(() => bus.subscribe('billing', Note, async () => undefined, { retry: { maxDelayMs: 61_000 } }));
      expect(problems).toEqual([expect.stringMatching(/^'billing\.retry\.maxDelayMs' \(61000 ms\) is longer than the transport's 'maxLockRenewalMs' \(60000 ms\)/)]);
      expect(() => bus.subscribe('billing', Note, async () => undefined, { retry: { maxDelayMs: 60_000 } })).not.toThrow();
    } finally {
      await broker.close();
    }
  });
});
