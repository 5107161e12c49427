/**
 * The Redis keys one transport uses, all under its prefix (so one Redis serves several
 * applications, and a Redis Cluster keeps them on one slot when the prefix is a hash tag such
 * as `{courier}`, which the multi-key settle scripts need).
 */
export class StreamKeys {
  readonly #prefix: string;

  constructor(prefix: string) {
    this.#prefix = prefix;
  }

  /** The stream of a topic; every consumer group of the topic reads it. */
  topic(topic: string): string {
    return `${this.#prefix}:topic:${topic}`;
  }

  /** A `SCAN MATCH` pattern of every topic stream: the prefix taken literally (its glob characters escaped). */
  topicPattern(): string {
    return `${this.#prefix.replace(/[*?[\]\\]/g, '\\$&')}:topic:*`;
  }

  /** A consumer's own retry stream: due retries and replays, read by that group alone. */
  retry(consumer: string): string {
    return `${this.#prefix}:retry:${consumer}`;
  }

  /** A consumer's due set: retry copies scored by when they are due (server milliseconds). */
  delayed(consumer: string): string {
    return `${this.#prefix}:delayed:${consumer}`;
  }

  /** A consumer's dead-letter stream. */
  dead(consumer: string): string {
    return `${this.#prefix}:dead:${consumer}`;
  }

  /** The lease an ordered group's active instance holds. */
  lease(consumer: string): string {
    return `${this.#prefix}:lease:${consumer}`;
  }
}
