import type { DuplicateLog } from './duplicate-recording-inbox.js';

/** An order as the orders service stores it. */
export interface OrderRow {
  readonly orderId: string;
  readonly customerId: string;
  readonly totalCents: number;
  readonly currency: string;
  readonly status: 'placed' | 'paid';
  /** The messageId of the `orders.OrderPlaced` written with the order. */
  readonly placedMessageId: string;
  /** How many `PaymentCaptured` were applied to it: exactly 1 once paid, never more. */
  readonly paidCount: number;
  readonly paymentId: string | null;
  /** causationId / correlationId of the `PaymentCaptured` that marked it paid. */
  readonly paidCausationId: string | null;
  readonly paidCorrelationId: string | null;
}

/** A payment as the payments service stores it. */
export interface PaymentRow {
  readonly paymentId: string;
  readonly orderId: string;
  readonly amountCents: number;
  readonly currency: string;
  /** The `OrderPlaced` it was taken for. */
  readonly orderMessageId: string;
  /** The `PaymentCaptured` written with it. */
  readonly capturedMessageId: string;
}

/** A new order. */
export type NewOrder = Omit<OrderRow, 'status' | 'paidCount' | 'paymentId' | 'paidCausationId' | 'paidCorrelationId'>;

/** What marks an order paid. */
export interface PaymentMark {
  readonly paymentId: string;
  readonly causationId: string | null;
  readonly correlationId: string;
}

/**
 * The business tables of both services, behind the unit of work `Tx` their Courier
 * stores share (a MikroORM EntityManager, or an in-memory transaction).
 *
 * Writes join `tx` and commit with it — together with whatever the bus appended to the
 * outbox, or recorded in the inbox, in the same unit of work.
 */
export interface ShopStorage<Tx> extends DuplicateLog {
  /** Runs `work` in a new unit of work and commits it (rolls back if `work` throws). */
  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T>;
  /** Ids of the orders committed so far. */
  orderIds(): Promise<ReadonlySet<string>>;
  addOrder(tx: Tx, order: NewOrder): void;
  addPayment(tx: Tx, payment: PaymentRow): void;
  /** Marks the order paid in `tx` (counting every application); false when there is no such order. */
  markPaid(tx: Tx, orderId: string, mark: PaymentMark): Promise<boolean>;
  readOrders(): Promise<readonly OrderRow[]>;
  readPayments(): Promise<readonly PaymentRow[]>;
  /** Suppressed duplicates recorded for `consumer` (see DuplicateRecordingInbox). */
  countDuplicates(consumer: string): Promise<number>;
}
