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

/**
 * Load limits of one consumer's queue, declared as queue arguments when Courier creates it.
 *
 * Guarantees: a message that waited `messageTtlMs` in the queue, or that `drop-head` pushed
 * out, is dead-lettered to the consumer's dead-letter queue (`x-death` reason `expired` /
 * `maxlen`), never dropped silently; with `reject-publish` a publish into the full queue is
 * nacked and the relay retries it later without counting an attempt.
 */
export interface RabbitMqQueueLimits {
  /** Most milliseconds a message waits in the queue (`x-message-ttl`) before it is dead-lettered as expired. */
  readonly messageTtlMs?: number;
  /** Most messages the queue holds (`x-max-length`). */
  readonly maxLength?: number;
  /** Most bytes of message bodies the queue holds (`x-max-length-bytes`). */
  readonly maxLengthBytes?: number;
  /**
   * What a full queue does (`x-overflow`). `reject-publish` (default): nacks new messages,
   * so the relay holds them in the outbox and retries; dead-lettering keeps RabbitMQ's
   * at-least-once strategy. `drop-head`: takes new messages and dead-letters the oldest,
   * at most once (see {@link queueLimitArguments}).
   */
  readonly overflow?: 'reject-publish' | 'drop-head';
  /**
   * Priority handling: deliver higher message priorities first (0 to this, 1–9; message
   * priorities above it count as it). Makes the consumer's queue a **classic** queue with
   * `x-max-priority`, since quorum queues on RabbitMQ 3.x have no priorities: it is not
   * replicated (it lives on one node) and its dead-lettering is at most once. See the
   * README, "Priorities".
   */
  readonly maxPriority?: number;
}

/** The option names of {@link RabbitMqQueueLimits}, for validation. */
const LIMIT_OPTIONS = new Set(['messageTtlMs', 'maxLength', 'maxLengthBytes', 'overflow', 'maxPriority']);
// RabbitMQ takes these as unsigned 32-bit (TTL) or 64-bit (lengths) integers; amqplib
// encodes a JS number above 2^31 - 1 as a signed 64-bit long, which the broker accepts.
const MAX_TTL_MS = 2 ** 32 - 1;

/**
 * Lists what is wrong with `limits` (the value of `queueLimits[consumer]`), each problem
 * naming the option (`queueLimits.<consumer>.maxLength`). Empty when valid.
 */
export function queueLimitProblems(consumer: string, limits: unknown): string[] {
  const where = `queueLimits.${consumer}`;
  if (typeof limits !== 'object' || limits === null || Array.isArray(limits)) return [`'${where}' must be an object`];
  const problems: string[] = [];
  for (const name of Object.keys(limits)) {
    if (!LIMIT_OPTIONS.has(name)) problems.push(`'${where}.${name}' is not an option (known: ${[...LIMIT_OPTIONS].join(', ')})`);
  }
  const { messageTtlMs, maxLength, maxLengthBytes, overflow, maxPriority } = limits as Record<string, unknown>;
  const integer = (name: string, value: unknown, max: number): void => {
    if (value === undefined) return;
    // Zero is refused: a TTL of 0 expires every message no consumer takes at once, and a
    // length of 0 refuses (or drops) every message — a typo, not a setting.
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1 || value > max) {
      problems.push(`'${where}.${name}' must be an integer from 1 to ${max}, got ${String(value)}`);
    }
  };
  integer('messageTtlMs', messageTtlMs, MAX_TTL_MS);
  integer('maxLength', maxLength, Number.MAX_SAFE_INTEGER);
  integer('maxLengthBytes', maxLengthBytes, Number.MAX_SAFE_INTEGER);
  // Courier's priorities are 0–9 (core's MAX_PRIORITY); every level costs the broker a sub-queue.
  integer('maxPriority', maxPriority, 9);
  if (overflow !== undefined && overflow !== 'reject-publish' && overflow !== 'drop-head') {
    problems.push(`'${where}.overflow' must be 'reject-publish' or 'drop-head', got ${JSON.stringify(overflow)}`);
  }
  if (overflow !== undefined && maxLength === undefined && maxLengthBytes === undefined) {
    problems.push(`'${where}.overflow' needs 'maxLength' or 'maxLengthBytes': without a length the queue is never full`);
  }
  return problems;
}

/**
 * The queue arguments for `limits` on a consumer's main queue.
 *
 * `drop-head` also declares `x-dead-letter-strategy: at-most-once`: RabbitMQ's
 * at-least-once dead-lettering works only with `reject-publish` overflow (a dropped head
 * cannot wait for the dead-letter queue to confirm it), and with `drop-head` the broker
 * would fall back to at-most-once anyway, logging only a warning. Declaring it says what
 * actually happens: a head dropped while the dead-letter queue is unavailable is lost.
 */
export function queueLimitArguments(limits: RabbitMqQueueLimits | undefined): Record<string, unknown> {
  if (!limits) return {};
  const args: Record<string, unknown> = {};
  if (limits.maxPriority !== undefined) {
    // A classic queue: the quorum-only arguments are left out (see declareConsumer).
    args['x-queue-type'] = 'classic';
    args['x-max-priority'] = limits.maxPriority;
  }
  if (limits.messageTtlMs !== undefined) args['x-message-ttl'] = limits.messageTtlMs;
  if (limits.maxLength !== undefined) args['x-max-length'] = limits.maxLength;
  if (limits.maxLengthBytes !== undefined) args['x-max-length-bytes'] = limits.maxLengthBytes;
  if (limits.overflow === 'drop-head') {
    args['x-overflow'] = 'drop-head';
    if (limits.maxPriority === undefined) args['x-dead-letter-strategy'] = 'at-most-once';
  }
  return args;
}

/** The queue argument names {@link queueLimitArguments} may declare (for error messages). */
export const QUEUE_LIMIT_ARGUMENTS: ReadonlySet<string> = new Set([
  'x-message-ttl',
  'x-max-length',
  'x-max-length-bytes',
  'x-overflow',
  'x-dead-letter-strategy',
  'x-max-priority',
  'x-queue-type',
]);

/** Declares the exchange messages are published to. Idempotent. */
export async function declareExchange(channel: Channel, names: Pick<RabbitMqNames, 'exchange'>): Promise<void> {
  await channel.assertExchange(names.exchange, 'direct', { durable: true });
}

/**
 * Declares a consumer's queues and bindings. Idempotent for the same settings; RabbitMQ
 * answers PRECONDITION_FAILED (and closes the channel) if the queue exists with others,
 * e.g. when an endpoint switches between ordered and unordered, or its limits changed.
 */
export async function declareConsumer(
  channel: Channel,
  names: RabbitMqNames,
  endpoint: { readonly topics: readonly string[]; readonly ordered: boolean },
  options: { readonly deadLetterDeliveryLimit: number; readonly limits?: RabbitMqQueueLimits | undefined },
): Promise<void> {
  await declareExchange(channel, names);
  await channel.assertQueue(names.deadLetterQueue, {
    durable: true,
    // RabbitMQ 4 gives quorum queues a default delivery limit of 20 and counts the
    // requeues of `list` (basic.get + requeue) against it; an explicit high limit keeps
    // browsing the dead letters from ever dropping one.
    arguments: { ...QUORUM, 'x-delivery-limit': options.deadLetterDeliveryLimit },
  });
  const classic = options.limits?.maxPriority !== undefined;
  await channel.assertQueue(names.queue, {
    durable: true,
    arguments: {
      // A priority queue is classic (quorum queues on RabbitMQ 3.x have no priorities):
      // x-dead-letter-strategy is a quorum-queue argument, classic queues dead-letter at most once.
      ...(classic ? { 'x-overflow': 'reject-publish' } : QUORUM),
      // Anything the broker itself dead-letters (a delivery limit reached on RabbitMQ 4)
      // lands in the dead-letter queue, never on the floor.
      ...(classic ? {} : SAFE_DEAD_LETTERING),
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': names.deadLetterQueue,
      ...(endpoint.ordered ? { 'x-single-active-consumer': true } : {}),
      // Limits apply to the consumer's queue only: delay tiers and the dead-letter queue
      // must always take what the broker moves into them, or a retry could be lost.
      ...queueLimitArguments(options.limits),
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
