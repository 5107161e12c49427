import { describe, expect, it } from 'vitest';
import { createBus, defineMessage, type Transport } from '@courier/core';
import { eventually, uniqueId } from '@courier/conformance';
import { createPostgresFixture, createRabbitMqFixture, E2E_PUBLISH_TIMEOUT_MS } from './support/fixtures.js';

/** Publish calls a relay has running, as counted around its transport. */
function countingCalls(inner: Transport): Transport & { readonly active: () => number } {
  let active = 0;
  return {
    active: () => active,
    capabilities: inner.capabilities,
    async publish(messages, options) {
      active += 1;
      try {
        return await inner.publish(messages, options);
      } finally {
        active -= 1;
      }
    },
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}

// What a reviewer saw with confirmWindow 1: each stop left broker-confirmed rows leased
// (completed with an aborted signal) and counted an attempt for every message not yet sent
// (ABORTED results), so a few deploys with a backlog could dead-letter healthy messages.
describe('relay stop (postgresql+rabbitmq, confirmWindow 1)', () => {
  it('20 stops under a backlog, then a drain: no attempt counted, nothing dead, no copy beyond what was in flight', { timeout: 240_000 }, async () => {
    const context = { testId: uniqueId() };
    const store = await createPostgresFixture(context);
    const broker = await createRabbitMqFixture(context, { outage: 'network', config: { confirmWindow: 1, publishTimeoutMs: E2E_PUBLISH_TIMEOUT_MS } });
    const outbox = store.table('outbox');
    try {
      const Work = defineMessage('e2e.Work', { version: 1, topic: `${context.testId}.work` });
      // The consumer counts every copy the broker delivers, duplicates included.
      const copies = new Map<string, number>();
      let delivered = 0;
      const subscription = await broker.transport.subscribe({ consumer: `${context.testId}.sink`, topics: [Work.topic], ordered: false, concurrency: 16 }, async (delivery) => {
        copies.set(delivery.envelope.messageId, (copies.get(delivery.envelope.messageId) ?? 0) + 1);
        delivered += 1;
        await delivery.ack();
      });

      const total = 800;
      const producer = createBus({ outbox: store.outbox, transport: broker.transport });
      for (let chunk = 0; chunk < total; chunk += 400) {
        await store.transaction(async (em) => {
          for (let index = chunk; index < chunk + 400; index += 1) {
            producer.outbox(em).publish(Work, { n: index }, index % 3 === 0 ? {} : { key: `k-${index % 16}` });
          }
        });
      }

      // One attempt: a stop that counted one would dead-letter the message at once.
      const relay = { retry: { maxAttempts: 1 }, pollIntervalMs: 100 };
      let inFlightAtStops = 0;
      for (let round = 0; round < 20; round += 1) {
        const transport = countingCalls(await broker.connect());
        const worker = createBus({ outbox: store.outbox, transport, relay });
        const before = delivered;
        await worker.start({ consumers: false });
        await eventually(() => expect(delivered).toBeGreaterThanOrEqual(before + 5), { timeoutMs: 30_000 });
        // With a window of 1, each running publish call holds at most one unconfirmed message.
        inFlightAtStops += transport.active();
        await worker.stop({ timeoutMs: 20_000 });
        await transport.close();
        const [rows] = await store.sql(
          `SELECT COUNT(*) FILTER (WHERE state = 'pending' AND lease_token IS NOT NULL) AS leased, COUNT(*) FILTER (WHERE state = 'pending') AS pending, ` +
            `COUNT(*) FILTER (WHERE state <> 'pending' AND state <> 'published') AS dead, COALESCE(MAX(attempts), 0) AS attempts FROM ${outbox}`,
        );
        expect({ round, leased: Number(rows!['leased']), dead: Number(rows!['dead']), attempts: Number(rows!['attempts']) }).toEqual({ round, leased: 0, dead: 0, attempts: 0 });
        expect(Number(rows!['pending']), 'the backlog lasts all 20 stops').toBeGreaterThan(0);
      }

      const transport = await broker.connect();
      const drainer = createBus({ outbox: store.outbox, transport, relay });
      await drainer.start({ consumers: false });
      await eventually(() => expect(copies.size).toBe(total), { timeoutMs: 120_000 });
      await drainer.stop();
      await transport.close();
      const [rows] = await store.sql(
        `SELECT COUNT(*) FILTER (WHERE state = 'published') AS published, COALESCE(MAX(attempts), 0) AS attempts FROM ${outbox}`,
      );
      expect({ published: Number(rows!['published']), attempts: Number(rows!['attempts']) }).toEqual({ published: total, attempts: 0 });
      const duplicates = [...copies.values()].reduce((sum, times) => sum + times - 1, 0);
      expect(duplicates).toBeLessThanOrEqual(inFlightAtStops);
      await subscription.close();
    } finally {
      await broker.close();
      await store.close();
    }
  });
});
