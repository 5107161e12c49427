import {
  TransportError,
  abortableSleep,
  linkSignals,
  onAbort,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type Subscription,
} from '@courier/core';
import type { ServiceBusClient, ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusSessionReceiver } from '@azure/service-bus';
import { randomUUID } from 'node:crypto';
import { P, codeOf, describe, toTransportError } from './service-bus-errors.js';
import { ServiceBusTransport } from './service-bus-transport.js';

/** An operation that outlived the deadline {@link deadline} gave it. */
class DeadlineMissed extends Error {
  override readonly name = 'DeadlineMissed';
}

/** Resolves as `promise` does, or rejects once `ms` passed. */
async function deadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([promise, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new DeadlineMissed(`no answer within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether a failed receive or accept means the connection is gone (throttling aside), and
 * whether by a timeout (ours or the SDK's): undefined when it does not. The client is then
 * reported lost.
 */
function connectionLoss(error: unknown): { timedOut: boolean } | undefined {
  const failure = toTransportError(error, 'receive');
  const lost = (failure.code === 'TRANSPORT' || failure.code === 'PUBLISH_TIMEOUT') && codeOf(failure.cause) !== 'ServiceBusy' && codeOf(error) !== 'SessionLockLost' && codeOf(error) !== 'MessageLockLost';
  return lost ? { timedOut: error instanceof DeadlineMissed || codeOf(failure.cause) === 'ServiceTimeout' } : undefined;
}

/**
 * Resolves as `promise` does, or rejects once `signal` aborts; a value that arrives after
 * that is handed to `late` (say, to close a receiver nobody will use).
 */
async function untilAborted<T>(promise: Promise<T>, signal: AbortSignal, late: (value: T) => void): Promise<T> {
  if (signal.aborted) {
    void promise.then(late, () => undefined);
    throw new Error('aborted');
  }
  let cancel: (() => void) | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        cancel = onAbort(signal, () => {
          void promise.then(late, () => undefined);
          reject(new Error('aborted'));
        });
      }),
    ]);
  } finally {
    cancel?.();
  }
}

/**
 * A settle (complete, abandon, dead-letter) on a client that may be given up meanwhile:
 * resolves as the settle does, or rejects once the client is given up. Why: a settle sent on
 * a connection that was cut waits for the SDK's 60 s operation timeout, and the subscription's
 * close waits for its in-flight deliveries, so `bus.stop()` hung a minute. The message was not
 * settled either way; it comes back after its lock.
 */
const onLiveClient = (settle: Promise<void>, givenUp: AbortSignal): Promise<void> =>
  untilAborted(settle, givenUp, () => undefined).catch((error: unknown) => {
    if (givenUp.aborted) throw new Error('its client was given up after a lost connection; the message comes back after its lock', { cause: error });
    throw error;
  });

/** Longest dead-letter reason and description Service Bus takes, in characters. */
const DEAD_TEXT_MAX = 4_096;

/** `text` cut to at most `max` UTF-16 characters (a split surrogate pair dropped), the cut marked with `…`. */
function cutText(text: string, max: number): string {
  if (text.length <= max) return text;
  return `${text.slice(0, max - 1).replace(/[\uD800-\uDBFF]$/u, '')}…`;
}

/** A pending in-place retry: after the delay the message is abandoned with the attempt raised. */
interface ParkedRetry {
  readonly delayMs: number;
  readonly attempt: number;
}

/**
 * One subscribed endpoint: a peek-lock receiver per topic (unordered), or session
 * receivers that each hold one key's session at a time (ordered; in queue mode with `sessions`, every endpoint).
 */
export class ServiceBusSubscription implements Subscription {
  onClosed: (() => void) | undefined;
  readonly #stop = new AbortController();
  readonly #inFlight = new Set<Promise<void>>();
  readonly #receivers = new Set<ServiceBusReceiver | ServiceBusSessionReceiver>();
  readonly #loops = new Set<Promise<void>>();
  #slots: number;
  readonly #waiting: (() => void)[] = [];
  #parked = 0;
  #closing: Promise<void> | undefined;

  constructor(
    private readonly transport: ServiceBusTransport,
    private readonly endpoint: Endpoint,
    private readonly handler: DeliveryHandler,
    private readonly maxLockRenewalMs: number,
  ) {
    this.#slots = endpoint.concurrency;
  }

  async start(): Promise<void> {
    if (this.transport.receivesSessions(this.endpoint)) {
      // Lock a session of our own (empty, so nobody else's) on each topic before returning:
      // subscribe then fails while the entity is missing or the broker away, and the
      // subscription is known to the broker before the caller publishes (the next-session
      // accepts below may wait, and tell nothing, until a session has messages).
      const { client, generation } = this.transport.source.current;
      for (const topic of this.endpoint.topics) {
        const probe = await this.transport.acceptSessionOf(client, topic, this.endpoint.consumer, `courier-probe-${randomUUID()}`, { maxAutoLockRenewalDurationInMs: 0 });
        this.transport.source.answered(generation);
        await probe.close().catch(() => undefined);
      }
      for (const topic of this.endpoint.topics) {
        for (let index = 0; index < this.endpoint.concurrency; index += 1) this.#spawnSessionLoop(topic);
      }
      return;
    }
    for (const topic of this.endpoint.topics) {
      // Reaching the entity now makes subscribe fail while the broker is away.
      const { client, generation } = this.transport.source.current;
      const probe = this.#receiver(client, topic);
      try {
        await probe.peekMessages(1);
        this.transport.source.answered(generation);
      } finally {
        await probe.close().catch(() => undefined);
      }
    }
    for (const topic of this.endpoint.topics) {
      const loop = this.#receiveLoop(topic);
      this.#loops.add(loop);
      void loop.finally(() => this.#loops.delete(loop));
    }
  }

  #receiver(client: ServiceBusClient, topic: string): ServiceBusReceiver {
    return this.transport.receiverOf(client, topic, this.endpoint.consumer, {
      receiveMode: 'peekLock',
      skipParsingBodyAsJson: true,
      maxAutoLockRenewalDurationInMs: this.maxLockRenewalMs,
    });
  }

  /**
   * Receives as many messages as handler slots are free and runs them. A receive that
   * fails on the connection or hangs (the SDK can wait a minute re-opening a link after a
   * lost connection) reports the client lost, so the next receiver is made on a fresh
   * client and delivery resumes soon after the broker is back.
   */
  async #receiveLoop(topic: string): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const current = this.transport.source.current;
      const linked = linkSignals([signal, current.signal]);
      const both = linked.signal;
      let receiver: ServiceBusReceiver;
      try {
        receiver = this.#receiver(current.client, topic);
      } catch (error) {
        linked.dispose();
        throw error;
      }
      this.#receivers.add(receiver);
      try {
        while (!both.aborted) {
          await this.#acquire();
          let reserved = 1;
          while (this.#slots > 0) {
            this.#slots -= 1;
            reserved += 1;
          }
          let messages: ServiceBusReceivedMessage[] = [];
          try {
            messages = await deadline(receiver.receiveMessages(reserved, { maxWaitTimeInMs: 1_000, abortSignal: both }), 10_000);
            this.transport.source.answered(current.generation);
          } finally {
            for (let index = messages.length; index < reserved; index += 1) this.#release();
          }
          for (const message of messages) this.#track(this.#handle(receiver, message, current.signal).finally(() => this.#release()));
        }
      } catch (error) {
        const loss = both.aborted ? undefined : connectionLoss(error);
        if (loss) this.transport.source.lost(current.generation, loss);
        await abortableSleep(250, signal);
      } finally {
        linked.dispose();
        this.#receivers.delete(receiver);
        void receiver.close().catch(() => undefined);
      }
    }
  }

  #track(run: Promise<void>): void {
    this.#inFlight.add(run);
    void run.finally(() => this.#inFlight.delete(run));
  }

  async #acquire(): Promise<void> {
    if (this.#slots > 0) {
      this.#slots -= 1;
      return;
    }
    await new Promise<void>((resolve) => this.#waiting.push(resolve));
  }

  #release(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else this.#slots += 1;
  }

  /** Runs the handler for one message; returns the retry the handler asked for, if it did. */
  async #handle(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, givenUp: AbortSignal): Promise<void> {
    const parked = await this.#deliver(receiver, message, givenUp);
    if (parked) {
      // Unordered: the delay runs outside the handler slot; the lock is renewed meanwhile.
      this.#track(this.#retryLater(receiver, message, parked, givenUp));
    }
  }

  /**
   * `givenUp` is the signal of the client the message came through: once that client is
   * given up, its settles stop waiting (see {@link onLiveClient}).
   */
  async #deliver(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, givenUp: AbortSignal): Promise<ParkedRetry | undefined> {
    let envelope: Envelope;
    try {
      envelope = this.transport.fromMessage(message);
    } catch (error) {
      await onLiveClient(
        receiver.deadLetterMessage(message, { deadLetterReason: 'ENVELOPE_INVALID', deadLetterErrorDescription: describe(error), [P.deadAt]: new Date().toISOString(), [P.deadFor]: this.endpoint.consumer }),
        givenUp,
      ).catch(() => undefined);
      return undefined;
    }
    const replayedFor = message.applicationProperties?.[P.replayedFor];
    if (!this.transport.queueMode && replayedFor !== undefined && replayedFor !== this.endpoint.consumer) {
      // A replay is sent to the topic (Service Bus takes no sends to a subscription), so every
      // subscription gets a copy; it is meant for `replayedFor` alone. Completed unrun here,
      // else a group whose inbox record was pruned would run the message again. (A queue has
      // one group, which takes every replay: queue mode never drops one.)
      await onLiveClient(receiver.completeMessage(message), givenUp).catch(() => undefined);
      return undefined;
    }
    const attempt = ServiceBusTransport.attemptOf(message);
    let settled = false;
    let parked: ParkedRetry | undefined;
    const once = async (action: () => Promise<void>, what: string) => {
      if (settled) return;
      settled = true;
      try {
        await action();
      } catch (error) {
        // Settled nothing: the message is still locked here, so a later settle (the core's
        // retry after a failed dead letter) is taken rather than left to the lock's lapse.
        settled = false;
        // The ServiceBusError code (MessageLockLost: the lock lapsed before the settle) says
        // what happened in every log line, whatever wording the service gives its description.
        const code = codeOf(error);
        throw new TransportError(`${what} of ${envelope.messageId} failed: ${code ? `[${code}] ` : ''}${describe(error)}`, { cause: error });
      }
    };
    const delivery: Delivery = {
      envelope,
      attempt,
      replayed: message.applicationProperties?.[P.replayedFor] === this.endpoint.consumer,
      redelivered: ServiceBusTransport.redeliveredOf(message, attempt),
      ack: () => once(() => onLiveClient(receiver.completeMessage(message), givenUp), 'complete'),
      retry: (delayMs: number) =>
        once(async () => {
          parked = { delayMs: Math.max(0, delayMs), attempt: attempt + 1 };
        }, 'retry'),
      deadLetter: (reason: DeadLetterReason) =>
        once(
          () =>
            onLiveClient(
              // Service Bus takes at most 4,096 characters in either (a longer one fails the
              // settle every time: the key would never move on).
              receiver.deadLetterMessage(message, { deadLetterReason: cutText(reason.code, DEAD_TEXT_MAX), deadLetterErrorDescription: cutText(reason.message, DEAD_TEXT_MAX), [P.deadAt]: new Date().toISOString(), [P.deadFor]: this.endpoint.consumer }),
              givenUp,
            ),
          'deadLetter',
        ),
    };
    try {
      await this.handler(delivery);
    } catch {
      // The core settles handler failures itself; an unsettled delivery comes back after its lock.
    }
    return parked;
  }

  /**
   * Waits the retry delay (the lock renewed by the SDK), then abandons with the attempt raised.
   * An abandon that fails is asked again (1 s, doubling to 30 s; each failure logged) until it
   * goes through, the client is given up or the subscription stops: the SDK keeps renewing the
   * lock of a message it holds, so one failed abandon would otherwise hold the message (and,
   * ordered, its session's key) until `maxLockRenewalMs`. A given-up client or a stop leaves
   * the message to its lock, which then lapses.
   */
  async #retryLater(receiver: ServiceBusReceiver | ServiceBusSessionReceiver, message: ServiceBusReceivedMessage, parked: ParkedRetry, givenUp: AbortSignal): Promise<void> {
    const linked = linkSignals([this.#stop.signal, givenUp]);
    try {
      await abortableSleep(parked.delayMs, linked.signal);
      for (let failures = 0; !linked.signal.aborted; ) {
        try {
          await onLiveClient(receiver.abandonMessage(message, { [P.attempt]: parked.attempt }), givenUp);
          return;
        } catch (error) {
          if (linked.signal.aborted) return;
          failures += 1;
          const delayMs = Math.min(30_000, 1_000 * 2 ** (failures - 1));
          this.transport.logger.error('service bus abandon of a retried message failed; asking again', {
            consumer: this.endpoint.consumer,
            messageId: String(message.messageId ?? ''),
            delayMs,
            error: describe(error),
          });
          await abortableSleep(delayMs, linked.signal).catch(() => undefined);
        }
      }
    } catch {
      // Stopped or given up during the delay: the message comes back after its lock.
    } finally {
      linked.dispose();
    }
  }

  #spawnSessionLoop(topic: string): void {
    const loop = this.#sessionLoop(topic);
    this.#loops.add(loop);
    void loop.finally(() => this.#loops.delete(loop));
  }

  /**
   * Accepts the next session with messages, handles its messages one at a time in order,
   * and lets it go when it has none left. A retry parks the session (the key waits, its
   * lock renewed) and starts another loop, so the handler slot is free for other keys.
   */
  async #sessionLoop(topic: string): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const current = this.transport.source.current;
      const linked = linkSignals([signal, current.signal]);
      const both = linked.signal;
      try {
        let receiver: ServiceBusSessionReceiver;
        try {
          // The broker holds the accept open until a session is free or the client's timeout
          // passes; closing, or a replaced client, must not wait for that.
          receiver = await untilAborted(
            this.transport.acceptNextSessionOf(current.client, topic, this.endpoint.consumer, {
              receiveMode: 'peekLock',
              skipParsingBodyAsJson: true,
              maxAutoLockRenewalDurationInMs: this.maxLockRenewalMs,
              abortSignal: both,
            }),
            both,
            (late) => void late.close().catch(() => undefined),
          );
        } catch (error) {
          if (both.aborted) continue;
          // No session free within the timeout (ServiceTimeout), or the one offered was taken: ask again.
          const code = codeOf(error);
          if (code === 'ServiceTimeout' || code === 'SessionCannotBeLocked') continue;
          const loss = connectionLoss(error);
          if (loss) this.transport.source.lost(current.generation, loss);
          await abortableSleep(250, signal);
          continue;
        }
        this.transport.source.answered(current.generation);
        this.#receivers.add(receiver);
        try {
          while (!both.aborted) {
            const [message] = await receiver.receiveMessages(1, { maxWaitTimeInMs: 500, abortSignal: both });
            if (!message || both.aborted) break;
            await this.#acquire();
            let parked: ParkedRetry | undefined;
            const run = this.#deliver(receiver, message, current.signal).then((value) => {
              parked = value;
            });
            this.#track(run);
            await run.catch(() => undefined);
            this.#release();
            if (parked) {
              // The key waits in place; another loop keeps the other keys flowing — unless as
              // many loops as slots are receiving already: one spawned per retry piled up loops
              // waiting for a session (each a receive link and listeners on this subscription's
              // signals) until a session came to each; the retire check below only runs after one.
              this.#parked += 1;
              if (this.#loops.size - this.#parked < this.endpoint.concurrency * this.endpoint.topics.length) this.#spawnSessionLoop(topic);
              await abortableSleep(parked.delayMs, signal);
              this.#parked -= 1;
              // Nothing later of the session is in hand: every receive asks for one message, so
              // the link has no credit left once it arrived and the broker sends nothing more.
              // (Asking for more here, to hand them back, cost a drain: a drain the SDK sees no
              // answer to within 200 ms closes the link, the session lock goes with it, and the
              // retried message came back after its lock at the old attempt, as a crash.)
              await onLiveClient(receiver.abandonMessage(message, { [P.attempt]: parked.attempt }), current.signal).catch(() => undefined);
            }
          }
        } catch (error) {
          // Session lock lost or connection gone: the broker hands the session on after the lock.
          const loss = both.aborted ? undefined : connectionLoss(error);
          if (loss) this.transport.source.lost(current.generation, loss);
        } finally {
          this.#receivers.delete(receiver);
          // A receiver of a given-up client closes with it; on its dead connection the close
          // can take the SDK's 60 s, which this loop (and the subscription's close) must not wait.
          const closing = receiver.close().catch(() => undefined);
          if (!current.signal.aborted) await closing;
        }
      } finally {
        linked.dispose();
      }
      // More loops than slots (after a parked retry ended): this one retires.
      if (this.#loops.size - this.#parked > this.endpoint.concurrency * this.endpoint.topics.length) return;
    }
  }

  async close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stop.abort();
      await Promise.allSettled([...this.#inFlight]);
      await Promise.allSettled([...this.#loops]);
      await Promise.all([...this.#receivers].map((receiver) => receiver.close().catch(() => undefined)));
      this.onClosed?.();
    })();
    return this.#closing;
  }
}
