// Runs the demo's in-process setups end to end with a small order count and checks the
// reconciliation — and that the reconciliation does catch a count that does not add up.
import { describe, expect, it } from 'vitest';
import { catalog } from '../src/catalog.js';
import { runInProcess } from '../src/in-process-run.js';
import { patientInspector } from '../src/inspectors.js';
import { parseCommand, type ExampleOptions } from '../src/options.js';
import { reconcile } from '../src/reconciliation.js';
import type { Snapshot } from '../src/snapshot.js';

const ORDERS = 60;

function optionsFor(setup: string): ExampleOptions {
  const command = parseCommand([setup, '--orders', String(ORDERS), '--timeout', '60'], {});
  if (command.kind !== 'run') throw new Error(`expected a run command, got ${command.kind}`);
  return command.options;
}

describe.each(['in-memory', 'sqlite'])('the %s setup, end to end', (setup) => {
  it(`places ${ORDERS} orders and reconciles: each paid exactly once or its OrderPlaced dead-lettered`, async () => {
    const lines: string[] = [];
    const result = await runInProcess(optionsFor(setup), (line) => lines.push(line));
    const output = lines.join('\n');
    expect(result.ok, output).toBe(true);
    expect(output).toContain('RECONCILED');

    const poison = catalog(ORDERS).filter((order) => order.poison).length;
    expect(poison).toBeGreaterThan(0);
    const [orders, payments] = result.report.rows;
    expect(orders).toMatchObject({ service: 'orders', committed: ORDERS, published: ORDERS, processed: ORDERS - poison, deadLettered: 0 });
    expect(payments).toMatchObject({ service: 'payments', committed: ORDERS - poison, published: ORDERS - poison, processed: ORDERS - poison, deadLettered: poison });
    expect(result.snapshot.deadLetters.payments.map((letter) => letter.code)).toEqual(Array(poison).fill('UNRECOVERABLE'));
    expect(result.snapshot.orders.filter((order) => order.status === 'paid')).toHaveLength(ORDERS - poison);

    // The same snapshot with one payment applied twice must not reconcile.
    const [first, ...rest] = result.snapshot.orders.filter((order) => order.paidCount === 1);
    const tampered = { ...result.snapshot, orders: [{ ...first!, paidCount: 2 }, ...rest, ...result.snapshot.orders.filter((order) => order.paidCount === 0)] };
    const counters = { processed: 0, duplicates: 0, retries: 0 };
    const report = reconcile(tampered, ORDERS, { orders: counters, payments: counters });
    expect(report.ok).toBe(false);
    expect(report.checks.filter((check) => !check.ok).map((check) => check.text).join('\n')).toContain(first!.orderId);
  });
});

describe('the monitor of a run', () => {
  // CI's PostgreSQL + Kafka run died on one failed read of the counts while a worker was
  // creating its topics; a read failing for a moment must not end a run.
  it('reads the counts again when a read fails for a moment, and says so', async () => {
    const snapshot = {} as Snapshot;
    let reads = 0;
    const lines: string[] = [];
    const inspector = patientInspector(
      {
        snapshot: async () => {
          reads += 1;
          if (reads <= 2) throw new Error('This server is not the leader for that topic-partition');
          return snapshot;
        },
      },
      (line) => lines.push(line),
    );
    await expect(inspector.snapshot()).resolves.toBe(snapshot);
    expect(reads).toBe(3);
    expect(lines).toEqual(Array(2).fill('  (could not read the counts, reading again: Error: This server is not the leader for that topic-partition)'));
  });

  it('ends the run with the last error once reads have failed for the whole patience', async () => {
    let reads = 0;
    const inspector = patientInspector(
      {
        snapshot: async () => {
          reads += 1;
          throw new Error(`read ${reads} failed`);
        },
      },
      () => undefined,
      1_500,
    );
    await expect(inspector.snapshot()).rejects.toThrow(/read [23] failed/);
    expect(reads).toBeGreaterThanOrEqual(2);
  });
});
