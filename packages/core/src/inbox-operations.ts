import type { InboxStore } from './inbox-store.js';

/** One consumer's inbox as operators see it ({@link InboxStats}). */
export interface InboxConsumerStats {
  /** The consumer (group) as subscribed, without the suffixes Courier appends for its own records. */
  readonly consumer: string;
  /**
   * Messages recorded as processed (its deduplication window), replayed runs included: a
   * copy of one of these is acknowledged as a duplicate. `prune` bounds it.
   */
  readonly records: number;
  /** Age in milliseconds (database clock) of its oldest such record: how far back duplicates are recognised. 0 when none. */
  readonly oldestRecordAgeMs: number;
  /**
   * Messages it dead-lettered whose mark is still in the inbox: every dead letter since the
   * last prune, replayed or purged or not (the transport's own depth is what is parked now).
   * Growing is what an alert watches.
   */
  readonly deadLetters: number;
  /** Dead letters replayed and handled (recorded under the replay's own record). */
  readonly replayed: number;
}

/** What {@link InboxOperations.stats} returns: one entry per consumer with any record, sorted by name. */
export interface InboxStats {
  readonly consumers: readonly InboxConsumerStats[];
}

/**
 * The operator half of the inbox storage port: what an operator needs without running a
 * consumer (`forget` to allow an explicit reprocess, `prune` to end the deduplication
 * window, optionally `stats`). Every `InboxStore` is one, structurally; operator tools (the
 * `courier` CLI, {@link observeInbox}) take this narrower type so they never need a unit
 * of work.
 *
 * Guarantees are those of the same members on {@link InboxStore}: both act on committed
 * records only and report what they changed, so a repeated call is harmless. Operator
 * tools look for optional members at runtime (`typeof inbox.stats === 'function'`), so an
 * inbox store that grows more operator members is picked up without a new contract.
 */
export type InboxOperations = Pick<InboxStore<unknown>, 'forget' | 'prune' | 'stats'>;

/** The suffixes the consumer appends to a consumer name for its own inbox records. */
const DEAD = '~dead';
const RERUN = '~rerun';
const ALONE = '~alone';
const DRAIN = '~drain';

/** One row of an inbox store's per-name count: a stored consumer name (suffix and all), its records and the age of its oldest. */
export interface InboxNameCount {
  readonly name: string;
  readonly records: number;
  readonly oldestAgeMs: number;
}

/**
 * Folds an inbox store's counts per stored consumer name (one `GROUP BY consumer`) into
 * {@link InboxStats}: `<consumer>~dead` marks count as dead letters, `<consumer>~rerun`
 * records as processed (and replayed), `<consumer>~alone` and `<consumer>~drain` start
 * markers not at all. For
 * store authors implementing `stats()`, so the consumer's naming stays in the core.
 */
export function inboxStatsFromCounts(counts: readonly InboxNameCount[]): InboxStats {
  const byConsumer = new Map<string, { records: number; oldestRecordAgeMs: number; deadLetters: number; replayed: number }>();
  const entry = (consumer: string) => {
    let found = byConsumer.get(consumer);
    if (!found) byConsumer.set(consumer, (found = { records: 0, oldestRecordAgeMs: 0, deadLetters: 0, replayed: 0 }));
    return found;
  };
  for (const { name, records, oldestAgeMs } of counts) {
    if (name.endsWith(ALONE) || name.endsWith(DRAIN)) continue;
    if (name.endsWith(DEAD)) {
      entry(name.slice(0, -DEAD.length)).deadLetters += records;
      continue;
    }
    const rerun = name.endsWith(RERUN);
    const stats = entry(rerun ? name.slice(0, -RERUN.length) : name);
    stats.records += records;
    if (rerun) stats.replayed += records;
    stats.oldestRecordAgeMs = Math.max(stats.oldestRecordAgeMs, oldestAgeMs);
  }
  return {
    consumers: [...byConsumer]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([consumer, stats]) => ({ consumer, ...stats })),
  };
}
