// The postgres-sqs setup end to end in its --relay-once mode: PostgreSQL (MikroORM) outboxes
// drained by relayOnce — the Lambda entry point of @courier/aws — called every second as an
// EventBridge schedule would, into SNS topics (the stand-in of @courier/aws's tests, unless
// COURIER_SNS_ENDPOINT names one) and the SQS queues subscribed to them (ElasticMQ, or
// COURIER_SQS_ENDPOINT), consumed by the two worker processes, which run no relay. The
// long-running relay under --chaos runs in CI (.ci/run). Cost: 44 s measured at load ~25 on
// 2 cores, most of it the two workers' start-up (~30 s there).
import { catalog } from '../src/catalog.js';
import { describe, expect, it } from 'vitest';
import { runDistributed } from '../src/distributed-run.js';
import { parseCommand, UsageError } from '../src/options.js';

const ORDERS = 12;

describe('the postgres-sqs setup', () => {
  it(`--relay-once: ${ORDERS} orders relayed only by scheduled relayOnce calls reconcile, each paid once or its OrderPlaced dead-lettered`, async () => {
    const command = parseCommand(['postgres-sqs', '--relay-once', '--orders', String(ORDERS), '--timeout', '170', '--stall', '90'], process.env);
    if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
    const lines: string[] = [];
    const result = await runDistributed(command.options, (line) => lines.push(line));
    const output = lines.join('\n');
    expect(result.ok, output).toBe(true);
    expect(output).toContain('RECONCILED');
    const poison = catalog(ORDERS).filter((order) => order.poison).length;
    const [orders, payments] = result.report.rows;
    expect(orders).toMatchObject({ committed: ORDERS, published: ORDERS, processed: ORDERS - poison });
    expect(payments).toMatchObject({ committed: ORDERS - poison, published: ORDERS - poison, deadLettered: poison });
    // Every message was published by a relayOnce call: the workers ran no relay.
    const relayed = /relay-once: (\d+) invocations .* published (\d+), (\d+) publish failures/.exec(output);
    expect(relayed, output).not.toBeNull();
    expect(Number(relayed![2])).toBe(ORDERS + ORDERS - poison);
  }, 180_000);

  it('refuses --relay-once on a setup without the Lambda entry point, naming the setup', () => {
    expect(() => parseCommand(['postgres-kafka', '--relay-once'], {})).toThrow(UsageError);
    expect(() => parseCommand(['postgres-kafka', '--relay-once'], {})).toThrow(/--relay-once needs the postgres-sqs setup .*got 'postgres-kafka'/);
  });
});
