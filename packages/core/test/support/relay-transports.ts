import { setTimeout as sleep } from 'node:timers/promises';
import { CourierError, TransportError, type Envelope, type PublishResult, type Transport } from '@courier/core';

/** What a {@link slowTransport} saw, shared by every connection wrapped with it. */
export class SendLog {
  /** Times each message reached the broker. */
  readonly sent = new Map<string, number>();
  /** Messages handed to the broker whose confirm has not come back yet. */
  unconfirmed = 0;

  /** Copies that reached the broker beyond the first, over all messages. */
  get duplicates(): number {
    let extra = 0;
    for (const times of this.sent.values()) extra += times - 1;
    return extra;
  }

  /** Messages sent at least once. */
  get total(): number {
    let all = 0;
    for (const times of this.sent.values()) all += times;
    return all;
  }
}

/**
 * Wraps `inner` so it behaves like RabbitMQ with a confirm window of 1: messages go one at
 * a time, each confirm takes `confirmMs`, and once `signal` aborts the messages not yet
 * sent come back `ABORTED` (a message already sent still waits for its confirm).
 * `capabilities` overrides what it declares.
 */
export function slowTransport(inner: Transport, log: SendLog, confirmMs: number, capabilities: Partial<Transport['capabilities']> = {}): Transport {
  return {
    capabilities: { ...inner.capabilities, orderedPipelining: false, ...capabilities },
    async publish(messages, options) {
      const results: PublishResult[] = [];
      for (const envelope of messages) {
        const { messageId } = envelope;
        if (options?.signal?.aborted) {
          results.push({ messageId, ok: false, error: new TransportError(`publish of message '${messageId}' aborted before sending`, { code: 'ABORTED' }) });
          continue;
        }
        log.sent.set(messageId, (log.sent.get(messageId) ?? 0) + 1);
        log.unconfirmed += 1;
        try {
          const [result] = await inner.publish([envelope]);
          await sleep(confirmMs);
          results.push(result!);
        } finally {
          log.unconfirmed -= 1;
        }
      }
      return results;
    },
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}

/**
 * Wraps `inner`; before each publish call, `script` sees the call's messages and returns,
 * per message, `undefined` (publish it through `inner`) or an error to report as that
 * message's result without publishing it — as a transport reports a batch cut by a
 * connection loss.
 */
export function scriptedTransport(inner: Transport, script: (messages: readonly Envelope[]) => readonly (CourierError | undefined)[]): Transport {
  return {
    capabilities: inner.capabilities,
    async publish(messages, options) {
      const plan = script(messages);
      const passed = messages.filter((_, index) => plan[index] === undefined);
      const published = passed.length > 0 ? await inner.publish(passed, options) : [];
      let next = 0;
      return messages.map((envelope, index): PublishResult => {
        const error = plan[index];
        return error === undefined ? published[next++]! : { messageId: envelope.messageId, ok: false, error };
      });
    },
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}

/** What a {@link keyWatchTransport} measured. */
export interface KeyWatch {
  /** Most unconfirmed messages of one (topic, key) it held at any instant. */
  maxPerKey: number;
  /** Publish calls seen. */
  calls: number;
}

/**
 * Wraps `inner` declaring no ordered pipelining, and records how many unconfirmed
 * messages of one (topic, key) it holds at once: every message of a call is unconfirmed
 * from the call until its result, which takes `confirmMs` so that calls overlap.
 */
export function keyWatchTransport(inner: Transport, watch: KeyWatch, confirmMs: number): Transport {
  const held = new Map<string, number>();
  return {
    capabilities: { ...inner.capabilities, orderedPipelining: false },
    async publish(messages, options) {
      watch.calls += 1;
      const keys = messages.filter((envelope) => envelope.key !== null).map((envelope) => `${envelope.topic}\u0000${envelope.key}`);
      for (const key of keys) {
        const now = (held.get(key) ?? 0) + 1;
        held.set(key, now);
        watch.maxPerKey = Math.max(watch.maxPerKey, now);
      }
      try {
        const results = await inner.publish(messages, options);
        await sleep(confirmMs);
        return results;
      } finally {
        for (const key of keys) held.set(key, held.get(key)! - 1);
      }
    },
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}
