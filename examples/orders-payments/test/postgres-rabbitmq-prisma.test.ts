// The postgres-rabbitmq setup with its services on Prisma (`--data-layer`): the example's Prisma
// Client generated from prisma/schema.prisma at run time, offline, each service's business rows
// written with Prisma models and its outbox and inbox through @courier/prisma, in PostgreSQL,
// over RabbitMQ. Small distributed runs, bounded: both services on Prisma without and with
// --chaos (workers SIGKILLed and restarted), and orders on Prisma beside payments on MikroORM
// under --chaos (each service chooses its data layer). Each run took 10–18 s at load ~6 on 2 cores.
import { describe, expect, it } from 'vitest';
import { catalog } from '../src/catalog.js';
import { runDistributed } from '../src/distributed-run.js';
import { parseCommand, UsageError } from '../src/options.js';

async function run(args: readonly string[], orders: number): Promise<{ output: string; result: Awaited<ReturnType<typeof runDistributed>> }> {
  const command = parseCommand(['postgres-rabbitmq', ...args, '--orders', String(orders), '--timeout', '150', '--stall', '60'], process.env);
  if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
  const lines: string[] = [];
  const result = await runDistributed(command.options, (line) => lines.push(line));
  return { output: lines.join('\n'), result };
}

function expectReconciled(output: string, result: Awaited<ReturnType<typeof runDistributed>>, orders: number): void {
  expect(result.ok, output).toBe(true);
  expect(output).toContain('RECONCILED');
  const poison = catalog(orders).filter((order) => order.poison).length;
  expect(poison, 'the catalog has a poison order to dead-letter').toBeGreaterThan(0);
  const [ordersRow, paymentsRow] = result.report.rows;
  expect(ordersRow).toMatchObject({ committed: orders, published: orders, processed: orders - poison, deadLettered: 0 });
  expect(paymentsRow).toMatchObject({ committed: orders - poison, published: orders - poison, processed: orders - poison, deadLettered: poison });
  expect(result.snapshot.orders.filter((order) => order.status === 'paid' && order.paidCount === 1)).toHaveLength(orders - poison);
}

describe('the postgres-rabbitmq setup on Prisma', () => {
  it('--data-layer prisma: 12 orders placed and paid through Prisma reconcile', async () => {
    const { output, result } = await run(['--data-layer', 'prisma'], 12);
    expectReconciled(output, result, 12);
    expect(output).toContain('data layer: orders on Prisma, payments on Prisma');
    // Said by each worker's service as it was built, not by the options.
    expect(output).toMatch(/worker orders#1 ready \(Prisma, pid/);
    expect(output).toMatch(/worker payments#1 ready \(Prisma, pid/);
  }, 170_000);

  it('--data-layer prisma --chaos: 40 orders reconcile while both workers are SIGKILLed and restarted', async () => {
    const { output, result } = await run(['--data-layer', 'prisma', '--chaos'], 40);
    expectReconciled(output, result, 40);
    expect(output.match(/^chaos: SIGKILL (orders|payments)#/gm)?.length ?? 0, output).toBeGreaterThanOrEqual(4);
    expect(output).toMatch(/chaos: \d+ SIGKILLs \((payments, orders|orders, payments)\)/);
    expect(output).toMatch(/worker orders#([2-9]|\d{2,}) ready \(Prisma, pid/);
  }, 170_000);

  it('--data-layer orders=prisma --chaos: orders on Prisma and payments on MikroORM reconcile under SIGKILLs', async () => {
    const { output, result } = await run(['--data-layer', 'orders=prisma', '--chaos'], 40);
    expectReconciled(output, result, 40);
    expect(output).toContain('data layer: orders on Prisma, payments on MikroORM');
    expect(output).toMatch(/worker orders#1 ready \(Prisma, pid/);
    expect(output).toMatch(/worker payments#1 ready \(MikroORM, pid/);
    expect(output.match(/^chaos: SIGKILL (orders|payments)#/gm)?.length ?? 0, output).toBeGreaterThanOrEqual(4);
  }, 170_000);
});

describe('--data-layer', () => {
  const layers = (...args: string[]) => {
    const command = parseCommand(['postgres-rabbitmq', ...args], {});
    if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
    return command.options.dataLayers;
  };

  it('is MikroORM for both services by default, one layer for both, or chosen per service', () => {
    expect(layers()).toEqual({ orders: 'mikro-orm', payments: 'mikro-orm' });
    expect(layers('--data-layer', 'prisma')).toEqual({ orders: 'prisma', payments: 'prisma' });
    expect(layers('--data-layer', 'orders=prisma')).toEqual({ orders: 'prisma', payments: 'mikro-orm' });
    expect(layers('--data-layer=payments=prisma,orders=mikro-orm')).toEqual({ orders: 'mikro-orm', payments: 'prisma' });
  });

  it('refuses a value that is not a data layer, naming it and the choices', () => {
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer', 'drizzle'], {})).toThrow(UsageError);
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer', 'drizzle'], {})).toThrow(
      "--data-layer must be mikro-orm or prisma, or service=layer pairs such as orders=prisma,payments=mikro-orm; got 'drizzle'",
    );
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer', 'orders=typeorm'], {})).toThrow("--data-layer: 'orders' must be mikro-orm or prisma, got 'typeorm'");
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer', 'shipping=prisma'], {})).toThrow(/got 'shipping=prisma'/);
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer', 'orders=prisma,orders=mikro-orm'], {})).toThrow("--data-layer names 'orders' twice");
    expect(() => parseCommand(['postgres-rabbitmq', '--data-layer'], {})).toThrow(UsageError);
  });

  it('refuses a setup whose services cannot switch, naming the setup', () => {
    expect(() => parseCommand(['--data-layer', 'prisma'], {})).toThrow("--data-layer needs the postgres-rabbitmq setup, got 'sqlite-sql'");
    expect(() => parseCommand(['postgres-kafka', '--data-layer', 'prisma'], {})).toThrow("--data-layer needs the postgres-rabbitmq setup, got 'postgres-kafka'");
  });
});
