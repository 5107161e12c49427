// Diagnostics for the bus suite's `locate` (a scenario that did not settle names where each
// unsettled message is): reads the queues of one fixture's consumers through AMQP alone.
import type { GetMessage } from 'amqplib';
import { rabbitMqNames } from '../../src/index.js';
import { openConnection } from './broker.js';

/** At most this many messages are looked through per queue: a diagnosis, not a dump. */
const MOST_PER_QUEUE = 2_000;

/** The queues of `consumer`, each with what a message found there is doing. */
function queuesOf(prefix: string, consumer: string, tiers: readonly number[]): { name: string; where: string }[] {
  const names = rabbitMqNames(prefix, consumer, tiers);
  return [
    { name: names.queue, where: `queued for '${consumer}'` },
    ...names.retryQueues.map((tier) => ({ name: tier.name, where: `waiting in '${consumer}''s ${tier.delayMs} ms retry tier` })),
    { name: names.deadLetterQueue, where: `in '${consumer}''s dead-letter queue` },
  ];
}

/**
 * Where each of `ids` is among the ready messages of `consumers`' queues (main queue, retry
 * tiers, dead-letter queue), with each queue's depth and consumer count. A message a
 * consumer holds unacknowledged is in no queue's ready messages, and plain AMQP cannot list
 * those: it is reported as not found, beside the queue's consumer count.
 *
 * Looks without taking: messages are fetched unacknowledged on a channel of its own, which
 * is then closed, so the broker requeues them (marked redelivered, in their old order).
 * Only for a run already judged: a consumer may see those copies as redeliveries.
 */
export async function locateInQueues(prefix: string, consumers: readonly string[], tiers: readonly number[], ids: readonly string[]): Promise<ReadonlyMap<string, string>> {
  const found = new Map<string, string[]>();
  const add = (id: string, line: string) => found.set(id, [...(found.get(id) ?? []), line]);
  const wanted = new Set(ids);
  if (wanted.size === 0 || consumers.length === 0) return new Map();
  const connection = await openConnection(`${prefix}-locate`);
  try {
    for (const consumer of consumers) {
      for (const queue of queuesOf(prefix, consumer, tiers)) {
        // A missing queue closes the channel it was asked on (404): one channel per queue.
        const channel = await connection.createChannel();
        channel.on('error', () => undefined);
        try {
          const { messageCount, consumerCount } = await channel.checkQueue(queue.name);
          const seen: GetMessage[] = [];
          try {
            for (let message = await channel.get(queue.name); message && seen.length < MOST_PER_QUEUE; message = await channel.get(queue.name)) seen.push(message);
          } catch (error) {
            // 405: a quorum queue with single active consumer refuses basic.get. Its depth is
            // still worth saying (0 ready: nothing of these waits there).
            if ((error as { code?: unknown }).code !== 405) throw error;
            for (const id of wanted) add(id, `${queue.name}: ${messageCount} ready, ${consumerCount} consumer(s) (cannot be browsed: single active consumer)`);
          }
          seen.forEach((message, index) => {
            const id = String(message.properties.messageId ?? '');
            if (wanted.has(id)) add(id, `${queue.where}: ready, ${index + 1} of ${messageCount} ready, ${consumerCount} consumer(s) on the queue${message.fields.redelivered ? ', redelivered' : ''}`);
          });
        } catch (error) {
          if ((error as { code?: unknown }).code !== 404) throw error;
        } finally {
          // Closing the channel requeues what it fetched.
          await channel.close().catch(() => undefined);
        }
      }
    }
  } finally {
    await connection.close().catch(() => undefined);
  }
  return new Map([...found].map(([id, lines]) => [id, lines.join('; ')]));
}
