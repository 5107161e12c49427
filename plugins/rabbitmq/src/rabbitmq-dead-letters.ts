import { describeError, type DeadLetter, type Logger, type TransportDeadLetters } from '@courier/core';
import type { Channel, ChannelModel, GetMessage } from 'amqplib';
import type { ConfirmPublishOptions } from './confirm-publisher.js';
import { attemptOf, copyProperties, COURIER_HEADERS, fromAmqpMessage, isBrokerHeader } from './amqp-mapping.js';
import type { RabbitMqNames } from './topology.js';

/** What the dead-letter operations need from the transport. Internal. */
export interface DeadLetterLink {
  readonly logger: Logger;
  readonly maxScan: number;
  names(consumer: string): RabbitMqNames;
  /** The open connection; throws a retriable TransportError while disconnected. */
  requireConnection(): Promise<ChannelModel>;
  publishToQueue(queue: string, content: Buffer, options: ConfirmPublishOptions): Promise<void>;
}

/**
 * Operator access to a consumer's dead-letter queue.
 *
 * RabbitMQ queues cannot be browsed, so every operation takes messages with `basic.get`
 * (unacknowledged) and closes its channel at the end, which hands back whatever it did
 * not remove. Limits, documented in the README:
 * - `list` sees at most `limit` messages from the head; messages it skips (undecodable)
 *   are logged. Requeued messages count as redelivered (`x-delivery-count` grows; the
 *   queue is declared with a high delivery limit so browsing never drops one).
 * - `replay` and `purge` scan at most `maxScan` messages (default 10,000) per call.
 * - Ids are messageIds; two dead copies of one message are both matched.
 * - `replay` republishes to the consumer's queue with a confirm, attempt reset to 1,
 *   marked `courier-replayed-at` (subscriptions acknowledge unmarked copies of a message
 *   they dead-lettered: relay duplicates), and acknowledges the dead copy only afterwards
 *   (a failure between leaves a duplicate, which the inbox absorbs, never a loss).
 */
export class RabbitMqDeadLetters implements TransportDeadLetters {
  readonly #link: DeadLetterLink;

  constructor(link: DeadLetterLink) {
    this.#link = link;
  }

  async list(consumer: string, options: { limit?: number } = {}): Promise<readonly DeadLetter[]> {
    const limit = Math.max(0, Math.floor(options.limit ?? 100));
    const found: DeadLetter[] = [];
    await this.#scan(consumer, limit, (message) => {
      const dead = toDeadLetter(consumer, message);
      if (dead) found.push(dead);
      else this.#link.logger.warn('undecodable message in dead-letter queue skipped', { consumer, messageId: String(message.properties.messageId) });
      return 'keep';
    });
    return found;
  }

  async replay(consumer: string, ids: readonly string[]): Promise<number> {
    const wanted = new Set(ids);
    const names = this.#link.names(consumer);
    let replayed = 0;
    await this.#scan(consumer, this.#link.maxScan, async (message) => {
      if (!isWanted(wanted, message)) return 'keep';
      const headers: Record<string, unknown> = {};
      for (const [name, value] of Object.entries(message.properties.headers ?? {})) {
        if (isBrokerHeader(name) || DEAD_ONLY.has(name)) continue;
        headers[name] = value;
      }
      // Subscriptions acknowledge later copies of a message they dead-lettered (relay
      // duplicates) unless marked as replayed.
      headers[COURIER_HEADERS.replayedAt] = new Date().toISOString();
      const options = copyProperties(message.properties as unknown as Record<string, unknown>, headers);
      await this.#link.publishToQueue(names.queue, message.content, options);
      replayed++;
      return 'remove';
    });
    return replayed;
  }

  async purge(consumer: string, ids: readonly string[]): Promise<number> {
    const wanted = new Set(ids);
    let purged = 0;
    await this.#scan(consumer, this.#link.maxScan, (message) => {
      if (!isWanted(wanted, message)) return 'keep';
      purged++;
      return 'remove';
    });
    return purged;
  }

  async #scan(consumer: string, max: number, visit: (message: GetMessage) => 'keep' | 'remove' | Promise<'keep' | 'remove'>): Promise<void> {
    const queue = this.#link.names(consumer).deadLetterQueue;
    const connection = await this.#link.requireConnection();
    const channel: Channel = await connection.createChannel();
    channel.on('error', (error: Error) => this.#link.logger.debug('dead-letter channel error', { consumer, error: describeError(error) }));
    try {
      for (let seen = 0; seen < max; seen++) {
        let message: GetMessage | false;
        try {
          message = await channel.get(queue, { noAck: false });
        } catch (error) {
          // 404: nothing was ever dead-lettered for this consumer.
          if ((error as { code?: unknown }).code === 404) return;
          throw error;
        }
        if (message === false) return;
        if ((await visit(message)) === 'remove') channel.ack(message);
      }
    } finally {
      // Closing the channel returns every message taken and not removed to the queue.
      await channel.close().catch(() => undefined);
    }
  }
}

/**
 * A dead letter's id is its messageId, percent-encoded: a messageId may hold spaces or line
 * breaks, and operators copy the id into `courier dead … dlq:<consumer>:<id>` as one token.
 * UUIDs and other plain ids encode to themselves, so ids already in use keep working.
 */
function deadLetterId(messageId: string): string {
  return encodeURIComponent(messageId);
}

/** Whether `message` is one of the dead letters `wanted` names (by id, or by its raw messageId as ids were before). */
function isWanted(wanted: ReadonlySet<string>, message: GetMessage): boolean {
  const messageId = String(message.properties.messageId);
  return wanted.has(deadLetterId(messageId)) || wanted.has(messageId);
}

const DEAD_ONLY = new Set<string>([
  COURIER_HEADERS.attempt,
  COURIER_HEADERS.deadCode,
  COURIER_HEADERS.deadReason,
  COURIER_HEADERS.deadAt,
  COURIER_HEADERS.retryCode,
  COURIER_HEADERS.originalExchange,
  COURIER_HEADERS.originalRoutingKey,
]);

function toDeadLetter(consumer: string, message: GetMessage): DeadLetter | null {
  let envelope;
  try {
    envelope = fromAmqpMessage(message);
  } catch {
    return null;
  }
  const headers = message.properties.headers ?? {};
  const code = headers[COURIER_HEADERS.deadCode];
  const text = headers[COURIER_HEADERS.deadReason];
  const deadAt = headers[COURIER_HEADERS.deadAt];
  // Without Courier's headers the broker dead-lettered it itself (a delivery limit on
  // RabbitMQ 4, or a rejection after a failed republish): report the broker's reason.
  // x-death lists the latest death first; x-first-death-reason keeps the first for ever,
  // which for a message back from a delay tier is that tier's `expired`, not what killed it.
  const death = Array.isArray(headers['x-death']) ? (headers['x-death'][0] as { time?: { value?: unknown }; reason?: unknown } | undefined) : undefined;
  const brokerReason = typeof death?.reason === 'string' ? death.reason : headers['x-first-death-reason'];
  const brokerTime = typeof death?.time?.value === 'number' ? new Date(death.time.value * 1000) : new Date(0);
  return Object.freeze({
    id: deadLetterId(envelope.messageId),
    consumer,
    envelope,
    reason: Object.freeze({
      code: typeof code === 'string' ? code : `BROKER_${String(brokerReason ?? 'unknown').toUpperCase()}`,
      message: typeof text === 'string' ? text : `dead-lettered by RabbitMQ (${String(brokerReason ?? 'unknown reason')})`,
    }),
    attempt: attemptOf(headers),
    deadAt: typeof deadAt === 'string' && !Number.isNaN(Date.parse(deadAt)) ? new Date(deadAt) : brokerTime,
  });
}
