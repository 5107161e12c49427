import type { Channel } from 'amqplib';

/** Default retry delay tiers in milliseconds: 1 s, 5 s, 20 s, 1 min, 5 min (one queue each per consumer). */
export const DEFAULT_DELAY_TIERS_MS: readonly number[] = Object.freeze([1_000, 5_000, 20_000, 60_000, 300_000]);

/** The names of everything the transport declares for one prefix and consumer. */
export interface RabbitMqNames {
  /** The one direct exchange every message is published to, routed by topic. */
  readonly exchange: string;
  /** The consumer's durable quorum queue, bound to its topics. */
  readonly queue: string;
  /** The consumer's dead-letter queue (quorum). */
  readonly deadLetterQueue: string;
  /** One retry queue per delay tier, in tier order, each dead-lettering back to `queue`. */
  readonly retryQueues: readonly { readonly delayMs: number; readonly name: string }[];
}

/**
 * Names of the exchange and queues for `consumer` under `prefix`.
 *
 * Guarantees: pure and stable — the same arguments always give the same names, so
 * operators and tests can find (and delete) what the transport declared.
 */
export function rabbitMqNames(prefix: string, consumer: string, delayTiersMs: readonly number[] = DEFAULT_DELAY_TIERS_MS): RabbitMqNames {
  const queue = `${prefix}.q.${consumer}`;
  return {
    exchange: `${prefix}.topics`,
    queue,
    deadLetterQueue: `${queue}.dead`,
    retryQueues: delayTiersMs.map((delayMs) => ({ delayMs, name: `${queue}.retry.${tierLabel(delayMs)}` })),
  };
}

/**
 * Picks the retry tier for a requested delay.
 *
 * Between two tiers it picks the lower or the upper one with probabilities that make the
 * expected delay equal `delayMs`, so the jitter the retry policy put into `delayMs` survives
 * the rounding to tiers. Below the first tier: the first; above the last: the last.
 * `tiers` must be sorted ascending and non-empty.
 */
export function chooseDelayTier(tiers: readonly number[], delayMs: number, random: () => number = Math.random): number {
  const first = tiers[0]!;
  if (!(delayMs > first)) return 0;
  for (let i = 1; i < tiers.length; i++) {
    const upper = tiers[i]!;
    if (delayMs <= upper) {
      const lower = tiers[i - 1]!;
      const pUpper = (delayMs - lower) / (upper - lower);
      return random() < pUpper ? i : i - 1;
    }
  }
  return tiers.length - 1;
}

function tierLabel(ms: number): string {
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1_000 === 0) return `${ms / 1_000}s`;
  return `${ms}ms`;
}

// Quorum queues: replicated, and the only queue type with at-least-once dead-lettering.
// That strategy is honoured only with `reject-publish` overflow; without it RabbitMQ
// silently falls back to at-most-once, and a dead-lettered message could vanish.
const QUORUM = { 'x-queue-type': 'quorum' } as const;
const SAFE_DEAD_LETTERING = { 'x-dead-letter-strategy': 'at-least-once', 'x-overflow': 'reject-publish' } as const;

/** Declares the exchange messages are published to. Idempotent. */
export async function declareExchange(channel: Channel, names: Pick<RabbitMqNames, 'exchange'>): Promise<void> {
  await channel.assertExchange(names.exchange, 'direct', { durable: true });
}

/**
 * Declares a consumer's queues and bindings. Idempotent for the same settings; RabbitMQ
 * answers PRECONDITION_FAILED (and closes the channel) if the queue exists with others,
 * e.g. when an endpoint switches between ordered and unordered.
 */
export async function declareConsumer(
  channel: Channel,
  names: RabbitMqNames,
  endpoint: { readonly topics: readonly string[]; readonly ordered: boolean },
  options: { readonly deadLetterDeliveryLimit: number },
): Promise<void> {
  await declareExchange(channel, names);
  await channel.assertQueue(names.deadLetterQueue, {
    durable: true,
    // RabbitMQ 4 gives quorum queues a default delivery limit of 20 and counts the
    // requeues of `list` (basic.get + requeue) against it; an explicit high limit keeps
    // browsing the dead letters from ever dropping one.
    arguments: { ...QUORUM, 'x-delivery-limit': options.deadLetterDeliveryLimit },
  });
  await channel.assertQueue(names.queue, {
    durable: true,
    arguments: {
      ...QUORUM,
      // Anything the broker itself dead-letters (a delivery limit reached on RabbitMQ 4)
      // lands in the dead-letter queue, never on the floor.
      ...SAFE_DEAD_LETTERING,
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': names.deadLetterQueue,
      ...(endpoint.ordered ? { 'x-single-active-consumer': true } : {}),
    },
  });
  for (const topic of endpoint.topics) await channel.bindQueue(names.queue, names.exchange, topic);
  if (endpoint.ordered) return;
  for (const tier of names.retryQueues) {
    await channel.assertQueue(tier.name, {
      durable: true,
      arguments: {
        ...QUORUM,
        ...SAFE_DEAD_LETTERING,
        // Queue-level TTL: every message in a tier waits the same time, so the head always
        // expires first. Per-message TTLs of different lengths in one queue block each
        // other, because RabbitMQ only expires messages at the head.
        'x-message-ttl': tier.delayMs,
        'x-dead-letter-exchange': '',
        'x-dead-letter-routing-key': names.queue,
      },
    });
  }
}

/** Deletes everything {@link declareConsumer} declared for `names` (not the shared exchange). */
export async function deleteConsumer(channel: Channel, names: RabbitMqNames): Promise<void> {
  for (const tier of names.retryQueues) await channel.deleteQueue(tier.name);
  await channel.deleteQueue(names.queue);
  await channel.deleteQueue(names.deadLetterQueue);
}
