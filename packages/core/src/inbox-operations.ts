import type { InboxStore } from './inbox-store.js';

/**
 * The operator half of the inbox storage port: what an operator needs without running a
 * consumer (`forget` to allow an explicit reprocess, `prune` to end the deduplication
 * window). Every `InboxStore` is one, structurally; operator tools (the `courier` CLI)
 * take this narrower type so they never need a unit of work.
 *
 * Guarantees are those of the same members on {@link InboxStore}: both act on committed
 * records only and report what they changed, so a repeated call is harmless. Operator
 * tools look for further optional members at runtime (`typeof inbox.x === 'function'`),
 * so an inbox store that grows more operator members is picked up without a new contract.
 */
export type InboxOperations = Pick<InboxStore<unknown>, 'forget' | 'prune'>;
