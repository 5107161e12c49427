// One live subscription: pull loops over the endpoint's durable consumers, the handler
// slots, the per-key queues of an ordered endpoint and the lease that makes one instance of
// an ordered group the active one. What a settle writes lives beside it (`retries.ts`,
// `dead-letters.ts`); this file decides when a delivery is in hand, settled or given back.
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
import type { ConsumerMessages, JsMsg } from '@nats-io/jetstream';
import { writeDeadLetter } from './dead-letters.js';
import { ATTEMPT_HEADER, NOT_BEFORE_HEADER, REPLAYED_HEADER, decode, describe } from './nats-mapping.js';
import type { NatsJetStreamTransport } from './nats-jetstream-transport.js';
import { acquireLease, releaseLease, renewLease } from './ordered-lease.js';
import { writeRetryCopy } from './retries.js';

interface InHand {
  readonly msg: JsMsg;
  readonly key: string | null;
  /**
   * An ack was sent for this delivery. The client then drops every later nak and in-progress
   * signal of it (nats.js `didAck`), and the server may have taken the ack even if its answer
   * never came: such a delivery can only come back through AckWait, and perhaps never.
   */
  ackSent: boolean;
}

/** A pulled delivery on its way to the handler. */
interface Pulled {
  readonly msg: JsMsg;
  readonly envelope: Envelope;
  readonly attempt: number;
  readonly replayed: boolean;
  readonly redelivered: boolean;
}

/** How many deliveries this subscription put back (nak) a subscription remembers (see `redelivered`, `#putBack`). */
const PUT_BACK_REMEMBERED = 10_000;

/**
 * How long a delivery waits before it comes again after its settle failed or never came,
 * unless the core asked for a delay (a `retry` after the failed settle). Short next to
 * AckWait, but not zero: a handler that never settles would otherwise spin.
 */
const GIVE_BACK_DELAY_MS = 1_000;

/** One live subscription: pull loops over the endpoint's durables, a lease when ordered. */
export class JetStreamSubscription implements Subscription {
  readonly #transport: NatsJetStreamTransport;
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #durables: readonly { readonly durable: string; readonly source: string; readonly subject: string }[];
  readonly #stop = new AbortController();
  readonly #inHand = new Map<number, InHand>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #keyQueues = new Map<string, Pulled[]>();
  readonly #ready: Pulled[] = [];
  #running = 0;
  /** Ordered only: when our hold of the group's lease ends unless renewed (epoch ms). */
  #leaseUntil = 0;
  /**
   * Deliveries this subscription put back (nak): retry copies until their not-before, and
   * deliveries whose settle failed or never came. Stream sequence → delivery count at the nak,
   * and the attempt it comes back with when the header's is behind (a failed retry copy).
   */
  readonly #putBack = new Map<number, { readonly deliveries: number; readonly attempt?: number }>();
  /** Ordered only, per source: the last stream sequence a rewound consumer had handed out (see `rewindConsumer`). */
  readonly #handedOutThrough = new Map<string, number>();
  #slotWaiters: (() => void)[] = [];
  #iterators = new Set<ConsumerMessages>();
  #closing: Promise<void> | undefined;
  #done: Promise<void> = Promise.resolve();

  constructor(transport: NatsJetStreamTransport, endpoint: Endpoint, handler: DeliveryHandler, durables: readonly { readonly durable: string; readonly source: string; readonly subject: string }[]) {
    this.#transport = transport;
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#durables = durables;
  }

  start(onDone: () => void): void {
    const heartbeat = setInterval(() => this.#heartbeat(), Math.max(200, Math.floor(this.#transport.internals.options.ackWaitMs / 3)));
    this.#done = (this.#endpoint.ordered ? this.#runOrdered() : this.#runPulls(this.#stop.signal))
      .catch(() => undefined)
      .finally(() => {
        clearInterval(heartbeat);
        onDone();
      });
  }

  /**
   * Keeps every delivery in hand alive (running, queued behind its key, or waiting to run
   * again in place), so AckWait redelivers only after a crash. A delivery whose settle failed
   * or never came leaves the hand (`#comeBack`): kept alive, it would never come back.
   */
  #heartbeat(): void {
    for (const item of this.#inHand.values()) {
      try {
        item.msg.working();
      } catch {
        // The connection is gone; the broker redelivers after AckWait.
      }
    }
  }

  async #runPulls(signal: AbortSignal): Promise<void> {
    await Promise.all(this.#durables.map((durable) => this.#pull(durable, signal)));
  }

  async #pull({ durable, source, subject }: { durable: string; source: string; subject: string }, signal: AbortSignal): Promise<void> {
    const { stream } = this.#transport.internals;
    let delay = 100;
    while (!signal.aborted) {
      const connection = await this.#transport.awaitConnection(signal);
      if (!connection) return;
      try {
        const consumer = await connection.js.consumers.get(stream, durable);
        const messages = await consumer.consume({ max_messages: Math.max(this.#endpoint.concurrency, this.#endpoint.ordered ? 256 : 1), expires: 5_000 });
        this.#iterators.add(messages);
        // Closed while `consumers.get`/`consume` were in flight: `onAbort` stops at once, so
        // `close`, which could not see this iterator, does not leave it pulling forever.
        const cancelStopper = onAbort(signal, () => void messages.stop());
        try {
          for await (const msg of messages) {
            delay = 100;
            await this.#accept(msg, source);
            if (signal.aborted) break;
          }
        } finally {
          cancelStopper();
          this.#iterators.delete(messages);
        }
      } catch (error) {
        if (/consumer not found|stream not found/i.test(describe(error))) {
          // Deleted under us (or the server lost it): declare it again.
          this.#transport.internals.forget();
          await this.#transport.ensureConsumer(connection, this.#endpoint.consumer, source, subject).catch(() => undefined);
        }
      }
      await abortableSleep(delay, signal);
      delay = Math.min(delay * 2, 2_000);
    }
  }

  /** Takes one pulled message: decodes it, holds it, and hands it on (waiting for a slot when unordered). */
  async #accept(msg: JsMsg, source: string): Promise<void> {
    if (this.#inHand.has(msg.seq)) return;
    let envelope: Envelope;
    try {
      envelope = decode(msg.headers, msg.data);
    } catch (error) {
      // Never in hand: if the dead letter fails, AckWait brings the message back to try again.
      await this.#deadLetter(msg, undefined, 1, { code: 'ENVELOPE_INVALID', message: describe(error) }).catch(() => undefined);
      return;
    }
    // A delivery this subscription put back comes again with one more delivery: that nak
    // is no crash. Anything else JetStream counts is flagged.
    const putBack = this.#putBack.get(msg.seq);
    this.#putBack.delete(msg.seq);
    const onlyWaited = putBack !== undefined && msg.info.deliveryCount === putBack.deliveries + 1;
    // A retry whose copy the broker failed came back as the original: the attempt it asked for is remembered here.
    const attempt = Math.max(Number(msg.headers?.get(ATTEMPT_HEADER) || '1') || 1, (onlyWaited && putBack.attempt) || 0);
    const notBefore = Number(msg.headers?.get(NOT_BEFORE_HEADER) || '0');
    if (notBefore > Date.now()) {
      this.#rememberPutBack(msg, onlyWaited ? putBack.attempt : undefined);
      msg.nak(notBefore - Date.now());
      return;
    }
    const replayed = msg.headers?.get(REPLAYED_HEADER) === '1';
    this.#inHand.set(msg.seq, { msg, key: envelope.key, ackSent: false });
    // JetStream counts every delivery, the naks that hold a retry copy until its
    // not-before included. Only those this subscription made and saw come back are told
    // apart (above): a false "not redelivered" would hide a crash loop, a false
    // "redelivered" only costs a run alone. A rewound ordered consumer counts deliveries
    // afresh: what the old one had handed out may have been in a dead holder's hand, so it
    // is flagged here.
    const redelivered = (msg.info.redelivered && !onlyWaited) || msg.seq <= (this.#handedOutThrough.get(source) ?? 0);
    const item = { msg, envelope, attempt, replayed, redelivered };
    if (this.#endpoint.ordered && envelope.key !== null) {
      const queueKey = `${envelope.topic}\u0000${envelope.key}`;
      const queue = this.#keyQueues.get(queueKey);
      if (queue) {
        queue.push(item);
        return;
      }
      this.#keyQueues.set(queueKey, [item]);
    }
    this.#ready.push(item);
    this.#pump();
    if (!this.#endpoint.ordered) {
      while (this.#running + this.#ready.length >= this.#endpoint.concurrency && !this.#stop.signal.aborted) {
        await new Promise<void>((resolve) => this.#slotWaiters.push(resolve));
      }
    }
  }

  #pump(): void {
    // An ordered instance whose lease ran out (a stalled process that woke up, say) starts
    // nothing more: another instance may hold the group by now.
    if (this.#endpoint.ordered && Date.now() >= this.#leaseUntil - 250) return;
    while (this.#running < this.#endpoint.concurrency && this.#ready.length > 0 && !this.#stop.signal.aborted) {
      const item = this.#ready.shift()!;
      this.#running += 1;
      const run = this.#run(item).finally(() => {
        this.#running -= 1;
        this.#handlers.delete(run);
        this.#pump();
        for (const wake of this.#slotWaiters.splice(0)) wake();
      });
      this.#handlers.add(run);
    }
  }

  /**
   * Hands one delivery to the handler; settling decides what the key does next. A settle
   * counts once the broker answered it: one that fails, and a handler that ends without
   * settling (or throws), leave the delivery to {@link #comeBack}, never in hand. Only the
   * first settle call counts, except a `retry` after a failed one — the core asks for that
   * (`ConsumerRunner.#handle`) — which sets the delay the message comes back after.
   */
  async #run(item: Pulled): Promise<void> {
    const { msg, envelope, attempt } = item;
    const ordered = this.#endpoint.ordered && envelope.key !== null;
    // In an object: TypeScript does not follow a `let` the settle callbacks change.
    const status: { state: 'open' | 'settling' | 'done' | 'failed' } = { state: 'open' };
    let settling: Promise<void> | undefined;
    // What the delivery comes back with if no settle goes through: the attempt the failed
    // settle meant (a retry's is one more), after the delay a later retry asks for.
    let comeBack = { delayMs: GIVE_BACK_DELAY_MS, attempt };
    const settle = (attemptAfter: number, work: () => Promise<void>): Promise<void> => {
      if (status.state !== 'open') return Promise.resolve();
      status.state = 'settling';
      settling = work().then(
        () => {
          status.state = 'done';
        },
        (error: unknown) => {
          status.state = 'failed';
          comeBack = { ...comeBack, attempt: attemptAfter };
          throw error;
        },
      );
      return settling;
    };
    const delivery: Delivery = {
      envelope,
      attempt,
      ...(item.replayed ? { replayed: true } : {}),
      redelivered: item.redelivered,
      ack: () =>
        settle(attempt, async () => {
          await this.#ack(msg, envelope);
          this.#release(msg, envelope);
        }),
      retry: (delayMs: number, reason: DeadLetterReason) => {
        if (status.state === 'failed') {
          comeBack = { ...comeBack, delayMs: Math.max(0, delayMs) };
          return Promise.resolve();
        }
        return settle(attempt + 1, async () => {
          if (ordered) {
            // In place: the message stays at the head of its key; the slot is freed during the delay.
            this.#reHand(item, delayMs, attempt + 1);
            return;
          }
          void reason;
          await this.#retryCopy(msg, envelope, attempt + 1, delayMs);
          this.#release(msg, envelope);
        });
      },
      deadLetter: (reason: DeadLetterReason) =>
        settle(attempt, async () => {
          await this.#deadLetter(msg, envelope, attempt, reason);
          this.#release(msg, envelope);
        }),
    };
    try {
      await this.#handler(delivery);
    } catch {
      // The core settles a handler's failures itself; a handler that throws anyway has not
      // settled, and its delivery comes back below like any unsettled one.
    }
    // A settle the handler started without awaiting it (against the contract) decides first.
    await settling?.catch(() => undefined);
    if (status.state === 'done') return;
    // From here on the delivery is given back: settles that come later are ignored.
    status.state = 'done';
    this.#comeBack(item, comeBack.delayMs, comeBack.attempt);
  }

  /**
   * Makes a delivery whose settle failed, or whose handler ended without settling, come
   * back instead of staying in hand — where the in-progress heartbeat would keep the server
   * from ever redelivering it, and an ordered key would wait for it for ever.
   *
   * - An ack was sent (a plain ack, or the ack after a retry or dead-letter copy was
   *   written): the client ignores a nak now, and the server may have taken the ack. It
   *   leaves the hand and its key moves on; AckWait brings it back if the ack was lost. Its
   *   key may move on because the core acks only after the inbox recorded the message (that
   *   copy is then dropped as a duplicate), and a copy was written otherwise; waiting for it
   *   instead would hold the key for ever whenever the ack did go through.
   * - On an ordered key, nothing sent: it is handed out again in place after `delayMs`, as
   *   an ordered retry is, so the next message of its key still waits for it (a nak would let
   *   that one overtake it).
   * - Otherwise: put back with a nak delayed by `delayMs`, remembered with `attempt`, so it
   *   comes back to any instance and is not taken for a crash's redelivery here.
   */
  #comeBack(item: Pulled, delayMs: number, attempt: number): void {
    const { msg, envelope } = item;
    const held = this.#inHand.get(msg.seq);
    if (held?.msg !== msg) return; // given back already (the lease was lost, or the subscription closed)
    if (held.ackSent) {
      this.#release(msg, envelope);
      return;
    }
    if (this.#endpoint.ordered && envelope.key !== null) {
      this.#reHand(item, delayMs, attempt);
      return;
    }
    this.#rememberPutBack(msg, attempt > item.attempt ? attempt : undefined);
    this.#release(msg, envelope);
    try {
      msg.nak(delayMs);
    } catch {
      // The connection is gone: out of hand, AckWait brings it back.
    }
  }

  /** Ordered keys: hands `item` out again after `delayMs` with `attempt`, at the head of its key, unless it left the hand meanwhile. */
  #reHand(item: Pulled, delayMs: number, attempt: number): void {
    void abortableSleep(Math.max(0, delayMs), this.#stop.signal).then(() => {
      // Given back meanwhile (the lease was lost): the next holder has it, not this one.
      if (this.#stop.signal.aborted || this.#inHand.get(item.msg.seq)?.msg !== item.msg) return;
      this.#ready.unshift({ ...item, attempt, redelivered: false });
      this.#pump();
    });
  }

  /** Remembers that this subscription put `msg` back (see `#putBack`); bounded: one forgotten is flagged `redelivered` when it comes back (the safe side). */
  #rememberPutBack(msg: JsMsg, attempt: number | undefined): void {
    this.#putBack.set(msg.seq, attempt === undefined ? { deliveries: msg.info.deliveryCount } : { deliveries: msg.info.deliveryCount, attempt });
    if (this.#putBack.size > PUT_BACK_REMEMBERED) this.#putBack.delete(this.#putBack.keys().next().value!);
  }

  /** Forgets a settled message and lets the next of its key go. */
  #release(msg: JsMsg, envelope: Envelope): void {
    this.#inHand.delete(msg.seq);
    if (!this.#endpoint.ordered || envelope.key === null) return;
    const queueKey = `${envelope.topic}\u0000${envelope.key}`;
    const queue = this.#keyQueues.get(queueKey);
    if (!queue) return;
    queue.shift();
    if (queue.length === 0) this.#keyQueues.delete(queueKey);
    else this.#ready.push(queue[0]!);
    this.#pump();
  }

  /** Acknowledges `msg` and waits for the server's answer; rejects (retriably) when none comes in time. */
  async #ack(msg: JsMsg, envelope: Envelope | undefined): Promise<void> {
    const held = this.#inHand.get(msg.seq);
    if (held?.msg === msg) held.ackSent = true;
    try {
      await msg.ackAck({ timeout: this.#transport.internals.options.connectTimeoutMs });
    } catch (error) {
      throw new TransportError(`could not acknowledge '${envelope?.messageId ?? msg.seq}': ${describe(error)}`, { cause: error, retriable: true });
    }
  }


  /** Writes the retry copy (`retries.ts`), then acknowledges the original. */
  async #retryCopy(msg: JsMsg, envelope: Envelope, attempt: number, delayMs: number): Promise<void> {
    const connection = await this.#transport.connection();
    await writeRetryCopy(connection, this.#transport.internals.names, this.#endpoint.consumer, msg, envelope, attempt, delayMs);
    await this.#ack(msg, envelope);
  }

  /** Writes the dead letter (`dead-letters.ts`), then acknowledges the original. */
  async #deadLetter(msg: JsMsg, envelope: Envelope | undefined, attempt: number, reason: DeadLetterReason): Promise<void> {
    const connection = await this.#transport.connection();
    await writeDeadLetter(connection, this.#transport.internals.names, this.#endpoint.consumer, msg, envelope, attempt, reason);
    await this.#ack(msg, envelope);
  }

  // ------------------------------------------------------------- ordered

  /** Holds the group's lease while receiving; stands by while another instance holds it. */
  async #runOrdered(): Promise<void> {
    const internals = this.#transport.internals;
    const leaseMs = internals.options.orderedLeaseMs;
    const subject = internals.leaseSubject(this.#endpoint.consumer);
    while (!this.#stop.signal.aborted) {
      const connection = await this.#transport.awaitConnection(this.#stop.signal);
      if (!connection) return;
      let held: { seq: number; until: number } | undefined;
      try {
        held = await acquireLease(connection, internals.leaseStream, subject, internals.instance, leaseMs);
      } catch {
        held = undefined;
      }
      if (!held) {
        await abortableSleep(Math.max(100, Math.floor(leaseMs / 5)), this.#stop.signal);
        continue;
      }
      try {
        // Deliveries a previous holder left unsettled come first, in stream order.
        for (const { source, subject } of this.#durables) {
          const handedOut = await this.#transport.rewindConsumer(connection, this.#endpoint.consumer, source, subject);
          this.#handedOutThrough.set(source, Math.max(this.#handedOutThrough.get(source) ?? 0, handedOut));
        }
      } catch {
        await abortableSleep(200, this.#stop.signal);
        continue;
      }
      this.#leaseUntil = held.until;
      const pulls = linkSignals([this.#stop.signal]);
      const receiving = this.#runPulls(pulls.signal);
      // Renew until the lease is lost (another holder, or our own deadline passed unrenewed).
      while (!this.#stop.signal.aborted) {
        await abortableSleep(Math.floor(leaseMs / 4), this.#stop.signal);
        if (this.#stop.signal.aborted) break;
        try {
          const renewed = await renewLease(connection, subject, internals.instance, held.seq, leaseMs);
          if (!renewed) break;
          held = renewed;
          this.#leaseUntil = held.until;
        } catch {
          if (Date.now() > held.until - leaseMs / 4) break;
        }
      }
      this.#leaseUntil = 0;
      pulls.abort();
      await receiving;
      await Promise.all([...this.#handlers]);
      this.#giveBack();
      if (this.#stop.signal.aborted) {
        await releaseLease(connection, subject, held.seq).catch(() => undefined);
        return;
      }
    }
  }
  /** Hands every unsettled delivery back to the broker at once, so the next holder gets them in order. */
  #giveBack(): void {
    const items = [...this.#inHand.values()].sort((a, b) => a.msg.seq - b.msg.seq);
    for (const item of items) {
      try {
        item.msg.nak();
      } catch {
        // Gone with the connection: AckWait brings it back.
      }
    }
    this.#inHand.clear();
    this.#keyQueues.clear();
    this.#ready.length = 0;
  }

  async close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stop.abort();
      for (const messages of this.#iterators) messages.stop();
      for (const wake of this.#slotWaiters.splice(0)) wake();
      await this.#done;
      await Promise.all([...this.#handlers]);
      if (!this.#endpoint.ordered) this.#giveBack();
    })();
    await this.#closing;
  }
}
