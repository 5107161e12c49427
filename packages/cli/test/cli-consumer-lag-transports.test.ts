// `courier stats` through the compiled binary on the transports that read a consumer's lag
// beside RabbitMQ (cli-consumer-lag.test.ts): Kafka, Redis Streams and the SQL transport on
// PostgreSQL (issue 35). A consumer away while four messages arrive shows 4; one that never
// subscribed shows "no queue"; and the binary's reads took, moved and created nothing.
import { join } from 'node:path';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, describe, expect, it } from 'vitest';
import { openLagTransport, type LagTransportName } from './support/lag.config.js';
import { PACKAGE_DIR, runCli } from './support/run-cli.js';

const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'lag.config.ts');

describe.each(['kafka', 'redis-streams', 'sql'] as const)('courier stats: consumer lag on %s', (name: LagTransportName) => {
  const prefix = `clilag_${uniqueId()}`.replace(/-/g, '_');
  const cleanup: (() => Promise<void>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close().catch(() => undefined);
  });

  it('shows what waits for a consumer that is away, "no queue" for one that never subscribed, and reading takes nothing', async () => {
    const { transport, close, drop } = await openLagTransport(name, prefix);
    // Runs after the subscriptions close (pushed later, closed first): what it made goes, then the transport.
    cleanup.push(async () => {
      await drop();
      await close();
    });
    if (transport instanceof (await import('../../../plugins/sql-transport/src/index.js')).SqlTransport) await transport.ensureSchema();
    const env = { CLI_TEST_LAG_TRANSPORT: name, CLI_TEST_LAG_PREFIX: prefix, CLI_TEST_CONSUMERS: 'billing,never' };
    const topic = 'orders';
    const received: string[] = [];
    const subscription = await transport.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 2 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    await subscription.close();
    const waiting = Array.from({ length: 4 }, () => makeEnvelope({ topic, key: null }));
    expect((await transport.publish(waiting)).every((result) => result.ok)).toBe(true);
    await eventually(async () => expect(await transport.consumerLag!('billing')).toBe(4), { timeoutMs: 20_000 });

    const json = await runCli(['stats', '--json'], env, 120_000, CONFIG);
    expect(json.code, json.stderr).toBe(0);
    expect(JSON.parse(json.stdout).consumerLag).toEqual({ available: true, consumers: [{ consumer: 'billing', waiting: 4 }, { consumer: 'never', waiting: null }] });
    const text = await runCli(['stats'], env, 120_000, CONFIG);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(/consumer lag at the broker\n\s*CONSUMER\s+WAITING\n/);
    expect(text.stdout).toMatch(/billing\s+4\n/);
    expect(text.stdout).toMatch(/never\s+no queue \(never subscribed\)/);

    // The binary took nothing and created nothing: still 4 and null, and back, the consumer gets all four.
    expect(await transport.consumerLag!('never')).toBeNull();
    expect(await transport.consumerLag!('billing')).toBe(4);
    const back = await transport.subscribe({ consumer: 'billing', topics: [topic], ordered: false, concurrency: 2 }, async (delivery) => {
      received.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    cleanup.push(() => back.close());
    await eventually(() => expect(received.sort()).toEqual(waiting.map((envelope) => envelope.messageId).sort()), { timeoutMs: 30_000 });
    await eventually(async () => expect(await transport.consumerLag!('billing')).toBe(0), { timeoutMs: 20_000 });
  }, 240_000);
});
