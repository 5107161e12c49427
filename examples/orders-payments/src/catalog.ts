/**
 * The orders a run places, derived from their number alone so that every process of a
 * run (and every restart of one) agrees on them without talking to each other.
 *
 * - every 25th order (from the 7th) is **poison**: its total is negative, which the
 *   payments handler refuses with `UnrecoverableError`, so it is dead-lettered at once;
 * - every 15th order (from the 4th) is **flaky**: its first payment attempt fails with a
 *   transient error, so it is retried through delayed redelivery;
 * - every 10th order (from the 5th) comes from the **legacy checkout**, which still
 *   publishes `orders.OrderPlaced` version 1; the payments consumer upcasts it.
 */
export interface CatalogOrder {
  readonly orderId: string;
  readonly customerId: string;
  readonly totalCents: number;
  readonly poison: boolean;
  readonly flaky: boolean;
  readonly legacy: boolean;
}

const ID_PREFIX = 'order-';

/** The id of order number `index` (0-based): `order-00042`. */
export function orderIdOf(index: number): string {
  return `${ID_PREFIX}${String(index).padStart(5, '0')}`;
}

/** The order number encoded in `orderId`, or -1 if it is not one of the catalog's ids. */
export function indexOf(orderId: string): number {
  if (!orderId.startsWith(ID_PREFIX)) return -1;
  const index = Number(orderId.slice(ID_PREFIX.length));
  return Number.isSafeInteger(index) ? index : -1;
}

/** Order number `index` of any run. */
export function catalogOrder(index: number): CatalogOrder {
  const poison = index % 25 === 7;
  const base = 1_000 + ((index * 7_919) % 9_000);
  return {
    orderId: orderIdOf(index),
    customerId: `customer-${String(index % 37).padStart(3, '0')}`,
    totalCents: poison ? -base : base,
    poison,
    flaky: !poison && index % 15 === 4,
    legacy: index % 10 === 5,
  };
}

/** True when the payments handler must fail the first attempt for `orderId` (simulated gateway timeout). */
export function isFlaky(orderId: string): boolean {
  const index = indexOf(orderId);
  return index >= 0 && catalogOrder(index).flaky;
}

/** The first `count` orders. */
export function catalog(count: number): readonly CatalogOrder[] {
  return Array.from({ length: count }, (_, index) => catalogOrder(index));
}
