import type { TransportDeadLetters } from '@courier/core';
import type { OrderRow, PaymentRow } from './shop-storage.js';

/** The two services of the demo. */
export type ServiceName = 'orders' | 'payments';

/** Outbox rows of one service by state (`pending` includes rows in flight). */
export interface OutboxCounts {
  readonly total: number;
  readonly pending: number;
  readonly published: number;
  readonly dead: number;
}

/** A dead-lettered delivery, as read from the transport's dead-letter place. */
export interface DeadLetterInfo {
  readonly messageId: string;
  readonly type: string;
  readonly orderId: string | null;
  readonly code: string;
}

/** An outbox row's identity and lineage. */
export interface OutboxMessage {
  readonly messageId: string;
  readonly type: string;
  readonly correlationId: string;
  readonly causationId: string | null;
}

/**
 * Everything the reconciliation looks at, read from where the truth lives: the
 * business tables, the outbox and inbox tables and the broker — not from in-process
 * counters (except where a setup has nowhere else to read from, marked `null`).
 */
export interface Snapshot {
  readonly orders: readonly OrderRow[];
  readonly payments: readonly PaymentRow[];
  readonly outbox: Readonly<Record<ServiceName, OutboxCounts>>;
  /** Every outbox row of each service, when the store can be read directly (SQL setups). */
  readonly outboxMessages: Readonly<Record<ServiceName, readonly OutboxMessage[]>> | null;
  /** Inbox records of each service's consumer for messages it handled (dead-lettered ones left out), or null when the store cannot be read directly. */
  readonly processed: Readonly<Record<ServiceName, number | null>>;
  /** Redeliveries each service's inbox suppressed, as recorded in the database (DuplicateRecordingInbox). */
  readonly duplicates: Readonly<Record<ServiceName, number>>;
  /** Dead letters of each service's consumer. */
  readonly deadLetters: Readonly<Record<ServiceName, readonly DeadLetterInfo[]>>;
  /** Messages waiting in the broker's consumer and retry queues, or null when unknown. */
  readonly queued: number | null;
}

/** Reads the dead letters of `consumer` and extracts the order each concerns. */
export async function readDeadLetters(deadLetters: TransportDeadLetters, consumer: string): Promise<DeadLetterInfo[]> {
  const letters = await deadLetters.list(consumer, { limit: 100_000 });
  return letters.map((letter) => ({
    messageId: letter.envelope.messageId,
    type: letter.envelope.type,
    orderId: orderIdOf(letter.envelope.payload),
    code: letter.reason.code,
  }));
}

function orderIdOf(payload: string): string | null {
  try {
    const value: unknown = JSON.parse(payload);
    if (value !== null && typeof value === 'object' && 'orderId' in value && typeof value.orderId === 'string') return value.orderId;
  } catch {
    // An undecodable payload has no order to attribute it to.
  }
  return null;
}

/**
 * True once the run has come to rest: every expected order committed, every outbox
 * drained, every order either paid or its OrderPlaced dead-lettered, every payment
 * applied to its order, and nothing left waiting in the broker.
 */
export function isSettled(snapshot: Snapshot, expectedOrders: number): boolean {
  if (snapshot.orders.length < expectedOrders) return false;
  if (snapshot.outbox.orders.pending > 0 || snapshot.outbox.payments.pending > 0) return false;
  if (snapshot.queued !== null && snapshot.queued > 0) return false;
  const dead = new Set(snapshot.deadLetters.payments.map((letter) => letter.orderId));
  if (!snapshot.orders.every((order) => order.paidCount > 0 || dead.has(order.orderId))) return false;
  const applied = snapshot.orders.reduce((sum, order) => sum + order.paidCount, 0);
  return applied + snapshot.deadLetters.orders.length >= snapshot.payments.length;
}

/** What {@link SettleWatch.observe} decides after a snapshot. */
export type SettleVerdict = 'settled' | 'moving' | 'stalled' | 'over-time';

/**
 * Decides when a run stops waiting for its counts: at once when they settle; otherwise it
 * waits as long as they keep moving, and gives up when nothing moved for `stallMs` (stuck:
 * a lost message, a worker that never came back) or the run has taken `maxMs` in all. So a
 * slow machine is given the time it needs, and a stuck run still ends soon.
 */
export class SettleWatch {
  readonly #stallMs: number;
  readonly #maxMs: number;
  readonly #endsAt: number;
  #lastKey = '';
  #lastMove: number;

  constructor(options: { readonly started: number; readonly stallMs: number; readonly maxMs: number }) {
    this.#stallMs = options.stallMs;
    this.#maxMs = options.maxMs;
    this.#endsAt = options.started + options.maxMs;
    this.#lastMove = options.started;
  }

  /** Takes the latest snapshot; `ready` is false while the run itself is not done (orders still being placed, chaos still killing). */
  observe(snapshot: Snapshot, expectedOrders: number, ready: boolean, now = Date.now()): SettleVerdict {
    const key = progressKey(snapshot);
    if (key !== this.#lastKey) {
      this.#lastKey = key;
      this.#lastMove = now;
    }
    if (ready && isSettled(snapshot, expectedOrders)) return 'settled';
    if (now >= this.#endsAt) return 'over-time';
    return now - this.#lastMove >= this.#stallMs ? 'stalled' : 'moving';
  }

  /** Why the wait ended without the counts settling, for the run's output. */
  describe(verdict: 'stalled' | 'over-time'): string {
    return verdict === 'stalled'
      ? `the counts did not move for ${this.#stallMs / 1000}s and have not settled; reconciling what there is`
      : `the counts did not settle within ${this.#maxMs / 1000}s (still moving); reconciling what there is`;
  }
}

/** Every count that changes while a run makes progress; equal keys mean nothing moved. */
function progressKey(snapshot: Snapshot): string {
  const applied = snapshot.orders.reduce((sum, order) => sum + order.paidCount, 0);
  const { orders, payments } = snapshot.outbox;
  return [
    snapshot.orders.length,
    snapshot.payments.length,
    applied,
    orders.total,
    orders.pending,
    orders.dead,
    payments.total,
    payments.pending,
    payments.dead,
    snapshot.processed.orders,
    snapshot.processed.payments,
    snapshot.duplicates.orders,
    snapshot.duplicates.payments,
    snapshot.deadLetters.orders.length,
    snapshot.deadLetters.payments.length,
    snapshot.queued,
  ].join(',');
}
