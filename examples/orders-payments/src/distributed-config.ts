import type { BusCounters, Logger } from '@courier/core';
import { RabbitMqTransport } from '@courier/rabbitmq';

/**
 * Retry delay tiers of the demo's RabbitMQ queues (one queue per tier per consumer):
 * short, so a flaky payment is retried within a second. Every process of a run must use
 * the same tiers, since the queue names derive from them.
 */
export const DELAY_TIERS_MS: readonly number[] = Object.freeze([250, 1_000, 5_000]);

/** What the runner hands a worker process (as JSON on its command line). */
export interface WorkerConfig {
  readonly runId: string;
  /** Which start of this role it is (1, 2, … after chaos restarts), for log prefixes. */
  readonly incarnation: number;
  readonly orders: number;
  readonly pgUrl: string;
  readonly schema: string;
  readonly rabbitMqUrl: string;
  /** RabbitMQ exchange and queue name prefix of the run. */
  readonly prefix: string;
  readonly maxCrashes: number;
  readonly verbose: boolean;
}

/** Messages a worker sends its runner over the IPC channel. */
export type WorkerMessage =
  | { readonly kind: 'ready' }
  | { readonly kind: 'progress'; readonly counters: BusCounters }
  | { readonly kind: 'placed'; readonly placed: number }
  | { readonly kind: 'stopped'; readonly counters: BusCounters };

/** Messages the runner sends a worker. */
export type RunnerMessage = { readonly kind: 'stop' };

/**
 * The run's RabbitMQ transport, as every process of the run configures it. Its publish
 * timeout fits the demo's 5 s relay lease: the bus wants a lease of at least twice the
 * 2.5 s the transport then declares (the timeout plus a quarter).
 */
export function rabbitMqTransport(url: string, prefix: string, logger: Logger): RabbitMqTransport {
  return new RabbitMqTransport({ connection: url, prefix, delayTiersMs: DELAY_TIERS_MS, connectTimeoutMs: 5_000, publishTimeoutMs: 2_000, logger });
}
