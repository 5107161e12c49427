import type { BusCounters, RelayConfig } from '@courier/core';
import type { Report, ServiceCounters } from './reconciliation.js';
import type { Snapshot } from './snapshot.js';

/** What a run ends with. */
export interface RunResult {
  readonly ok: boolean;
  readonly report: Report;
  readonly snapshot: Snapshot;
}

/**
 * Relay settings of every bus in the demo: a short poll (stores without a wake-up signal
 * still publish promptly) and a short lease, so rows claimed by a killed relay are
 * claimed again within seconds instead of the default 30.
 */
export const DEMO_RELAY: RelayConfig = Object.freeze({ pollIntervalMs: 250, leaseMs: 5_000 });

/** The part of a bus's counters the report shows. */
export function serviceCounters(counters: BusCounters): ServiceCounters {
  return { processed: counters.processed, duplicates: counters.duplicates, retries: counters.retries };
}

/** Adds counters of several processes (or process lifetimes) of one service. */
export function addCounters(all: readonly ServiceCounters[]): ServiceCounters {
  return all.reduce((sum, c) => ({ processed: sum.processed + c.processed, duplicates: sum.duplicates + c.duplicates, retries: sum.retries + c.retries }), {
    processed: 0,
    duplicates: 0,
    retries: 0,
  });
}

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
