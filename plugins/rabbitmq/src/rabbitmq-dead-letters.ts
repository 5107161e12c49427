import { setTimeout as delay } from 'node:timers/promises';
import { describeError, TransportError, type DeadLetter, type Logger, type TransportDeadLetters } from '@courier/core';
import type { Channel, ChannelModel, GetMessage } from 'amqplib';
import { closeAmqp } from './amqp-close.js';
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

/** How long a read waits for another reader of the same dead-letter queue before giving up. */
const READ_LOCK_WAIT_MS = 60_000;
/** How long a read waits, before it lets the next reader in, for the broker to put back what it took. */
const RETURN_WAIT_MS = 10_000;

/**
 * Operator access to a consumer's dead-letter queue.
 *
 * RabbitMQ queues cannot be browsed: a reader takes messages with `basic.get`
 * (unacknowledged) and hands them back when it closes its channel, and while it holds them
 * no other reader sees them (three concurrent `courier dead list` saw 23, 28 and 5 of 28).
 * A stream queue could be browsed but cannot delete one message (purge, replay), and an
 * exclusive consumer does not exclude a second consumer on a quorum queue (checked on this
 * broker). So reads take turns: each holds a lock for the queue while it reads — an
 * exclusive, auto-deleted queue `<dead-letter queue>.lock`, which RabbitMQ lets only one
 * connection declare (another gets RESOURCE_LOCKED, 405, and waits) and deletes when its
 * connection dies, so a crashed reader never leaves it held — and releases it only once the
 * broker counts every message it did not remove as back in the queue. In one process, reads
 * of a queue also queue up behind each other (one connection may declare its own exclusive
 * queue twice). Guarantees:
 * - `list` sees every message up to `maxScan` (default 10,000) while no other read runs,
 *   and returns the oldest `limit` by dead-letter time (ties by id): a stable order.
 * - `count` reads the queue's depth with a passive declare (no message taken), under the
 *   same lock, so it never misses messages a concurrent read holds.
 * - `replay` and `purge` scan at most `maxScan` messages per call.
 * - A consumer whose dead-letter queue does not exist has none: nothing is created (the
 *   existence check is passive, before the lock is taken).
 * - Requeued messages count as redelivered (`x-delivery-count` grows; the queue is declared
 *   with a high delivery limit so browsing never drops one).
 * - Ids are messageIds; two dead copies of one message are both matched.
 * - `replay` republishes to the consumer's queue with a confirm, attempt reset to 1,
 *   marked `courier-replayed-at` (subscriptions acknowledge unmarked copies of a message
 *   they dead-lettered: relay duplicates), and acknowledges the dead copy only afterwards
 *   (a failure between leaves a duplicate, which the inbox absorbs, never a loss).
 */
export class RabbitMqDeadLetters implements TransportDeadLetters {
  readonly #link: DeadLetterLink;
  /** Per queue, the end of the last read of this process: reads in one process take turns here first. */
  readonly #turns = new Map<string, Promise<void>>();

  constructor(link: DeadLetterLink) {
    this.#link = link;
  }

  async list(consumer: string, options: { limit?: number } = {}): Promise<readonly DeadLetter[]> {
    const limit = Math.max(0, Math.floor(options.limit ?? 100));
    const found: { letter: DeadLetter; position: number }[] = [];
    let position = 0;
    await this.#scan(consumer, this.#link.maxScan, (message) => {
      const dead = toDeadLetter(consumer, message);
      if (dead) found.push({ letter: dead, position: position++ });
      else this.#link.logger.warn('undecodable message in dead-letter queue skipped', { consumer, messageId: String(message.properties.messageId) });
      return 'keep';
    });
    // Ties by id, not by queue position: a quorum queue puts returned messages back in an
    // order of its own, so the position changes from one read to the next.
    found.sort((a, b) => a.letter.deadAt.getTime() - b.letter.deadAt.getTime() || (a.letter.id < b.letter.id ? -1 : a.letter.id > b.letter.id ? 1 : a.position - b.position));
    return found.slice(0, limit).map((entry) => entry.letter);
  }

  async count(consumer: string): Promise<number> {
    const queue = this.#link.names(consumer).deadLetterQueue;
    let depth = 0;
    await this.#locked(consumer, async (connection) => {
      depth = (await depthOf(connection, queue)) ?? 0;
    });
    return depth;
  }

  /** Whether the consumer's dead-letter queue exists: a passive declare on a channel of its own, without the read lock (nothing created, nothing taken). */
  async exists(consumer: string): Promise<boolean> {
    const connection = await this.#link.requireConnection();
    return (await depthOf(connection, this.#link.names(consumer).deadLetterQueue)) !== undefined;
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

  /**
   * Runs `work` holding the read lock of `consumer`'s dead-letter queue, or does nothing
   * when the queue does not exist (checked passively: a wrong name creates nothing).
   */
  async #locked(consumer: string, work: (connection: ChannelModel) => Promise<void>): Promise<void> {
    const queue = this.#link.names(consumer).deadLetterQueue;
    const before = this.#turns.get(queue) ?? Promise.resolve();
    let done!: () => void;
    const mine = new Promise<void>((resolve) => (done = resolve));
    const turn = before.then(() => mine);
    this.#turns.set(queue, turn);
    try {
      await before;
      const connection = await this.#link.requireConnection();
      if ((await depthOf(connection, queue)) === undefined) return;
      const lock = await this.#acquire(connection, consumer, `${queue}.lock`);
      try {
        await work(connection);
      } finally {
        await lock.deleteQueue(`${queue}.lock`).catch(() => undefined);
        await closeAmqp(lock);
      }
    } finally {
      done();
      if (this.#turns.get(queue) === turn) this.#turns.delete(queue);
    }
  }

  /** Declares the exclusive lock queue, waiting while another connection holds it. Returns the channel that holds it. */
  async #acquire(connection: ChannelModel, consumer: string, lockQueue: string): Promise<Channel> {
    const deadline = Date.now() + READ_LOCK_WAIT_MS;
    for (let wait = 20; ; wait = Math.min(wait * 2, 500)) {
      const channel = await connection.createChannel();
      channel.on('error', (error: Error) => this.#link.logger.debug('dead-letter lock channel error', { consumer, error: describeError(error) }));
      try {
        await channel.assertQueue(lockQueue, { exclusive: true, autoDelete: true, durable: false, arguments: { 'x-queue-type': 'classic' } });
        return channel;
      } catch (error) {
        // 405 RESOURCE_LOCKED: another reader holds it (the channel is closed by the broker).
        if ((error as { code?: unknown }).code !== 405) throw error;
        if (Date.now() >= deadline) {
          throw new TransportError(`dead letters of '${consumer}' are being read by another process (lock queue '${lockQueue}' held for over ${READ_LOCK_WAIT_MS / 1000} s); try again`, { cause: error });
        }
        await delay(wait);
      }
    }
  }

  async #scan(consumer: string, max: number, visit: (message: GetMessage) => 'keep' | 'remove' | Promise<'keep' | 'remove'>): Promise<void> {
    const queue = this.#link.names(consumer).deadLetterQueue;
    await this.#locked(consumer, async (connection) => {
      const start = (await depthOf(connection, queue)) ?? 0;
      let removed = 0;
      const channel: Channel = await connection.createChannel();
      channel.on('error', (error: Error) => this.#link.logger.debug('dead-letter channel error', { consumer, error: describeError(error) }));
      try {
        for (let seen = 0; seen < max; seen++) {
          const message = await channel.get(queue, { noAck: false });
          if (message === false) break;
          if ((await visit(message)) === 'remove') {
            channel.ack(message);
            removed++;
          }
        }
      } finally {
        // Closing the channel returns every message taken and not removed to the queue.
        await closeAmqp(channel);
      }
      // A quorum queue applies the returns after close-ok: the next reader must find them back.
      const deadline = Date.now() + RETURN_WAIT_MS;
      while (((await depthOf(connection, queue)) ?? 0) < start - removed && Date.now() < deadline) await delay(20);
    });
  }
}

/** The queue's ready-message count by passive declare (nothing taken, nothing created), or undefined when it does not exist. */
export async function depthOf(connection: ChannelModel, queue: string): Promise<number | undefined> {
  const channel = await connection.createChannel();
  // A 404 closes the channel; the error is answered through checkQueue's rejection.
  channel.on('error', () => undefined);
  try {
    return (await channel.checkQueue(queue)).messageCount;
  } catch (error) {
    if ((error as { code?: unknown }).code === 404) return undefined;
    throw error;
  } finally {
    await closeAmqp(channel);
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
