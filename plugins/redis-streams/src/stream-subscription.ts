// One subscription: a consumer (in the Redis sense) of the endpoint's consumer group on each
// topic stream and on the group's own retry stream. Its loops:
// - read: XREADGROUP '>' with a blocking read on a client of its own, only as much as it has
//   room for (the rest stays in the stream for the group's other instances);
// - claim (unordered): XAUTOCLAIM what another instance left unsettled for `claimIdleMs`;
// - heartbeat: every third of `claimIdleMs`, XCLAIM JUSTID on everything in hand, which
//   resets its idle time without counting a delivery, so only a dead or stalled instance's
//   deliveries are ever claimed;
// - due retries (unordered): moves retry copies whose delay ran out from the due set into
//   the retry stream (a server-side script, so a copy is never both or neither);
// - lease (ordered): only the instance holding the group's lease reads. Redis has no single
//   active consumer, so a lease key of the transport's own (SET PX, renewed by a script that
//   checks its token) stands in for it. A new holder first claims everything the group has
//   pending (XAUTOCLAIM min-idle 0), in stream order, before it reads anything new: what a
//   dead holder had in hand comes before anything later of its key.
import { randomUUID } from 'node:crypto';
import {
  ClosedError,
  TransportError,
  abortableSleep,
  boundReason,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Subscription,
} from '@courier/core';
import type { Redis } from 'ioredis';
import { ENVELOPE_FIELD, deadFields, decodeEntry, fieldMap, parseEntries, type DecodedEntry, type RawEntry } from './stream-codec.js';
import { isServerReply, type RedisConnections } from './redis-connections.js';
import type { StreamKeys } from './stream-keys.js';
import { ACK_SCRIPT, DEAD_SCRIPT, FORGET_CONSUMER_SCRIPT, LEASE_SCRIPT, MOVE_DUE_SCRIPT, RELEASE_SCRIPT, RETRY_SCRIPT } from './stream-scripts.js';

/** Timers a subscription runs on (see `RedisStreamsTransportConfig`). */
export interface SubscriptionSettings {
  readonly claimIdleMs: number;
  readonly leaseMs: number;
  readonly blockMs: number;
  readonly delayPollMs: number;
}

/** A stream entry read and not yet settled: buffered, in a handler, or held for a later run. */
interface InHand {
  readonly stream: string;
  readonly id: string;
  readonly fields: readonly string[];
  readonly decoded: DecodedEntry;
  /** (topic, key) on ordered endpoints; undefined when the message has no order to keep. */
  readonly orderKey: string | undefined;
  attempt: number;
  redelivered: boolean;
  /** Already holds its key (an in-place retry or an unsettled run coming back). */
  ownsKey: boolean;
  /** In a handler now. */
  active: boolean;
  unsettledRuns: number;
}

const DUE_BATCH = 100;

function entryKey(stream: string, id: string): string {
  return `${stream}\u0000${id}`;
}

function toTransportError(error: unknown, what: string): TransportError {
  if (error instanceof TransportError) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new TransportError(`redis-streams: ${what} failed: ${message}`, { cause: error, retriable: true });
}

/** See the file comment; made by `RedisStreamsTransport.subscribe`. */
export class StreamSubscription implements Subscription {
  readonly #endpoint: Endpoint;
  readonly #handler: DeliveryHandler;
  readonly #connections: RedisConnections;
  readonly #keys: StreamKeys;
  readonly #settings: SubscriptionSettings;
  readonly #onClosed: (subscription: StreamSubscription) => void;
  readonly #streams: string[];
  readonly #retryStream: string;
  /** This instance's consumer name within the group; unique, so a restart never inherits another's pending entries by name. */
  readonly #name = `courier-${randomUUID()}`;
  readonly #token = randomUUID();
  /** Aborted when the subscription stops taking work. */
  readonly #stop = new AbortController();
  /** Aborted once no handler runs any more: ends the heartbeat and the lease renewal. */
  readonly #finish = new AbortController();
  readonly #inHand = new Map<string, InHand>();
  readonly #buffer: InHand[] = [];
  readonly #busyKeys = new Set<string>();
  readonly #holds = new Set<ReturnType<typeof setTimeout>>();
  readonly #loops: Promise<void>[] = [];
  readonly #upkeep: Promise<void>[] = [];
  #reader: Redis | undefined;
  #running = 0;
  #holder = false;
  #renewedAt = 0;
  #wake: (() => void) | undefined;
  #idle: (() => void) | undefined;
  #closing: Promise<void> | undefined;

  constructor(endpoint: Endpoint, handler: DeliveryHandler, connections: RedisConnections, keys: StreamKeys, settings: SubscriptionSettings, onClosed: (subscription: StreamSubscription) => void) {
    this.#endpoint = endpoint;
    this.#handler = handler;
    this.#connections = connections;
    this.#keys = keys;
    this.#settings = settings;
    this.#onClosed = onClosed;
    this.#retryStream = keys.retry(endpoint.consumer);
    this.#streams = [...new Set(endpoint.topics.map((topic) => keys.topic(topic))), this.#retryStream];
  }

  /** Declares the group on every stream (idempotently), opens the reading client, starts the loops. */
  async start(transportClosed: () => boolean): Promise<void> {
    const stopped = () => this.#stop.signal.aborted || transportClosed();
    await this.#declare();
    if (stopped()) throw new ClosedError('redis-streams subscription');
    const reader = await this.#connections.dedicated();
    if (stopped()) {
      this.#connections.release(reader);
      throw new ClosedError('redis-streams subscription');
    }
    this.#reader = reader;
    this.#loops.push(this.#readLoop());
    if (!this.#endpoint.ordered) this.#loops.push(this.#dueLoop());
    this.#upkeep.push(this.#heartbeatLoop());
    if (this.#endpoint.ordered) this.#upkeep.push(this.#leaseLoop());
  }

  /** Stops reading, waits for handlers in flight, gives back what it held, releases the lease; idempotent. */
  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async #shutdown(): Promise<void> {
    this.#stop.abort();
    this.#wake?.();
    // Disconnecting the reader ends a blocking XREADGROUP at once rather than after blockMs.
    if (this.#reader) this.#connections.release(this.#reader);
    await Promise.all(this.#loops);
    for (const timer of this.#holds) clearTimeout(timer);
    this.#holds.clear();
    if (this.#running > 0) await new Promise<void>((resolve) => (this.#idle = resolve));
    this.#finish.abort();
    await Promise.all(this.#upkeep);
    await this.#giveBack().catch(() => undefined);
    this.#onClosed(this);
  }

  async #declare(): Promise<void> {
    const client = await this.#connections.commands();
    for (const stream of this.#streams) {
      try {
        // From the start of the stream: a group created after messages were published still
        // gets them (what the topic stream kept; see `maxLen`).
        await client.call('XGROUP', 'CREATE', stream, this.#endpoint.consumer, '0', 'MKSTREAM');
      } catch (error) {
        const message = String((error as Error).message);
        if (isServerReply(error) && message.startsWith('BUSYGROUP')) continue;
        // A key of another type under the stream's name: no retry fixes that.
        if (isServerReply(error) && message.startsWith('WRONGTYPE')) {
          throw new TransportError(`redis-streams: '${stream}' exists and is not a stream, so consumer group '${this.#endpoint.consumer}' cannot be created on it: ${message}`, { cause: error, retriable: false });
        }
        throw toTransportError(error, `creating consumer group '${this.#endpoint.consumer}' on '${stream}'`);
      }
    }
  }

  // ---- reading ----

  async #readLoop(): Promise<void> {
    const signal = this.#stop.signal;
    let backoffMs = 100;
    let claimedAt = 0;
    while (!signal.aborted) {
      try {
        if (this.#endpoint.ordered && !this.#holder) {
          await abortableSleep(Math.min(this.#settings.blockMs, this.#settings.leaseMs / 4), signal);
          continue;
        }
        const room = this.#room();
        if (room <= 0) {
          await this.#waitForRoom();
          continue;
        }
        if (!this.#endpoint.ordered && Date.now() - claimedAt >= this.#settings.claimIdleMs / 2) {
          claimedAt = Date.now();
          await this.#claim(room, this.#settings.claimIdleMs);
          continue;
        }
        let reader = this.#reader!;
        if (reader.status === 'end') {
          reader = await this.#connections.dedicated(signal);
          if (signal.aborted) {
            this.#connections.release(reader);
            return;
          }
          this.#reader = reader;
        }
        const reply = await reader.call('XREADGROUP', 'GROUP', this.#endpoint.consumer, this.#name, 'COUNT', String(room), 'BLOCK', String(this.#settings.blockMs), 'STREAMS', ...this.#streams, ...this.#streams.map(() => '>'));
        if (Array.isArray(reply)) {
          for (const item of reply as unknown[]) {
            const [stream, entries] = item as [string, unknown];
            await this.#accept(String(stream), parseEntries(entries), false);
          }
        }
        backoffMs = 100;
      } catch (error) {
        if (signal.aborted) return;
        // A Redis that lost its data (restarted without persistence) lost the groups too.
        if (error instanceof Error && error.message.includes('NOGROUP')) await this.#declare().catch(() => undefined);
        await abortableSleep(backoffMs, signal);
        backoffMs = Math.min(backoffMs * 2, 2_000);
      }
    }
  }

  #room(): number {
    if (this.#endpoint.ordered) return Math.max(this.#endpoint.concurrency * 4, 32) - this.#inHand.size;
    return this.#endpoint.concurrency - this.#running - this.#buffer.length;
  }

  async #waitForRoom(): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, this.#settings.blockMs);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.#wake = done;
    });
    this.#wake = undefined;
  }

  /** Takes over what other instances left unsettled for at least `minIdleMs` (all of it with 0), in stream order. */
  async #claim(limit: number, minIdleMs: number): Promise<void> {
    const client = await this.#connections.commands();
    for (const stream of this.#streams) {
      let cursor = '0-0';
      let taken = 0;
      do {
        const reply = (await client.call('XAUTOCLAIM', stream, this.#endpoint.consumer, this.#name, String(minIdleMs), cursor, 'COUNT', String(Math.min(100, limit)))) as [string, unknown];
        cursor = String(reply[0]);
        const entries = parseEntries(reply[1]);
        taken += entries.length;
        await this.#accept(stream, entries, true);
      } while (cursor !== '0-0' && (minIdleMs === 0 || taken < limit) && !this.#stop.signal.aborted);
    }
  }

  async #accept(stream: string, entries: readonly RawEntry[], redelivered: boolean): Promise<void> {
    for (const entry of entries) {
      const key = entryKey(stream, entry.id);
      if (this.#inHand.has(key)) continue;
      // An ordered instance that lost its lease leaves what it read pending: the next holder takes it.
      if (this.#endpoint.ordered && !this.#holder) continue;
      let decoded: DecodedEntry;
      try {
        decoded = decodeEntry(entry.fields);
      } catch (error) {
        // Never handed to a handler; if the dead letter fails it stays pending and is claimed again.
        await this.#writeDead(stream, entry.id, entry.fields, { code: 'ENVELOPE_INVALID', message: (error as Error).message }).catch(() => undefined);
        continue;
      }
      const { envelope } = decoded;
      const item: InHand = {
        stream,
        id: entry.id,
        fields: entry.fields,
        decoded,
        orderKey: this.#endpoint.ordered && envelope.key !== null ? `${envelope.topic}\u0000${envelope.key}` : undefined,
        attempt: decoded.attempt,
        redelivered,
        ownsKey: false,
        active: false,
        unsettledRuns: 0,
      };
      this.#inHand.set(key, item);
      this.#buffer.push(item);
    }
    this.#pump();
  }

  // ---- handing out ----

  #pump(): void {
    while (this.#running < this.#endpoint.concurrency && !this.#stop.signal.aborted) {
      // A holder whose lease may have run out starts nothing before it has renewed it.
      if (this.#endpoint.ordered && (!this.#holder || Date.now() - this.#renewedAt > this.#settings.leaseMs)) return;
      const index = this.#buffer.findIndex((item) => item.ownsKey || item.orderKey === undefined || !this.#busyKeys.has(item.orderKey));
      if (index < 0) return;
      const [item] = this.#buffer.splice(index, 1);
      void this.#run(item!);
    }
  }

  async #run(item: InHand): Promise<void> {
    this.#running += 1;
    if (item.orderKey !== undefined) this.#busyKeys.add(item.orderKey);
    item.ownsKey = true;
    item.active = true;
    const state = { settled: false, settling: undefined as Promise<void> | undefined, inPlaceDelayMs: undefined as number | undefined };
    const settle = async (what: string, operation: () => Promise<void>): Promise<void> => {
      while (state.settling) await state.settling.catch(() => undefined);
      if (state.settled) return;
      const running = operation();
      state.settling = running;
      try {
        await running;
        state.settled = true;
      } catch (error) {
        throw toTransportError(error, what);
      } finally {
        state.settling = undefined;
      }
    };
    const ordered = this.#endpoint.ordered;
    const delivery: Delivery = {
      envelope: item.decoded.envelope,
      attempt: item.attempt,
      redelivered: item.redelivered,
      ...(item.decoded.replayed ? { replayed: true } : {}),
      ack: () => settle('ack', () => this.#ack(item)),
      retry: (delayMs: number, _reason: DeadLetterReason) =>
        settle('retry', async () => {
          if (ordered) {
            // In place: the key stays blocked and the message keeps its place; the slot is freed when the handler returns.
            state.inPlaceDelayMs = Math.max(0, delayMs);
            return;
          }
          await this.#retry(item, delayMs);
        }),
      deadLetter: (reason: DeadLetterReason) => settle('deadLetter', () => this.#writeDead(item.stream, item.id, item.fields, boundReason(reason))),
    };
    try {
      await this.#handler(delivery);
    } catch {
      // The handler contract says it never rejects; a broken one leaves the delivery unsettled, handled below.
    }
    while (state.settling) await state.settling.catch(() => undefined);
    this.#running -= 1;
    item.active = false;
    if (state.settled && state.inPlaceDelayMs === undefined) this.#release(item);
    else if (state.settled) this.#hold(item, state.inPlaceDelayMs!, { attempt: item.attempt + 1, redelivered: false });
    else {
      // Unsettled (every settle failed, or none was made): it must come back, flagged
      // redelivered, keeping its key; after 1 s, doubling to 30 s while it keeps coming back.
      item.unsettledRuns += 1;
      this.#hold(item, Math.min(1_000 * 2 ** (item.unsettledRuns - 1), 30_000), { attempt: item.attempt, redelivered: true });
    }
    if (this.#running === 0) this.#idle?.();
    this.#pump();
    this.#wake?.();
  }

  #release(item: InHand): void {
    this.#inHand.delete(entryKey(item.stream, item.id));
    if (item.orderKey !== undefined) this.#busyKeys.delete(item.orderKey);
  }

  /** Runs `item` again after `delayMs`, in front of its key; it stays in hand (heartbeated) meanwhile. */
  #hold(item: InHand, delayMs: number, next: { attempt: number; redelivered: boolean }): void {
    if (this.#stop.signal.aborted) return;
    // An ordered instance that lost its lease keeps nothing back: the entry is pending for the next holder.
    if (this.#endpoint.ordered && !this.#holder) return this.#release(item);
    const timer = setTimeout(() => {
      this.#holds.delete(timer);
      if (this.#stop.signal.aborted || !this.#inHand.has(entryKey(item.stream, item.id))) return;
      item.attempt = next.attempt;
      item.redelivered = next.redelivered;
      this.#buffer.unshift(item);
      this.#pump();
    }, delayMs);
    this.#holds.add(timer);
  }

  // ---- settles (atomic scripts, see stream-scripts.ts) ----

  async #ack(item: InHand): Promise<void> {
    const client = await this.#connections.commands();
    await client.eval(ACK_SCRIPT, 1, item.stream, this.#endpoint.consumer, item.id, item.stream === this.#retryStream ? '1' : '0');
  }

  async #retry(item: InHand, delayMs: number): Promise<void> {
    const client = await this.#connections.commands();
    // The envelope text is carried as it was read, byte for byte.
    const envelopeText = fieldMap(item.fields).get(ENVELOPE_FIELD)!;
    const member = `${randomUUID()}|${item.attempt + 1}|${item.decoded.replayed ? '1' : '0'}|${envelopeText}`;
    await client.eval(RETRY_SCRIPT, 2, item.stream, this.#keys.delayed(this.#endpoint.consumer), this.#endpoint.consumer, item.id, String(Math.max(0, Math.round(delayMs))), member, item.stream === this.#retryStream ? '1' : '0');
  }

  async #writeDead(stream: string, id: string, fields: readonly string[], reason: DeadLetterReason): Promise<void> {
    const client = await this.#connections.commands();
    await client.eval(DEAD_SCRIPT, 2, stream, this.#keys.dead(this.#endpoint.consumer), this.#endpoint.consumer, id, stream === this.#retryStream ? '1' : '0', ...deadFields(fields, reason));
  }

  // ---- upkeep ----

  async #dueLoop(): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      let waitMs = this.#settings.delayPollMs;
      try {
        const client = await this.#connections.commands(signal);
        const [moved] = (await client.eval(MOVE_DUE_SCRIPT, 2, this.#keys.delayed(this.#endpoint.consumer), this.#retryStream, String(DUE_BATCH))) as [number, number];
        if (moved >= DUE_BATCH) waitMs = 0;
      } catch {
        waitMs = Math.max(waitMs, 500);
      }
      await abortableSleep(waitMs, signal);
    }
  }

  async #heartbeatLoop(): Promise<void> {
    const signal = this.#finish.signal;
    while (!signal.aborted) {
      await abortableSleep(this.#settings.claimIdleMs / 3, signal);
      if (signal.aborted || this.#inHand.size === 0) continue;
      try {
        await this.#touch(0);
      } catch {
        // A stopped subscription whose connection is gone (a killed process) keeps nothing running.
        if (this.#stop.signal.aborted) return;
      }
    }
  }

  /** XCLAIM JUSTID on everything in hand: resets idle time (or sets it to `idleMs`, to give entries back) without counting a delivery. */
  async #touch(idleMs: number): Promise<void> {
    const byStream = new Map<string, string[]>();
    for (const item of this.#inHand.values()) byStream.set(item.stream, [...(byStream.get(item.stream) ?? []), item.id]);
    const client = await this.#connections.commands();
    for (const [stream, ids] of byStream) {
      const idle = idleMs > 0 ? ['IDLE', String(idleMs)] : [];
      await client.call('XCLAIM', stream, this.#endpoint.consumer, this.#name, '0', ...ids, ...idle, 'JUSTID');
    }
  }

  async #leaseLoop(): Promise<void> {
    const signal = this.#finish.signal;
    const lease = this.#keys.lease(this.#endpoint.consumer);
    while (!signal.aborted) {
      try {
        const client = await this.#connections.commands();
        const held = Number(await client.eval(LEASE_SCRIPT, 1, lease, this.#token, String(this.#settings.leaseMs))) === 1;
        if (held) {
          this.#renewedAt = Date.now();
          if (!this.#holder && !this.#stop.signal.aborted) {
            this.#holder = true;
            // Everything the group left pending first, in stream order, before anything new.
            await this.#claim(Number.MAX_SAFE_INTEGER, 0);
            this.#wake?.();
          }
          this.#pump();
        } else if (this.#holder) this.#lose();
      } catch {
        if (this.#stop.signal.aborted) return;
        if (this.#holder && Date.now() - this.#renewedAt > this.#settings.leaseMs) this.#lose();
      }
      await abortableSleep(this.#holder ? this.#settings.leaseMs / 3 : this.#settings.leaseMs / 4, signal);
    }
  }

  /** The lease went to another instance: what was read and not started stays pending for it. */
  #lose(): void {
    this.#holder = false;
    for (const item of this.#buffer.splice(0)) this.#release(item);
    for (const timer of this.#holds) clearTimeout(timer);
    this.#holds.clear();
    for (const item of [...this.#inHand.values()]) if (!item.active) this.#release(item);
  }

  /** On close: entries read and not settled become claimable at once; the lease is released; the consumer name is forgotten when it holds nothing. */
  async #giveBack(): Promise<void> {
    const client = await this.#connections.commands();
    if (this.#inHand.size > 0) await this.#touch(this.#settings.claimIdleMs * 10);
    this.#inHand.clear();
    if (this.#endpoint.ordered) await client.eval(RELEASE_SCRIPT, 1, this.#keys.lease(this.#endpoint.consumer), this.#token);
    for (const stream of this.#streams) await client.eval(FORGET_CONSUMER_SCRIPT, 1, stream, this.#endpoint.consumer, this.#name).catch(() => undefined);
  }
}
