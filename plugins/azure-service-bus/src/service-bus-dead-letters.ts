import { decodeEnvelope, type DeadLetter, type Envelope, type TransportDeadLetters } from '@courier/core';
import type { ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSender } from '@azure/service-bus';
import Long from 'long';
import { P, codeOf, toTransportError } from './service-bus-errors.js';
import { ServiceBusTransport, type ServiceBusAdministration, type ServiceBusTransportConfig } from './service-bus-transport.js';

/** What {@link ServiceBusDeadLetters} needs of its transport besides its public methods. */
export interface DeadLetterParts {
  /** Queue mode: a queue's dead letters are shared by every group receiving from it. */
  readonly queues: boolean;
  /** The topics configured as `topics` (a list, or a function asked at each read). */
  readonly topics: ServiceBusTransportConfig['topics'];
  /** The topics this transport subscribed to so far. */
  readonly subscribed: ReadonlySet<string>;
  /** The live sender of a topic (replays go through it). */
  sender(topic: string): ServiceBusSender;
  /** The configured administration client: `exists` is there only with it. */
  readonly administration?: ServiceBusAdministration | undefined;
}

/** Whether an administration client's error says the entity is not there (HTTP 404; the SDK's code for it). */
const isNotFound = (error: unknown): boolean => {
  const { code, statusCode } = (error ?? {}) as { code?: unknown; statusCode?: unknown };
  return code === 'MessageEntityNotFoundError' || statusCode === 404;
};

/**
 * The operator's view of Service Bus dead letters: each known topic's dead-letter sub-queue
 * (the queue's, in queue mode) of the consumer's subscription.
 *
 * Guarantees: `list` peeks from an explicit sequence number, so it takes, locks and skips
 * nothing; `replay` sends the copy before it completes the dead letter (a crash between the two
 * replays twice at worst, which the inbox drops); `replay` and `purge` touch only the ids named,
 * and in queue mode only the group's own dead letters, abandoning every other message they received.
 */
export class ServiceBusDeadLetters implements TransportDeadLetters {
  readonly #transport: ServiceBusTransport;
  readonly #parts: DeadLetterParts;

  /**
   * Whether the consumer's subscription exists on any known topic, read with the
   * administration client's GET of the subscription: nothing is created, taken or locked.
   * A missing subscription (404) is `false`; any other failure (no Manage claim: 401, the
   * namespace unreachable) rejects with a `TransportError` instead of passing for "does not
   * exist" (the SDK's own `subscriptionExists` answers `false` to every error). No topic
   * known (none configured, subscribed or published to): `false`. Present only when the
   * transport was given `administration`, and not in queue mode: there a consumer group is
   * no entity of its own (every group reads the queue), so the broker cannot tell a
   * mistyped group name from a real one.
   */
  readonly exists?: (consumer: string) => Promise<boolean>;

  constructor(transport: ServiceBusTransport, parts: DeadLetterParts) {
    this.#transport = transport;
    this.#parts = parts;
    const administration = parts.administration;
    if (administration && !parts.queues) this.exists = (consumer) => this.#exists(administration, consumer);
  }

  /**
   * The consumer's lag: the sum of its subscriptions' `activeMessageCount` over the known
   * topics (management API GET; nothing created), or null when it has none. Service Bus
   * counts messages locked by a receiver as active too. Used as the transport's `consumerLag`.
   */
  async lag(administration: ServiceBusAdministration, consumer: string): Promise<number | null> {
    let total: number | null = null;
    for (const topic of this.#knownTopics()) {
      const entity = this.#transport.entityOf(topic);
      try {
        total = (total ?? 0) + (await administration.getSubscriptionRuntimeProperties(entity, consumer)).activeMessageCount;
      } catch (error) {
        if (!isNotFound(error)) throw toTransportError(error, `cannot read the lag of the subscription ${consumer} of ${entity}`);
      }
    }
    return total;
  }

  async #exists(administration: ServiceBusAdministration, consumer: string): Promise<boolean> {
    for (const topic of this.#knownTopics()) {
      const entity = this.#transport.entityOf(topic);
      try {
        await administration.getSubscriptionRuntimeProperties(entity, consumer);
        return true;
      } catch (error) {
        if (!isNotFound(error)) throw toTransportError(error, `cannot tell whether the subscription ${consumer} of ${entity} exists`);
      }
    }
    return false;
  }

  #deadReceiver(topic: string, consumer: string): ServiceBusReceiver {
    return this.#transport.receiverOf(this.#transport.source.current.client, topic, consumer, { subQueueType: 'deadLetter', skipParsingBodyAsJson: true, maxAutoLockRenewalDurationInMs: 0 });
  }

  /**
   * Whether a dead letter is `consumer`'s. A subscription's are all its own; a queue's are
   * shared by every receiver of the queue, so those another group dead-lettered (marked
   * `courier-dead-for`) are not. Unmarked ones (the broker's own, MaxDeliveryCountExceeded)
   * count for every group: with one group per queue they are that group's.
   */
  #deadFor(message: ServiceBusReceivedMessage, consumer: string): boolean {
    if (!this.#parts.queues) return true;
    const owner = message.applicationProperties?.[P.deadFor];
    return owner === undefined || owner === null || owner === consumer;
  }

  /** Dead letters of `consumer` on every known topic, by peeking (nothing is taken or locked), at most `limit`. */
  list(consumer: string, options?: { limit?: number }): Promise<readonly DeadLetter[]> {
    return this.#listDead(consumer, options?.limit ?? 100);
  }

  /** Sends a copy of each named dead letter to its topic for `consumer` (see `#takeDead`), then removes it; returns how many it found. */
  replay(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#takeDead(consumer, ids, 'replay');
  }

  /** Removes the named dead letters; returns how many it found. */
  purge(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#takeDead(consumer, ids, 'purge');
  }

  async #listDead(consumer: string, limit: number): Promise<readonly DeadLetter[]> {
    const letters: DeadLetter[] = [];
    for (const topic of this.#knownTopics()) {
      const receiver = this.#deadReceiver(topic, consumer);
      try {
        // Always from an explicit sequence number: without one the SDK continues after the
        // last message any receiver of this entity peeked (its management link keeps it).
        let from = Long.ZERO;
        while (letters.length < limit) {
          const page = await receiver.peekMessages(Math.min(100, limit - letters.length), { fromSequenceNumber: from });
          if (page.length === 0) break;
          for (const message of page) {
            if (this.#deadFor(message, consumer) && letters.length < limit) letters.push(this.#letterOf(topic, consumer, message));
            if (message.sequenceNumber) from = message.sequenceNumber.add(1);
          }
        }
      } catch (error) {
        if (codeOf(error) !== 'MessagingEntityNotFound') throw toTransportError(error, `cannot list dead letters of ${consumer}`);
      } finally {
        await receiver.close().catch(() => undefined);
      }
    }
    return letters.slice(0, limit);
  }

  #knownTopics(): Set<string> {
    const given = this.#parts.topics;
    return new Set([...this.#parts.subscribed, ...(typeof given === 'function' ? given() : (given ?? []))]);
  }

  #letterOf(topic: string, consumer: string, message: ServiceBusReceivedMessage): DeadLetter {
    let envelope: Envelope;
    try {
      envelope = this.#transport.fromMessage(message);
    } catch {
      envelope = decodeEnvelope({ messageId: String(message.messageId ?? 'unknown'), type: 'courier.Undecodable', version: 1, topic, occurredAt: new Date(0).toISOString(), key: null, correlationId: String(message.messageId ?? 'unknown'), causationId: null, traceparent: null, tracestate: null, headers: {}, payload: 'null' });
    }
    const deadAt = message.applicationProperties?.[P.deadAt];
    return {
      // `<topic>:<sequenceNumber>`, one printable line: operators copy it from `courier dead
      // list` into `dlq:<consumer>:<id>` (a newline here made every such reference unusable).
      id: `${topic}:${message.sequenceNumber?.toString() ?? ''}`,
      consumer,
      envelope,
      reason: { code: message.deadLetterReason ?? 'UNKNOWN', message: message.deadLetterErrorDescription ?? '' },
      attempt: ServiceBusTransport.attemptOf(message),
      deadAt: typeof deadAt === 'string' ? new Date(deadAt) : (message.enqueuedTimeUtc ?? new Date(0)),
    };
  }

  /**
   * Replay or purge dead letters by id: received from the dead-letter sub-queue in
   * peek-lock, the wanted ones completed (after their copy was sent, for a replay), the
   * others abandoned. A replay is published to the topic with `courier-replayed-for` =
   * consumer: every subscription of the topic receives it, only this consumer runs it as a
   * replay; the others drop it through their inbox as the duplicate it is for them. In
   * queue mode the copy goes to the queue, and the ids of another group's dead letters are
   * left alone.
   */
  async #takeDead(consumer: string, ids: readonly string[], action: 'replay' | 'purge'): Promise<number> {
    const byTopic = new Map<string, Set<string>>();
    for (const id of ids) {
      // The sequence number is the digits after the last ':' (earlier builds put a newline there; still read).
      const parsed = /^(.+)[:\n](\d+)$/s.exec(id);
      if (!parsed) continue;
      const [, topic, sequence] = parsed as unknown as [string, string, string];
      const set = byTopic.get(topic) ?? new Set<string>();
      set.add(sequence);
      byTopic.set(topic, set);
    }
    let done = 0;
    for (const [topic, wanted] of byTopic) {
      const receiver = this.#deadReceiver(topic, consumer);
      const others: ServiceBusReceivedMessage[] = [];
      try {
        for (let round = 0; round < 20 && wanted.size > 0; round += 1) {
          const got = await receiver.receiveMessages(100, { maxWaitTimeInMs: 1_000 });
          if (got.length === 0) break;
          for (const message of got) {
            const sequence = message.sequenceNumber?.toString() ?? '';
            if (!wanted.has(sequence) || !this.#deadFor(message, consumer)) {
              others.push(message);
              continue;
            }
            if (action === 'replay') {
              const envelope = this.#transport.fromMessage(message);
              const copy = this.#transport.toMessage(envelope, 1, { [P.replayedFor]: consumer });
              // Another broker id than the original's, so duplicate detection keeps the replay.
              copy.messageId = `${envelope.messageId}#replay-${sequence}`;
              await this.#parts.sender(topic).sendMessages(copy);
            }
            await receiver.completeMessage(message);
            wanted.delete(sequence);
            done += 1;
          }
        }
      } catch (error) {
        throw toTransportError(error, `cannot ${action} dead letters of ${consumer}`);
      } finally {
        for (const message of others) await receiver.abandonMessage(message).catch(() => undefined);
        await receiver.close().catch(() => undefined);
      }
    }
    return done;
  }
}
