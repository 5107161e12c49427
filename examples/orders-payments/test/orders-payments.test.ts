// Runs the demo's in-process setups end to end with a small order count and checks the
// reconciliation — and that the reconciliation does catch a count that does not add up.
import { describe, expect, it } from 'vitest';
import { catalog } from '../src/catalog.js';
import { runInProcess } from '../src/in-process-run.js';
import { patientInspector } from '../src/inspectors.js';
import { parseCommand, type ExampleOptions } from '../src/options.js';
import { reconcile } from '../src/reconciliation.js';
import { SettleWatch, type Snapshot } from '../src/snapshot.js';
import type { OrderRow } from '../src/shop-storage.js';

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

describe('when a run stops waiting for its counts', () => {
  // A run on a loaded machine settled steadily but slowly and was cut off by a fixed budget
  // (NOT RECONCILED for time, nothing lost); a run stops waiting when the counts stop moving.
  const order = (paid: boolean): OrderRow =>
    ({ orderId: 'o', customerId: 'c', totalCents: 1, currency: 'EUR', status: paid ? 'paid' : 'placed', placedMessageId: 'm', paidCount: paid ? 1 : 0, paymentId: null }) as OrderRow;
  const snapshot = (paid: number, of = 3): Snapshot =>
    ({
      orders: Array.from({ length: of }, (_, index) => order(index < paid)),
      payments: Array(paid).fill({}),
      outbox: { orders: { total: of, pending: 0, published: of, dead: 0 }, payments: { total: paid, pending: 0, published: paid, dead: 0 } },
      outboxMessages: null,
      processed: { orders: paid, payments: of },
      duplicates: { orders: 0, payments: 0 },
      deadLetters: { orders: [], payments: [] },
      queued: of - paid,
    }) as unknown as Snapshot;

  it('keeps waiting past the stall time while the counts move, and settles', () => {
    const watch = new SettleWatch({ started: 0, stallMs: 10_000, maxMs: 600_000 });
    expect(watch.observe(snapshot(0), 3, true, 1_000)).toBe('moving');
    expect(watch.observe(snapshot(1), 3, true, 9_000)).toBe('moving');
    expect(watch.observe(snapshot(2), 3, true, 18_000)).toBe('moving');
    expect(watch.observe(snapshot(3), 3, true, 27_000)).toBe('settled');
  });

  it('gives up once nothing moved for the stall time, and says so', () => {
    const watch = new SettleWatch({ started: 0, stallMs: 10_000, maxMs: 600_000 });
    expect(watch.observe(snapshot(1), 3, true, 1_000)).toBe('moving');
    expect(watch.observe(snapshot(1), 3, true, 10_999)).toBe('moving');
    expect(watch.observe(snapshot(1), 3, true, 11_000)).toBe('stalled');
    expect(watch.describe('stalled')).toBe('the counts did not move for 10s and have not settled; reconciling what there is');
  });

  it('does not settle while the run is not done, and stops at the run limit even while moving', () => {
    const watch = new SettleWatch({ started: 0, stallMs: 10_000, maxMs: 20_000 });
    expect(watch.observe(snapshot(3), 3, false, 1_000)).toBe('moving');
    expect(watch.observe(snapshot(3), 3, true, 2_000)).toBe('settled');
    const busy = new SettleWatch({ started: 0, stallMs: 10_000, maxMs: 20_000 });
    expect(busy.observe(snapshot(1), 3, true, 15_000)).toBe('moving');
    expect(busy.observe(snapshot(2), 3, true, 20_000)).toBe('over-time');
    expect(busy.describe('over-time')).toBe('the counts did not settle within 20s (still moving); reconciling what there is');
  });
});
