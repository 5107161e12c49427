import { StorageError, type InMemoryDatabase, type InMemoryTransaction } from '@courier/core';
import type { NewOrder, OrderRow, PaymentMark, PaymentRow, ShopStorage } from './shop-storage.js';

/**
 * The business tables on Courier's in-memory reference database: rows are staged in the
 * transaction and applied atomically with the outbox and inbox rows at commit.
 */
export class InMemoryShop implements ShopStorage<InMemoryTransaction> {
  readonly #database: InMemoryDatabase;
  readonly #orders = new Map<string, OrderRow>();
  readonly #payments = new Map<string, PaymentRow>();
  readonly #duplicates = new Map<string, number>();

  constructor(database: InMemoryDatabase) {
    this.#database = database;
  }

  transaction<T>(work: (tx: InMemoryTransaction) => Promise<T>): Promise<T> {
    return this.#database.transaction(work);
  }

  async orderIds(): Promise<ReadonlySet<string>> {
    return new Set(this.#orders.keys());
  }

  addOrder(tx: InMemoryTransaction, order: NewOrder): void {
    // The primary key, checked at commit like a database would.
    tx.onPrepare(() => {
      if (this.#orders.has(order.orderId)) throw new StorageError(`order '${order.orderId}' already exists`, { retriable: false });
    });
    tx.onCommit(() => {
      this.#orders.set(order.orderId, { ...order, status: 'placed', paidCount: 0, paymentId: null, paidCausationId: null, paidCorrelationId: null });
    });
  }

  addPayment(tx: InMemoryTransaction, payment: PaymentRow): void {
    tx.onCommit(() => {
      this.#payments.set(payment.paymentId, payment);
    });
  }

  async markPaid(tx: InMemoryTransaction, orderId: string, mark: PaymentMark): Promise<boolean> {
    if (!this.#orders.has(orderId)) return false;
    tx.onCommit(() => {
      const order = this.#orders.get(orderId)!;
      this.#orders.set(orderId, {
        ...order,
        status: 'paid',
        paidCount: order.paidCount + 1,
        paymentId: mark.paymentId,
        paidCausationId: mark.causationId,
        paidCorrelationId: mark.correlationId,
      });
    });
    return true;
  }

  async readOrders(): Promise<readonly OrderRow[]> {
    return [...this.#orders.values()].sort((a, b) => a.orderId.localeCompare(b.orderId));
  }

  async readPayments(): Promise<readonly PaymentRow[]> {
    return [...this.#payments.values()];
  }

  async recordDuplicate(_messageId: string, consumer: string): Promise<void> {
    this.#duplicates.set(consumer, (this.#duplicates.get(consumer) ?? 0) + 1);
  }

  async countDuplicates(consumer: string): Promise<number> {
    return this.#duplicates.get(consumer) ?? 0;
  }
}
