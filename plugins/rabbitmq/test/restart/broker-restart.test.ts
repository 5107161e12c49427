import type { Envelope } from '@courier/core';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, describe, expect, it } from 'vitest';
import { RabbitMqTransport } from '../../src/index.js';
import { BROKER_URL, deleteTopology, eventually, openConnection, rabbitmqctl, TEST_TIERS_MS, testId } from '../support/broker.js';
import { envelope } from '../support/envelopes.js';

// Stops and starts the RabbitMQ application under load, so it runs in the serial restart
// project, after every other test.
describe('RabbitMqTransport across a broker restart (rabbitmqctl stop_app / start_app)', () => {
  const prefix = `courier-${testId()}`;
  const transport = new RabbitMqTransport({
    connection: BROKER_URL,
    prefix,
    delayTiersMs: TEST_TIERS_MS,
    reconnect: { initialDelayMs: 100, maxDelayMs: 1_000 },
  });

  afterAll(async () => {
    // Leave the broker running for whatever comes next, even if the test failed midway.
    await rabbitmqctl('start_app').catch(() => undefined);
    await rabbitmqctl('await_startup');
    await transport.close({ signal: AbortSignal.timeout(5_000) });
    await openConnection('restart-check').then((c) => c.close());
    await deleteTopology(prefix, ['c']);
  });

  it('pauses publishing while down, reconnects, resumes consuming, and loses nothing confirmed', async () => {
    const received = new Set<string>();
    await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 8 }, async (d) => {
      received.add(d.envelope.messageId);
      await d.ack();
    });
    const confirmed = new Set<string>();
    let rejectedWhileDown = 0;
    let stop = false;
    // A relay in miniature: publish batches; a rejection pauses; failed messages are retried.
    const producer = (async () => {
      let pending: Envelope[] = [];
      while (!stop || pending.length > 0) {
        if (!stop) pending.push(...Array.from({ length: 50 }, () => envelope('t')));
        try {
          const results = await transport.publish(pending);
          const failed = new Set(results.filter((r) => !r.ok).map((r) => r.messageId));
          for (const r of results) if (r.ok) confirmed.add(r.messageId);
          pending = pending.filter((e) => failed.has(e.messageId));
        } catch (error) {
          expect((error as { retriable?: boolean }).retriable).toBe(true);
          rejectedWhileDown++;
          await sleep(100);
        }
        await sleep(10);
      }
    })();

    await eventually(() => expect(confirmed.size).toBeGreaterThan(500), 20_000);
    await rabbitmqctl('stop_app');
    await eventually(() => expect(rejectedWhileDown).toBeGreaterThan(0), 20_000);
    await rabbitmqctl('start_app');
    await rabbitmqctl('await_startup');
    const before = confirmed.size;
    await eventually(() => expect(confirmed.size).toBeGreaterThan(before + 500), 60_000);
    stop = true;
    await producer;

    await eventually(() => expect([...confirmed].filter((id) => !received.has(id))).toEqual([]), 60_000);
    expect(transport.stats().reconnects).toBeGreaterThanOrEqual(1);
  });
});
