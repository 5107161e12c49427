import type { Snapshot } from './snapshot.js';

/** One progress line: where the run stands, read from a snapshot. */
export function progressLine(elapsedMs: number, snapshot: Snapshot, expectedOrders: number, extra = ''): string {
  const paid = snapshot.orders.filter((order) => order.paidCount > 0).length;
  const dead = new Set(snapshot.deadLetters.payments.map((letter) => letter.messageId)).size;
  const seconds = `${Math.round(elapsedMs / 1000)}s`.padStart(4);
  const queued = snapshot.queued === null ? '' : ` · queued ${snapshot.queued}`;
  return (
    `[${seconds}] orders ${snapshot.orders.length}/${expectedOrders} committed · ${paid} paid · ${dead} dead-lettered` +
    ` · payments ${snapshot.payments.length} · outbox pending orders ${snapshot.outbox.orders.pending}, payments ${snapshot.outbox.payments.pending}` +
    `${queued}${extra ? ` · ${extra}` : ''}`
  );
}
