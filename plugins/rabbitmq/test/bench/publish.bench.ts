import type { Envelope } from '@courier/core';
import { randomUUID } from 'node:crypto';
import { afterAll, bench, describe } from 'vitest';
import { RabbitMqTransport } from '../../src/index.js';
import { BROKER_URL, deleteTopology, testId } from '../support/broker.js';

// Publish throughput to one quorum queue with publisher confirms, for several confirm
// windows. Run: `npx vitest bench --run --project rabbitmq` (prints msg/s per window).
const MESSAGES = Number(process.env['COURIER_BENCH_MESSAGES'] ?? 20_000);
const BATCH = 500;

function batchOf(topic: string, size: number): Envelope[] {
  return Array.from({ length: size }, (_, i) => {
    const messageId = randomUUID();
    return {
      messageId,
      type: 'bench.Published',
      version: 1,
      topic,
      occurredAt: new Date().toISOString(),
      key: `k${i % 64}`,
      correlationId: messageId,
      causationId: null,
      traceparent: null,
      tracestate: null,
      headers: {},
      payload: '{"orderId":"0190d6f2-8a5b-7cc0-9b3a-4d5e6f708192","total":12.5,"currency":"EUR"}',
    };
  });
}

const prefixes: string[] = [];
afterAll(async () => {
  for (const prefix of prefixes) await deleteTopology(prefix, ['bench'], [1_000, 5_000, 20_000, 60_000, 300_000]);
});

describe('publish to a quorum queue with confirms', () => {
  for (const window of [1, 256, 1024]) {
    bench(
      `confirm window ${window}`,
      async () => {
        const prefix = `courier-${testId()}`;
        prefixes.push(prefix);
        const transport = new RabbitMqTransport({ connection: BROKER_URL, prefix, confirmWindow: window });
        await transport.provision({ consumer: 'bench', topics: ['bench'], ordered: false });
        const total = window === 1 ? Math.min(MESSAGES, 2_000) : MESSAGES;
        const batches = Array.from({ length: Math.ceil(total / BATCH) }, () => batchOf('bench', BATCH));
        const started = performance.now();
        // Two batches in flight, as a relay pipelining its claims would.
        let failed = 0;
        const inFlight: Promise<void>[] = [];
        for (const batch of batches) {
          inFlight.push(transport.publish(batch).then((results) => void (failed += results.filter((r) => !r.ok).length)));
          if (inFlight.length >= 2) await inFlight.shift();
        }
        await Promise.all(inFlight);
        const seconds = (performance.now() - started) / 1000;
        console.log(`[bench] window ${window}: ${total} messages in ${seconds.toFixed(2)} s = ${Math.round(total / seconds)} msg/s (${failed} failed)`);
        await transport.close();
      },
      { iterations: 1, warmupIterations: 0, time: 0, warmupTime: 0 },
    );
  }
});
