import { catalog } from './catalog.js';
import type { ServiceName, Snapshot } from './snapshot.js';

/** In-process counters of one service's bus (summed over its processes). */
export interface ServiceCounters {
  readonly processed: number;
  readonly duplicates: number;
  readonly retries: number;
}

/** One line of the reconciliation table. */
export interface ServiceRow {
  readonly service: ServiceName;
  /** Business rows committed, each with its message in the same transaction (orders / payments). */
  readonly committed: number;
  /** Outbox rows the relay published (broker-confirmed). */
  readonly published: number;
  /** Messages the service's consumer processed (inbox records). */
  readonly processed: number;
  /** Redeliveries the inbox recognised and acknowledged without running the handler (recorded in the database). */
  readonly duplicates: number;
  /** Deliveries the service's consumer dead-lettered, plus outbox rows the relay gave up on. */
  readonly deadLettered: number;
}

/** One reconciliation rule and whether it held. */
export interface Check {
  readonly ok: boolean;
  readonly text: string;
}

/** The outcome of {@link reconcile}. */
export interface Report {
  readonly rows: readonly ServiceRow[];
  readonly checks: readonly Check[];
  readonly ok: boolean;
  readonly notes: readonly string[];
}

const SHOW = 5;

function sample(items: readonly string[]): string {
  if (items.length === 0) return 'none';
  return items.length <= SHOW ? items.join(', ') : `${items.slice(0, SHOW).join(', ')} and ${items.length - SHOW} more`;
}

/**
 * Reconciles a run of `expectedOrders` orders. It holds when every committed order was
 * either paid exactly once or had its OrderPlaced dead-lettered (and that is exactly the
 * poison orders), every PaymentCaptured was applied exactly once, every outbox row was
 * published, and lineage (causation / correlation) was carried from message to message.
 */
export function reconcile(snapshot: Snapshot, expectedOrders: number, counters: Readonly<Record<ServiceName, ServiceCounters>>): Report {
  const checks: Check[] = [];
  const notes: string[] = [];
  const check = (ok: boolean, good: string, bad: string): void => {
    checks.push({ ok, text: ok ? good : bad });
  };
  const { orders, payments } = snapshot;
  const expected = catalog(expectedOrders);
  const committedIds = new Set(orders.map((order) => order.orderId));
  const missing = expected.filter((order) => !committedIds.has(order.orderId)).map((order) => order.orderId);
  check(missing.length === 0, `all ${expectedOrders} orders committed`, `${missing.length} of ${expectedOrders} orders never committed: ${sample(missing)}`);

  // Dual write: every order's OrderPlaced is in the orders outbox, and nothing else is.
  const ordersOutbox = snapshot.outbox.orders;
  const paymentsOutbox = snapshot.outbox.payments;
  if (snapshot.outboxMessages) {
    const placedIds = new Set(snapshot.outboxMessages.orders.filter((m) => m.type === 'orders.OrderPlaced').map((m) => m.messageId));
    const without = orders.filter((order) => !placedIds.has(order.placedMessageId)).map((order) => order.orderId);
    check(
      without.length === 0 && ordersOutbox.total === orders.length,
      `every order committed together with its OrderPlaced (${ordersOutbox.total} outbox rows for ${orders.length} orders)`,
      `orders and OrderPlaced rows disagree: ${ordersOutbox.total} outbox rows for ${orders.length} orders; without a message: ${sample(without)}`,
    );
  }
  const drained = (name: ServiceName) => {
    const counts = snapshot.outbox[name];
    return counts.pending === 0 && counts.dead === 0 && counts.published === counts.total;
  };
  check(
    drained('orders') && drained('payments'),
    `both outboxes fully published (orders ${ordersOutbox.published}/${ordersOutbox.total}, payments ${paymentsOutbox.published}/${paymentsOutbox.total})`,
    `outboxes not fully published: orders ${JSON.stringify(ordersOutbox)}, payments ${JSON.stringify(paymentsOutbox)}`,
  );

  // Every order paid exactly once, or its OrderPlaced dead-lettered — never both, never neither.
  const deadOrderIds = new Set(snapshot.deadLetters.payments.map((letter) => letter.orderId ?? `?${letter.messageId}`));
  const paymentsByOrder = new Map<string, number>();
  for (const payment of payments) paymentsByOrder.set(payment.orderId, (paymentsByOrder.get(payment.orderId) ?? 0) + 1);
  const wrong: string[] = [];
  let paid = 0;
  let dead = 0;
  for (const order of orders) {
    const taken = paymentsByOrder.get(order.orderId) ?? 0;
    const isDead = deadOrderIds.has(order.orderId);
    if (taken === 1 && order.paidCount === 1 && order.status === 'paid' && !isDead) paid += 1;
    else if (taken === 0 && order.paidCount === 0 && isDead) dead += 1;
    else wrong.push(`${order.orderId} (payments ${taken}, applied ${order.paidCount}, dead-lettered ${isDead})`);
  }
  check(
    wrong.length === 0,
    `every committed order settled once: ${paid} paid exactly once, ${dead} with OrderPlaced dead-lettered`,
    `${wrong.length} orders not settled exactly once: ${sample(wrong)}`,
  );
  const poison = new Set(expected.filter((order) => order.poison).map((order) => order.orderId));
  const unexpected = [...deadOrderIds].filter((id) => !poison.has(id));
  const notDead = [...poison].filter((id) => committedIds.has(id) && !deadOrderIds.has(id));
  check(
    unexpected.length === 0 && notDead.length === 0,
    `dead letters are exactly the ${poison.size} poison orders (${sample([...new Set(snapshot.deadLetters.payments.map((l) => l.code))])})`,
    `dead letters differ from the poison orders: unexpected ${sample(unexpected)}; poison not dead-lettered ${sample(notDead)}`,
  );
  const copies = snapshot.deadLetters.payments.length - new Set(snapshot.deadLetters.payments.map((letter) => letter.messageId)).size;
  if (copies > 0) notes.push(`${copies} dead letter(s) were parked twice (a crash between the dead-letter copy and the ack); counted once`);

  // Every PaymentCaptured applied exactly once.
  const applied = orders.reduce((sum, order) => sum + order.paidCount, 0);
  const ordersProcessed = snapshot.processed.orders;
  check(
    applied === payments.length && snapshot.deadLetters.orders.length === 0 && (ordersProcessed === null || ordersProcessed === payments.length),
    `each of ${payments.length} PaymentCaptured applied exactly once${ordersProcessed === null ? '' : ` (${ordersProcessed} inbox records)`}`,
    `PaymentCaptured applied ${applied} times for ${payments.length} payments (inbox records ${String(ordersProcessed)}, dead-lettered ${snapshot.deadLetters.orders.length})`,
  );
  const paymentsProcessed = snapshot.processed.payments;
  if (paymentsProcessed !== null) {
    check(
      paymentsProcessed === payments.length,
      `each handled OrderPlaced took exactly one payment (${paymentsProcessed} inbox records, ${payments.length} payments)`,
      `${paymentsProcessed} OrderPlaced inbox records but ${payments.length} payments`,
    );
  }

  // Lineage: PaymentCaptured names its OrderPlaced as cause and shares its correlation.
  const byOrder = new Map(orders.map((order) => [order.orderId, order]));
  const captured = new Map((snapshot.outboxMessages?.payments ?? []).map((message) => [message.messageId, message]));
  const broken: string[] = [];
  for (const payment of payments) {
    const order = byOrder.get(payment.orderId);
    if (!order) {
      broken.push(`${payment.paymentId} (no order ${payment.orderId})`);
      continue;
    }
    const cause = order.placedMessageId;
    const message = captured.get(payment.capturedMessageId);
    const outboxOk = snapshot.outboxMessages === null || (message !== undefined && message.causationId === cause && message.correlationId === cause);
    if (payment.orderMessageId !== cause || !outboxOk || (order.paidCount > 0 && (order.paidCausationId !== cause || order.paidCorrelationId !== cause))) {
      broken.push(order.orderId);
    }
  }
  check(
    broken.length === 0,
    `lineage kept: each PaymentCaptured caused by its OrderPlaced, same correlationId`,
    `lineage broken for ${broken.length}: ${sample(broken)}`,
  );
  if (snapshot.queued !== null) {
    check(snapshot.queued === 0, 'broker queues drained', `${snapshot.queued} messages still waiting in the broker's queues`);
  }

  const dedupe = (name: ServiceName) => new Set(snapshot.deadLetters[name].map((letter) => letter.messageId)).size + snapshot.outbox[name].dead;
  const rows: ServiceRow[] = [
    {
      service: 'orders',
      committed: orders.length,
      published: ordersOutbox.published,
      processed: ordersProcessed ?? counters.orders.processed,
      duplicates: snapshot.duplicates.orders,
      deadLettered: dedupe('orders'),
    },
    {
      service: 'payments',
      committed: payments.length,
      published: paymentsOutbox.published,
      processed: paymentsProcessed ?? counters.payments.processed,
      duplicates: snapshot.duplicates.payments,
      deadLettered: dedupe('payments'),
    },
  ];
  return { rows, checks, ok: checks.every((c) => c.ok), notes };
}

/** Renders a report as the table and check list the demo prints. */
export function formatReport(report: Report, title: string, footnotes: readonly string[] = []): string {
  const headers = ['service', 'committed', 'published', 'processed', 'duplicates suppressed', 'dead-lettered'];
  const cells = report.rows.map((row) => [row.service, row.committed, row.published, row.processed, row.duplicates, row.deadLettered].map(String));
  const widths = headers.map((header, i) => Math.max(header.length, ...cells.map((row) => row[i]!.length)));
  const line = (values: readonly string[]) => values.map((value, i) => (i === 0 ? value.padEnd(widths[i]!) : value.padStart(widths[i]!))).join('  ');
  const out = [
    '',
    title,
    line(headers),
    widths.map((w) => '-'.repeat(w)).join('  '),
    ...cells.map(line),
    '',
    ...report.checks.map((c) => `  ${c.ok ? 'ok  ' : 'FAIL'}  ${c.text}`),
    ...report.notes.map((note) => `  note  ${note}`),
    ...footnotes.map((note) => `  note  ${note}`),
    '',
    report.ok ? 'RECONCILED: every count adds up.' : `NOT RECONCILED: ${report.checks.filter((c) => !c.ok).length} check(s) failed.`,
  ];
  return out.join('\n');
}
