// The PostgreSQL setups end to end with --relay log (RabbitMQ, Kafka, SQS through ElasticMQ and
// the SNS stand-in): each worker's relay learns of its outbox's rows from a logical replication
// slot (@courier/pg-logical) instead of polling. Needs PostgreSQL with wal_level = logical and a
// REPLICATION role, RabbitMQ, Kafka and ElasticMQ (`bash scripts/services.sh`).
import { describe, expect, it } from 'vitest';
import { catalog } from '../src/catalog.js';
import { runDistributed } from '../src/distributed-run.js';
import { parseCommand, UsageError } from '../src/options.js';

const ORDERS = 40;

describe('--relay log', () => {
  for (const setup of ['postgres-rabbitmq', 'postgres-kafka', 'postgres-sqs'] as const) {
    it(`${setup}: ${ORDERS} orders relayed from the log reconcile, and the run drops its slots`, async () => {
      const command = parseCommand([setup, '--relay', 'log', '--orders', String(ORDERS), '--timeout', '170', '--stall', '90'], process.env);
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
      // Each worker's relay claimed rows from its slot (the sweep may take a few: rows committed before the slot existed).
      for (const role of ['orders', 'payments']) {
        const claimed = new RegExp(`worker ${role}#\\d+ log-tail relay \\(slot (\\w+)\\): claimed (\\d+) rows from the log, (\\d+) by its sweep`).exec(output);
        expect(claimed, output).not.toBeNull();
        expect(Number(claimed![2]), output).toBeGreaterThan(0);
        expect(output).toContain(`dropped replication slot ${claimed![1]}`);
      }
    }, 180_000);
  }

  it('refuses --relay log where no worker relays from a PostgreSQL outbox, and an unknown mode, naming what is wrong', () => {
    expect(() => parseCommand(['sqlite-sql', '--relay', 'log'], {})).toThrow(UsageError);
    expect(() => parseCommand(['sqlite-sql', '--relay', 'log'], {})).toThrow(/--relay log needs a setup whose workers relay from a PostgreSQL outbox .*got 'sqlite-sql'/);
    expect(() => parseCommand(['postgres-rabbitmq', '--relay', 'wal'], {})).toThrow(/--relay must be one of polling, log, got 'wal'/);
    expect(() => parseCommand(['postgres-sqs', '--relay', 'log', '--relay-once'], {})).toThrow(/--relay log and --relay-once exclude each other/);
    expect(() => parseCommand(['postgres-rabbitmq', '--relay', 'log', '--data-layer', 'orders=prisma'], {})).toThrow(/--relay log needs both services on MikroORM/);
    expect(parseCommand(['postgres-rabbitmq', '--relay', 'log', '--data-layer', 'mikro-orm'], {})).toMatchObject({ options: { relay: 'log' } });
    const polling = parseCommand(['postgres-rabbitmq'], {});
    expect(polling.kind === 'run' && polling.options.relay).toBe('polling');
  });
});
