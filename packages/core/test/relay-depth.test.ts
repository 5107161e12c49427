import { describe, expect, it } from 'vitest';
import { defineMessage, type PublishResult, type Transport } from '@courier/core';
import { eventually, harness } from './support/harness.js';

const Placed = defineMessage('orders.OrderPlaced', { version: 1 });

/** RabbitMQ's transport keeps this many messages unconfirmed by default (`confirmWindow`). */
const BROKER_CONFIRM_WINDOW = 256;

/**
 * Wraps `inner` so no publish call is answered until `open()`: records how many messages
 * the relay has handed over and not had answered, and whether a key ever had two of them.
 */
function gatedTransport(inner: Transport) {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const outstandingKeys = new Set<string>();
  const state = { outstanding: 0, peak: 0, keyTwiceOutstanding: [] as string[], open: () => open() };
  const transport: Transport = {
    capabilities: { ...inner.capabilities, orderedPipelining: false },
    async publish(messages, options): Promise<readonly PublishResult[]> {
      state.outstanding += messages.length;
      state.peak = Math.max(state.peak, state.outstanding);
      for (const { key } of messages) {
        if (key === null) continue;
        if (outstandingKeys.has(key)) state.keyTwiceOutstanding.push(key);
        outstandingKeys.add(key);
      }
      try {
        await gate;
        return await inner.publish(messages, options);
      } finally {
        state.outstanding -= messages.length;
        for (const { key } of messages) if (key !== null) outstandingKeys.delete(key);
      }
    },
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
  return { transport, state };
}

describe('relay in-flight depth with the default settings', () => {
  it('hands the transport at least two confirm windows before the first answer, one head per key, and every key stays in order', { timeout: 120_000 }, async () => {
    // Why it matters: each loop waits for its batch's slowest confirm and then for its next
    // claim; the broker's confirm window only stays full meanwhile if the loops together
    // hold more than it. With batches of 100 the relay held 400 (four loops), and drains
    // reached ~0.6–0.7 of a plain publish loop with a window of 256 (bench/README.md).
    let gated: ReturnType<typeof gatedTransport> | undefined;
    await using h = harness({
      transport: (inner) => {
        gated = gatedTransport(inner);
        return gated.transport;
      },
    });
    const keys = 1_200;
    const seen: string[] = [];
    h.bus.subscribe('sink', Placed, async (message) => {
      seen.push((message.payload as { id: string }).id);
    });
    // Two messages per key: a key's second may only go once its first is confirmed.
    const ids = Array.from({ length: keys * 2 }, (_, index) => `m${index}`);
    await h.commit((tx) => {
      for (const [index, id] of ids.entries()) h.bus.outbox(tx).publish(Placed, { id }, { key: `k${index % keys}` });
    });
    await h.bus.start();
    const state = gated!.state;
    // The loops have claimed and are all waiting on the gate.
    await eventually(() => expect(state.outstanding).toBeGreaterThanOrEqual(2 * BROKER_CONFIRM_WINDOW));
    expect(state.keyTwiceOutstanding).toEqual([]);
    state.open();
    // A bound on liveness, not speed: 2,400 deliveries took longer than the default 5 s at load ~25.
    await eventually(() => expect(seen).toHaveLength(ids.length), 60_000);
    expect(state.keyTwiceOutstanding).toEqual([]);
    const position = new Map(seen.map((id, index) => [id, index]));
    const overtaken = Array.from({ length: keys }, (_, key) => key).filter((key) => position.get(`m${key}`)! > position.get(`m${key + keys}`)!);
    expect(overtaken).toEqual([]);
    expect(new Set(seen).size).toBe(ids.length);
    expect(state.peak).toBeLessThanOrEqual(keys);
  });
});
