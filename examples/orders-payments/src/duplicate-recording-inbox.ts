import type { InboxResult, InboxStore } from '@courier/core';

/** Where {@link DuplicateRecordingInbox} writes what it saw. */
export interface DuplicateLog {
  /** Remembers that `consumer` received `messageId` again and did not run its handler. */
  recordDuplicate(messageId: string, consumer: string): Promise<void>;
}

/**
 * An `InboxStore` decorator that writes every suppressed duplicate to a table, so the
 * demo can report "duplicates suppressed" from the database even for processes that
 * were SIGKILLed (whose in-process counters die with them).
 *
 * The record is written after the inbox said "duplicate" and before the delivery is
 * acknowledged; a crash in between loses that one record, and a redelivery after it is
 * recorded again (it is one more suppressed duplicate). A failure to record is ignored:
 * it must never fail the delivery.
 */
export class DuplicateRecordingInbox<Tx> implements InboxStore<Tx> {
  readonly #inner: InboxStore<Tx>;
  readonly #log: DuplicateLog;

  constructor(inner: InboxStore<Tx>, log: DuplicateLog) {
    this.#inner = inner;
    this.#log = log;
  }

  async run<T>(messageId: string, consumer: string, work: (tx: Tx) => Promise<T>, options?: { signal?: AbortSignal }): Promise<InboxResult<T>> {
    const result = await this.#inner.run(messageId, consumer, work, options);
    if (result.duplicate) await this.#log.recordDuplicate(messageId, consumer).catch(() => undefined);
    return result;
  }

  recordStart(messageId: string, consumer: string): Promise<number> {
    return this.#inner.recordStart(messageId, consumer);
  }

  forget(messageId: string, consumer: string): Promise<boolean> {
    return this.#inner.forget(messageId, consumer);
  }

  prune(olderThanMs: number, options?: { batchSize?: number; signal?: AbortSignal }): Promise<number> {
    return this.#inner.prune(olderThanMs, options);
  }

  async close(): Promise<void> {
    await this.#inner.close?.();
  }
}
