// The README's quick start, verbatim in substance: if this breaks, the front door is wrong.
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createBus, defineMessage, InMemoryBroker, InMemoryDatabase, InMemoryInboxStore, InMemoryOutboxStore } from '@courier/core';

describe('README quick start', () => {
  it('runs as written and delivers OrderPlaced, then PaymentCaptured', async () => {
    const OrderPlaced = defineMessage('orders.OrderPlaced', { version: 1, schema: z.object({ orderId: z.string(), total: z.number() }) });
    const PaymentCaptured = defineMessage('payments.PaymentCaptured', { version: 1, schema: z.object({ orderId: z.string() }) });
    const database = new InMemoryDatabase();
    const bus = createBus({
      outbox: new InMemoryOutboxStore({ database }),
      inbox: new InMemoryInboxStore({ database }),
      transport: new InMemoryBroker().connect(),
      relay: { pollIntervalMs: 20 },
    });
    const captured: string[] = [];
    bus.subscribe('payments', OrderPlaced, async (message, ctx) => {
      ctx.publish(PaymentCaptured, { orderId: message.payload.orderId }, { key: message.payload.orderId });
    }, { concurrency: 8, ordered: true });
    bus.subscribe('orders', PaymentCaptured, async (message) => {
      captured.push(`${message.payload.orderId}:${message.causationId !== null}`);
    });
    await bus.start({ relay: true, consumers: true });
    await database.transaction(async (tx) => {
      bus.outbox(tx).publish(OrderPlaced, { orderId: 'o-1', total: 42 }, { key: 'o-1' });
    });
    const deadline = Date.now() + 5_000;
    while (captured.length === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10));
    expect(captured).toEqual(['o-1:true']);
    expect(bus.health().counters).toMatchObject({ processed: 2, deadLettered: 0 });
    await bus.stop({ timeoutMs: 10_000 });
    await bus.stop();
  });
});
