import { describeError, type InMemoryOutboxStore, type TransportDeadLetters } from '@courier/core';
import type { MikroORM } from '@mikro-orm/core';
import type { InMemoryShop } from './in-memory-shop.js';
import type { MikroOrmShop } from './mikro-orm-shop.js';
import { ORDERS_CONSUMER } from './orders-service.js';
import { PAYMENTS_CONSUMER } from './payments-service.js';
import { sleep } from './run-result.js';
import { readDeadLetters, type OutboxCounts, type OutboxMessage, type ServiceName, type Snapshot } from './snapshot.js';

/** Takes a {@link Snapshot} of a running (or stopped) demo. */
export interface Inspector {
  snapshot(): Promise<Snapshot>;
}

/**
 * An inspector that reads again when a read fails, for the monitor of a run: a read can fail
 * for a moment while workers are killed and topics created (CI saw Kafka answer a dead-letter
 * read of a topic created that instant with NOT_LEADER_OR_FOLLOWER), and that is no reason to
 * end the run. Each failure is written; only reads failing for `patienceMs` in a row (an
 * outage, not a moment) end it, with the last error.
 */
export function patientInspector(inspector: Inspector, write: (line: string) => void, patienceMs = 30_000): Inspector {
  return {
    async snapshot() {
      const since = Date.now();
      for (;;) {
        try {
          return await inspector.snapshot();
        } catch (error) {
          if (Date.now() - since >= patienceMs) throw error;
          write(`  (could not read the counts, reading again: ${describeError(error)})`);
          await sleep(1_000);
        }
      }
    },
  };
}

/**
 * Inspects the in-memory setup: business rows from the in-memory shop, outbox counts
 * from the stores' `stats()` (published = rows written − pending − in flight − dead),
 * dead letters from the in-memory broker. The inbox cannot be read from outside, so
 * `processed` is null there and the report falls back to the buses' counters.
 */
export function inMemoryInspector(config: {
  readonly shop: InMemoryShop;
  readonly outboxes: Readonly<Record<ServiceName, InMemoryOutboxStore>>;
  readonly deadLetters: TransportDeadLetters;
}): Inspector {
  return {
    async snapshot() {
      const [orders, payments, ordersStats, paymentsStats, ordersDead, paymentsDead, ordersDuplicates, paymentsDuplicates] = await Promise.all([
        config.shop.readOrders(),
        config.shop.readPayments(),
        config.outboxes.orders.stats(),
        config.outboxes.payments.stats(),
        readDeadLetters(config.deadLetters, ORDERS_CONSUMER),
        readDeadLetters(config.deadLetters, PAYMENTS_CONSUMER),
        config.shop.countDuplicates(ORDERS_CONSUMER),
        config.shop.countDuplicates(PAYMENTS_CONSUMER),
      ]);
      const counts = (total: number, stats: { pending: number; inFlight: number; dead: number }): OutboxCounts => {
        const pending = stats.pending + stats.inFlight;
        return { total, pending, dead: stats.dead, published: total - pending - stats.dead };
      };
      return {
        orders,
        payments,
        outbox: { orders: counts(orders.length, ordersStats), payments: counts(payments.length, paymentsStats) },
        outboxMessages: null,
        processed: { orders: null, payments: null },
        duplicates: { orders: ordersDuplicates, payments: paymentsDuplicates },
        deadLetters: { orders: ordersDead, payments: paymentsDead },
        queued: null,
      };
    },
  };
}

/** Quoted (and schema-qualified) names of one service's Courier tables. */
export interface CourierTableRefs {
  readonly outbox: string;
  readonly inbox: string;
}

/** Quotes `name` for PostgreSQL and SQLite, qualified by `schema` when given. */
export function quoteTable(schema: string | undefined, name: string): string {
  return schema === undefined ? `"${name}"` : `"${schema}"."${name}"`;
}

/**
 * Inspects a MikroORM setup with plain SQL: the business tables (and recorded duplicates)
 * through the shop, each service's outbox (rows by state, and every row's lineage) and
 * inbox (records of its consumer), dead letters through the transport, and optionally the
 * broker's queues.
 */
export function sqlInspector(config: {
  readonly orm: Pick<MikroORM, 'em'>;
  readonly shop: MikroOrmShop;
  readonly tables: Readonly<Record<ServiceName, CourierTableRefs>>;
  readonly deadLetters: TransportDeadLetters;
  readonly queued?: () => Promise<number>;
}): Inspector {
  const sql = async (query: string, params: readonly unknown[] = []): Promise<Record<string, unknown>[]> =>
    (await config.orm.em.getConnection().execute(query, [...params], 'all')) as Record<string, unknown>[];
  const outboxOf = async (service: ServiceName): Promise<{ counts: OutboxCounts; messages: OutboxMessage[] }> => {
    const rows = await sql(`SELECT message_id, message_type, correlation_id, causation_id, state FROM ${config.tables[service].outbox}`);
    const byState = (state: string) => rows.filter((row) => row['state'] === state).length;
    return {
      // Halted rows are held back, not published: counted with the pending ones.
      counts: { total: rows.length, pending: byState('pending') + byState('halted'), published: byState('published'), dead: byState('dead') },
      messages: rows.map((row) => ({
        messageId: String(row['message_id']),
        type: String(row['message_type']),
        correlationId: String(row['correlation_id']),
        causationId: row['causation_id'] === null || row['causation_id'] === undefined ? null : String(row['causation_id']),
      })),
    };
  };
  // The message ids the consumer's inbox recorded. The core also records a message it
  // dead-lettered (so later copies are acknowledged as duplicates), so the handled count
  // leaves out the dead letters' ids below.
  const processedBy = async (service: ServiceName, consumer: string): Promise<string[]> => {
    const rows = await sql(`SELECT message_id FROM ${config.tables[service].inbox} WHERE consumer = ?`, [consumer]);
    return rows.map((row) => String(row['message_id']));
  };
  const handled = (recorded: readonly string[], dead: readonly { messageId: string }[]): number => {
    const deadIds = new Set(dead.map((letter) => letter.messageId));
    return recorded.filter((id) => !deadIds.has(id)).length;
  };
  return {
    async snapshot() {
      const [orders, payments, ordersOutbox, paymentsOutbox, ordersProcessed, paymentsProcessed, ordersDead, paymentsDead, queued, ordersDuplicates, paymentsDuplicates] = await Promise.all([
        config.shop.readOrders(),
        config.shop.readPayments(),
        outboxOf('orders'),
        outboxOf('payments'),
        processedBy('orders', ORDERS_CONSUMER),
        processedBy('payments', PAYMENTS_CONSUMER),
        readDeadLetters(config.deadLetters, ORDERS_CONSUMER),
        readDeadLetters(config.deadLetters, PAYMENTS_CONSUMER),
        config.queued ? config.queued() : Promise.resolve(null),
        config.shop.countDuplicates(ORDERS_CONSUMER),
        config.shop.countDuplicates(PAYMENTS_CONSUMER),
      ]);
      return {
        orders,
        payments,
        outbox: { orders: ordersOutbox.counts, payments: paymentsOutbox.counts },
        outboxMessages: { orders: ordersOutbox.messages, payments: paymentsOutbox.messages },
        processed: { orders: handled(ordersProcessed, ordersDead), payments: handled(paymentsProcessed, paymentsDead) },
        duplicates: { orders: ordersDuplicates, payments: paymentsDuplicates },
        deadLetters: { orders: ordersDead, payments: paymentsDead },
        queued,
      };
    },
  };
}
