import { randomUUID } from 'node:crypto';
import { ConfigError, CourierError, TransportError, type DeadLetter, type Envelope, type TransportDeadLetters } from '@courier/core';
import type { Admin, Kafka, KafkaMessage } from 'kafkajs';
import { HEADERS, decodeRecord, encodeRecord, headerText, type OutgoingRecord } from './record-codec.js';
import { NAME_PATTERN, describe, within } from './kafka-support.js';

/** What {@link KafkaDeadLetters} uses of its transport: the connections, the names and the copy writer. */
export interface DeadLetterParts {
  readonly client: Kafka;
  readonly prefix: string;
  readonly connectTimeoutMs: number;
  /** Longest consumer name, in bytes, whose topics fit Kafka's limit. */
  readonly consumerRoom: number;
  /** Topics this transport made or saw: asking the broker again is needless. */
  readonly knownTopics: ReadonlySet<string>;
  deadLetterTopic(consumer: string): string;
  retryTopic(consumer: string): string;
  assertOpen(): void;
  closedOr(error: unknown): unknown;
  connectedAdmin(): Promise<Admin>;
  topicOffsets(topic: string): Promise<Awaited<ReturnType<Admin['fetchTopicOffsets']>>>;
  publishCopy(topic: string, record: OutgoingRecord): Promise<void>;
}

/**
 * The operator's view of a Kafka consumer group's dead letters: its compacted dead-letter topic,
 * keyed by the dead letter's id, read from start to end by a throwaway group.
 *
 * Guarantees: a read creates nothing (a consumer whose topic does not exist has no dead
 * letters); `replay` writes the message to the group's own retry topic (other groups of the
 * origin topic never see it) before the tombstone, so a crash between the two replays twice
 * at worst (the inbox drops the copy), never loses it; `purge` writes a tombstone, gone from
 * `list` at once and from disk after compaction.
 */
export class KafkaDeadLetters implements TransportDeadLetters {
  readonly #parts: DeadLetterParts;

  constructor(parts: DeadLetterParts) {
    this.#parts = parts;
  }

  /**
   * Reads a dead-letter topic from its start to its current end (a throwaway group that is
   * deleted afterwards). An operator's read creates nothing: a consumer whose dead-letter
   * topic does not exist (a name never subscribed, an operator's typo) has no dead letters,
   * and a name no Kafka topic can hold is refused with a `ConfigError`, not retriable.
   */
  async #readDead(consumer: string): Promise<Map<string, { record: KafkaMessage; headers: Record<string, string> }>> {
    this.#parts.assertOpen();
    this.#assertConsumerName(consumer);
    const topic = this.#parts.deadLetterTopic(consumer);
    const latest = new Map<string, { record: KafkaMessage; headers: Record<string, string> }>();
    if (!(await this.#topicExists(topic, consumer))) return latest;
    let ends: Awaited<ReturnType<Admin['fetchTopicOffsets']>>;
    try {
      ends = await this.#parts.topicOffsets(topic);
    } catch (error) {
      throw this.#parts.closedOr(new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true }));
    }
    const admin = await this.#parts.connectedAdmin();
    const remaining = new Map(ends.filter((end) => BigInt(end.high) > BigInt(end.low)).map((end) => [end.partition, BigInt(end.high)]));
    if (remaining.size === 0) return latest;
    const groupId = `${this.#parts.prefix}courier-dlt-reader.${randomUUID()}`;
    const reader = this.#parts.client.consumer({ groupId, sessionTimeout: 10_000, maxWaitTimeInMs: 100 });
    try {
      await reader.connect();
      await reader.subscribe({ topics: [topic], fromBeginning: true });
      const done = new Promise<void>((resolve) => {
        void reader.run({
          autoCommit: false,
          eachMessage: async ({ partition, message }) => {
            const key = message.key?.toString('utf8');
            if (key !== undefined) {
              if (message.value === null) latest.delete(key);
              else latest.set(key, { record: message, headers: headerText(message.headers) });
            }
            const high = remaining.get(partition);
            if (high !== undefined && BigInt(message.offset) + 1n >= high) remaining.delete(partition);
            if (remaining.size === 0) resolve();
          },
        });
      });
      await within(done, Math.max(this.#parts.connectTimeoutMs, 15_000), `reading ${topic}`);
    } catch (error) {
      throw new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true });
    } finally {
      await reader.disconnect().catch(() => undefined);
      await admin.deleteGroups([groupId]).catch(() => undefined);
    }
    return latest;
  }

  /** Refuses (`ConfigError`, not retriable) a consumer name that cannot name this transport's topics: nothing of it can exist. */
  #assertConsumerName(consumer: string): void {
    const room = this.#parts.consumerRoom;
    if (consumer.length === 0 || !NAME_PATTERN.test(consumer) || Buffer.byteLength(consumer, 'utf8') > room) {
      throw new ConfigError(`consumer '${consumer}' cannot be a Kafka consumer of this transport: it must be 1 to ${room} of A-Z a-z 0-9 . _ - (it names the group's topics)`);
    }
  }

  /** Whether `topic` exists on the broker (asked once it is not known to); a broker that cannot be asked is a retriable `TransportError`. */
  async #topicExists(topic: string, consumer: string): Promise<boolean> {
    if (this.#parts.knownTopics.has(topic)) return true;
    try {
      const admin = await this.#parts.connectedAdmin();
      const topics = await within(admin.listTopics(), this.#parts.connectTimeoutMs, 'listing topics');
      return topics.includes(topic);
    } catch (error) {
      throw this.#parts.closedOr(error instanceof CourierError ? error : new TransportError(`could not read the dead letters of '${consumer}': ${describe(error)}`, { cause: error, retriable: true }));
    }
  }

  /** Dead letters of `consumer`, oldest first, at most `limit` (100 by default). */
  async list(consumer: string, options?: { limit?: number }): Promise<readonly DeadLetter[]> {
    return this.#listDead(consumer, options?.limit);
  }

  /** Replays the named dead letters through the group's retry topic (attempt 1); returns how many it found. */
  replay(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#replayDead(consumer, ids);
  }

  /** Writes a tombstone for each named dead letter; returns how many it found. */
  purge(consumer: string, ids: readonly string[]): Promise<number> {
    return this.#purgeDead(consumer, ids);
  }

  async #listDead(consumer: string, limit = 100): Promise<readonly DeadLetter[]> {
    const entries = await this.#readDead(consumer);
    const letters: DeadLetter[] = [];
    for (const [id, { record, headers }] of entries) {
      let envelope: Envelope;
      try {
        const key = headers['courier-dead-key-null'] === '1' ? null : Buffer.from(headers['courier-dead-key'] ?? '', 'base64');
        envelope = decodeRecord(key, record.value, headers);
      } catch {
        continue; // a record that never was a Courier message (ENVELOPE_INVALID): visible with Kafka's tools only
      }
      letters.push({
        id,
        consumer,
        envelope,
        reason: { code: headers[HEADERS.deadCode] ?? 'UNKNOWN', message: headers[HEADERS.deadMessage] ?? '' },
        attempt: Number(headers[HEADERS.attempt] ?? '1'),
        deadAt: new Date(Number(headers[HEADERS.deadAt] ?? '0')),
      });
    }
    letters.sort((a, b) => a.deadAt.getTime() - b.deadAt.getTime());
    return letters.slice(0, limit);
  }

  async #replayDead(consumer: string, ids: readonly string[]): Promise<number> {
    const letters = await this.#listDead(consumer, Number.MAX_SAFE_INTEGER);
    let replayed = 0;
    for (const letter of letters.filter((item) => ids.includes(item.id))) {
      // Into the group's own retry topic: other groups of the origin topic never see the replay.
      await this.#parts.publishCopy(this.#parts.retryTopic(consumer), encodeRecord(letter.envelope, { [HEADERS.replayed]: '1', [HEADERS.attempt]: '1' }));
      await this.#parts.publishCopy(this.#parts.deadLetterTopic(consumer), { key: letter.id, value: null, headers: {} });
      replayed += 1;
    }
    return replayed;
  }

  async #purgeDead(consumer: string, ids: readonly string[]): Promise<number> {
    const entries = await this.#readDead(consumer);
    let purged = 0;
    for (const id of ids) {
      if (!entries.has(id)) continue;
      await this.#parts.publishCopy(this.#parts.deadLetterTopic(consumer), { key: id, value: null, headers: {} });
      purged += 1;
    }
    return purged;
  }
}
