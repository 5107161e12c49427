import { ENVELOPE_FIELDS, decodeEnvelope, payloadBytes, type Envelope } from '../envelope.js';
import { ClosedError, ConfigError, CourierError, TransportError } from '../errors.js';
import type {
  DeadLetter,
  DeadLetterReason,
  Delivery,
  DeliveryHandler,
  Endpoint,
  PublishResult,
  Subscription,
  Transport,
  TransportCapabilities,
  TransportDeadLetters,
} from '../transport.js';
import { InMemoryTransport } from './in-memory-transport.js';

/** Arguments of {@link InMemoryBroker}. */
export interface InMemoryBrokerConfig {
  /** Largest payload accepted, in UTF-8 bytes. Default 1 MiB. */
  readonly maxMessageBytes?: number;
  /** Name used in error messages. Default `'in-memory'`. */
  readonly name?: string;
}

/** Decides whether the broker rejects one published message (fault injection). */
export type PublishRejection = (envelope: Envelope) => boolean;

/** A kind of settle (see {@link InMemoryBroker.failSettles}). */
export type SettleKind = 'ack' | 'retry' | 'deadLetter';

/**
 * One connection's view of an {@link InMemoryBroker}; what an {@link InMemoryTransport}
 * delegates to. Obtain it through {@link InMemoryBroker.connect}.
 */
export interface InMemoryConnection {
  readonly id: number;
  readonly capabilities: TransportCapabilities;
  readonly state: 'open' | 'closing' | 'closed' | 'killed';
  readonly deadLetters: TransportDeadLetters;
  publish(messages: readonly Envelope[], signal?: AbortSignal): Promise<readonly PublishResult[]>;
  subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription>;
  close(): Promise<void>;
  kill(): void;
}

interface Entry {
  readonly envelope: Envelope;
  /** Put back by `deadLetters.replay`. */
  readonly replayed?: boolean;
  attempt: number;
  /** Handed out before and never settled (a killed connection, a handler that did not settle). */
  redelivered?: boolean;
  availableAt: number;
  holder: Consumer | null;
}

interface Group {
  readonly name: string;
  readonly topics: Set<string>;
  readonly queue: Entry[];
  readonly consumers: Consumer[];
  readonly dead: Map<string, DeadLetter>;
  roundRobin: number;
  dispatchScheduled: boolean;
  timer: ReturnType<typeof setTimeout> | null;
}

/**
 * An in-process message broker for tests and demos; {@link InMemoryBroker.connect}
 * opens {@link InMemoryTransport} connections to it.
 *
 * Guarantees: a topic fans out to every consumer group subscribed to it; within a group
 * deliveries are shared among its subscriptions on every connection (competing
 * consumers); ordered subscriptions receive each (topic, key) in publish order, one
 * delivery at a time, the next only after the previous is settled; a delivery left
 * unsettled when its connection is killed or its handler returns goes back to its place
 * in the queue; messages are copied through their JSON wire form, so nothing is shared
 * between publisher and consumer. Messages published to a topic no group has
 * subscribed to yet wait for the first group that does (a relay started before its
 * consumers loses nothing).
 */
export class InMemoryBroker {
  /** What every connection of this broker declares. */
  readonly capabilities: TransportCapabilities;
  readonly #core: BrokerCore;

  constructor(config: InMemoryBrokerConfig = {}) {
    const maxMessageBytes = config.maxMessageBytes ?? 1024 * 1024;
    if (!Number.isSafeInteger(maxMessageBytes) || maxMessageBytes < 1) {
      throw new ConfigError(`'maxMessageBytes' must be a positive integer, got ${String(maxMessageBytes)}`);
    }
    this.capabilities = Object.freeze({
      orderingByKey: true,
      orderedPipelining: true,
      nativeDelay: true,
      nativeDeadLetter: true,
      maxMessageBytes,
    });
    this.#core = new BrokerCore(config.name ?? 'in-memory', this.capabilities);
  }

  /** Opens a new connection, as another process would. Throws `ClosedError` once the broker is closed. */
  connect(): InMemoryTransport {
    return new InMemoryTransport(this.#core.connect());
  }

  /**
   * Drops `transport` as a crash would: no settle, no graceful close. Its unsettled
   * deliveries return to the front of their queues, in order, for the group's other
   * subscriptions; later calls on it reject.
   */
  kill(transport: Transport): void {
    if (!(transport instanceof InMemoryTransport)) {
      throw new ConfigError(`'transport' is not an InMemoryTransport of broker '${this.#core.name}'`);
    }
    transport.kill();
  }

  /** False while an outage is simulated. */
  get available(): boolean {
    return this.#core.available;
  }

  /**
   * Simulates a broker outage (`false`) or its end (`true`): while unavailable, publish
   * and subscribe reject with a retriable `TransportError` and nothing is delivered.
   */
  setAvailable(available: boolean): void {
    this.#core.setAvailable(available);
  }

  /**
   * Makes the broker reject (nack) every later published message for which `predicate`
   * is true: its result is `ok: false` with a `TransportError` code `PUBLISH_REJECTED`,
   * its neighbours are unaffected. Returns a function that removes the rule.
   */
  failPublish(predicate: PublishRejection): () => void {
    return this.#core.failPublish(predicate);
  }

  /**
   * Makes the next `count` (default 1) settles of `kind` fail, as a broker failure would:
   * the delivery's `ack`, `retry` or `deadLetter` rejects with a retriable `TransportError`
   * and the delivery stays unsettled — a later settle of it is taken, and one its handler
   * leaves unsettled goes back to its place in the queue (fault injection for the kit's
   * settle-failure cases).
   */
  failSettles(kind: SettleKind, count = 1): void {
    this.#core.failSettles(kind, count);
  }

  /** Closes every connection (waiting for handlers in flight) and stops timers. Idempotent. */
  close(): Promise<void> {
    return this.#core.close();
  }

  /** Same as {@link InMemoryBroker.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The broker's state and dispatch loop, shared by its connections. */
class BrokerCore {
  readonly name: string;
  readonly capabilities: TransportCapabilities;
  readonly #groups = new Map<string, Group>();
  /** Messages of topics no group is bound to yet. */
  readonly #unbound = new Map<string, Envelope[]>();
  readonly #connections = new Set<Connection>();
  readonly #rejections = new Set<PublishRejection>();
  #available = true;
  #nextConnectionId = 1;
  #nextDeadLetterId = 1;
  #closing: Promise<void> | null = null;

  constructor(name: string, capabilities: TransportCapabilities) {
    this.name = name;
    this.capabilities = capabilities;
  }

  connect(): Connection {
    if (this.#closing) throw new ClosedError(`broker '${this.name}'`);
    const connection = new Connection(this.#nextConnectionId, this);
    this.#nextConnectionId += 1;
    this.#connections.add(connection);
    return connection;
  }

  get available(): boolean {
    return this.#available;
  }

  setAvailable(available: boolean): void {
    this.#available = available;
    if (available) for (const group of this.#groups.values()) this.scheduleDispatch(group);
  }

  failPublish(predicate: PublishRejection): () => void {
    this.#rejections.add(predicate);
    return () => {
      this.#rejections.delete(predicate);
    };
  }

  readonly #settleFaults = new Map<SettleKind, number>();

  failSettles(kind: SettleKind, count: number): void {
    this.#settleFaults.set(kind, (this.#settleFaults.get(kind) ?? 0) + count);
  }

  /** Whether this settle of `kind` is to fail (and counts it off). */
  takeSettleFault(kind: SettleKind): boolean {
    const left = this.#settleFaults.get(kind) ?? 0;
    if (left <= 0) return false;
    this.#settleFaults.set(kind, left - 1);
    return true;
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.all([...this.#connections].map((connection) => connection.close()));
      for (const group of this.#groups.values()) {
        if (group.timer) clearTimeout(group.timer);
        group.timer = null;
      }
    })();
    return this.#closing;
  }

  assertAvailable(operation: string): void {
    if (!this.#available) {
      throw new TransportError(`broker '${this.name}' is unavailable; '${operation}' failed (retry after it is back)`, { retriable: true });
    }
  }

  publishOne(envelope: Envelope): PublishResult {
    let copy: Envelope;
    try {
      const wire = JSON.stringify(Object.fromEntries(ENVELOPE_FIELDS.map((field) => [field, envelope[field]])));
      copy = decodeEnvelope(JSON.parse(wire));
    } catch (error) {
      const courierError = error instanceof CourierError ? error : new TransportError('message could not be encoded', { cause: error, retriable: false });
      return { messageId: String(envelope?.messageId), ok: false, error: courierError };
    }
    const bytes = payloadBytes(copy);
    if (bytes > this.capabilities.maxMessageBytes) {
      const message = `message '${copy.messageId}' has ${bytes} payload bytes; broker '${this.name}' accepts at most ${this.capabilities.maxMessageBytes}`;
      return { messageId: copy.messageId, ok: false, error: new TransportError(message, { code: 'PAYLOAD_TOO_LARGE', retriable: false }) };
    }
    for (const rejects of this.#rejections) {
      if (rejects(copy)) {
        const message = `broker '${this.name}' rejected message '${copy.messageId}' (injected fault)`;
        return { messageId: copy.messageId, ok: false, error: new TransportError(message, { code: 'PUBLISH_REJECTED', retriable: true }) };
      }
    }
    let bound = false;
    for (const group of this.#groups.values()) {
      if (!group.topics.has(copy.topic)) continue;
      bound = true;
      group.queue.push({ envelope: copy, attempt: 1, availableAt: 0, holder: null });
      this.scheduleDispatch(group);
    }
    if (!bound) {
      const waiting = this.#unbound.get(copy.topic) ?? [];
      waiting.push(copy);
      this.#unbound.set(copy.topic, waiting);
    }
    return { messageId: copy.messageId, ok: true };
  }

  bind(endpoint: Endpoint, consumer: Consumer): Group {
    let group = this.#groups.get(endpoint.consumer);
    if (!group) {
      group = {
        name: endpoint.consumer,
        topics: new Set(),
        queue: [],
        consumers: [],
        dead: new Map(),
        roundRobin: 0,
        dispatchScheduled: false,
        timer: null,
      };
      this.#groups.set(endpoint.consumer, group);
    }
    for (const topic of endpoint.topics) {
      if (group.topics.has(topic)) continue;
      group.topics.add(topic);
      const waiting = this.#unbound.get(topic);
      if (waiting) {
        // Every group binding in this same call shares the backlog; later groups start empty.
        this.#unbound.delete(topic);
        for (const envelope of waiting) group.queue.push({ envelope, attempt: 1, availableAt: 0, holder: null });
      }
    }
    group.consumers.push(consumer);
    this.scheduleDispatch(group);
    return group;
  }

  group(name: string): Group | undefined {
    return this.#groups.get(name);
  }

  deadLetter(group: Group, entry: Entry, reason: DeadLetterReason): void {
    const id = `${group.name}:${this.#nextDeadLetterId}`;
    this.#nextDeadLetterId += 1;
    group.dead.set(id, {
      id,
      consumer: group.name,
      envelope: entry.envelope,
      reason: { code: String(reason.code), message: String(reason.message) },
      attempt: entry.attempt,
      deadAt: new Date(),
    });
  }

  forget(connection: Connection): void {
    this.#connections.delete(connection);
  }

  scheduleDispatch(group: Group): void {
    if (group.dispatchScheduled) return;
    group.dispatchScheduled = true;
    // A macrotask hop: a handler that keeps failing without settling cannot starve the event loop.
    setImmediate(() => {
      group.dispatchScheduled = false;
      this.#dispatch(group);
    });
  }

  #dispatch(group: Group): void {
    if (!this.#available || group.consumers.length === 0) return;
    const now = Date.now();
    const hasRoom = (consumer: Consumer): boolean => consumer.active && consumer.inFlight < consumer.endpoint.concurrency;
    // (topic, key) pairs an ordered subscription may not take now: an earlier entry is
    // in flight, waiting for its retry delay, or still queued.
    const blocked = new Set<string>();
    const starts: [Consumer, Entry][] = [];
    let nextAt = Number.POSITIVE_INFINITY;
    for (const entry of group.queue) {
      if (!group.consumers.some(hasRoom)) break;
      const key = entry.envelope.key === null ? null : `${entry.envelope.topic}\u0000${entry.envelope.key}`;
      if (entry.holder !== null) {
        if (key !== null) blocked.add(key);
        continue;
      }
      if (entry.availableAt > now) {
        nextAt = Math.min(nextAt, entry.availableAt);
        if (key !== null) blocked.add(key);
        continue;
      }
      const candidates = group.consumers.filter(
        (consumer) =>
          hasRoom(consumer) &&
          consumer.endpoint.topics.includes(entry.envelope.topic) &&
          (!consumer.endpoint.ordered || key === null || !blocked.has(key)),
      );
      if (key !== null) blocked.add(key);
      if (candidates.length === 0) continue;
      const consumer = candidates[group.roundRobin % candidates.length]!;
      group.roundRobin += 1;
      entry.holder = consumer;
      consumer.inFlight += 1;
      starts.push([consumer, entry]);
    }
    if (Number.isFinite(nextAt)) {
      if (group.timer) clearTimeout(group.timer);
      group.timer = setTimeout(() => {
        group.timer = null;
        this.scheduleDispatch(group);
      }, Math.max(0, nextAt - now));
      group.timer.unref?.();
    }
    // Handlers start after the scan: one that settles synchronously must not edit the queue mid-iteration.
    for (const [consumer, entry] of starts) consumer.start(entry);
  }
}

/** One subscription of a connection to a consumer group. */
class Consumer implements Subscription {
  readonly endpoint: Endpoint;
  readonly #broker: BrokerCore;
  readonly #connection: Connection;
  readonly #handler: DeliveryHandler;
  readonly #running = new Set<Promise<void>>();
  #group: Group | null = null;
  #closing: Promise<void> | null = null;
  active = true;
  inFlight = 0;

  constructor(broker: BrokerCore, connection: Connection, endpoint: Endpoint, handler: DeliveryHandler) {
    this.#broker = broker;
    this.#connection = connection;
    this.endpoint = { consumer: endpoint.consumer, topics: [...endpoint.topics], ordered: endpoint.ordered, concurrency: endpoint.concurrency };
    this.#handler = handler;
  }

  attach(): void {
    this.#group = this.#broker.bind(this.endpoint, this);
  }

  start(entry: Entry): void {
    const group = this.#group!;
    let settled = false;
    const settle = async (kind: SettleKind, apply: () => void): Promise<void> => {
      if (settled) return;
      if (this.#connection.state === 'killed') {
        throw new TransportError(`connection '${this.#connection.id}' of broker '${this.#broker.name}' was killed; the delivery will be redelivered`, {
          retriable: false,
        });
      }
      if (this.#broker.takeSettleFault(kind)) {
        // Not settled: a later settle is taken, and a handler that returns leaves it to come back.
        throw new TransportError(`broker '${this.#broker.name}' failed the ${kind} of '${entry.envelope.messageId}' (injected fault)`, { retriable: true });
      }
      settled = true;
      if (entry.holder !== this) return;
      apply();
      this.#broker.scheduleDispatch(group);
    };
    const remove = (): void => {
      const index = group.queue.indexOf(entry);
      if (index >= 0) group.queue.splice(index, 1);
    };
    const delivery: Delivery = {
      envelope: entry.envelope,
      attempt: entry.attempt,
      replayed: entry.replayed === true,
      redelivered: entry.redelivered === true,
      ack: () => settle('ack', remove),
      retry: (delayMs: number) =>
        settle('retry', () => {
          entry.attempt += 1;
          entry.redelivered = false;
          entry.availableAt = Date.now() + Math.max(0, Number.isFinite(delayMs) ? delayMs : 0);
          entry.holder = null;
        }),
      deadLetter: (reason: DeadLetterReason) =>
        settle('deadLetter', () => {
          remove();
          this.#broker.deadLetter(group, entry, reason);
        }),
    };
    const run = (async () => {
      try {
        await this.#handler(delivery);
      } catch {
        // The handler contract is to settle before resolving; an escaped error is treated
        // like a returned handler that did not settle: the delivery goes back below.
      } finally {
        this.inFlight -= 1;
        if (!settled && entry.holder === this) {
          entry.holder = null;
          entry.redelivered = true;
        }
        this.#broker.scheduleDispatch(group);
      }
    })();
    this.#running.add(run);
    void run.finally(() => this.#running.delete(run));
  }

  /** Stops new deliveries, waits for handlers in flight, then leaves the group. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.active = false;
      while (this.#running.size > 0) await Promise.all([...this.#running]);
      this.#detach();
    })();
    return this.#closing;
  }

  /** Abandons handlers in flight (a crash): their deliveries go back to their place in the queue. */
  kill(): void {
    this.active = false;
    const group = this.#group;
    if (!group) return;
    for (const entry of group.queue) {
      if (entry.holder !== this) continue;
      entry.holder = null;
      entry.redelivered = true;
    }
    this.#detach();
  }

  #detach(): void {
    const group = this.#group;
    if (!group) return;
    const index = group.consumers.indexOf(this);
    if (index >= 0) group.consumers.splice(index, 1);
    this.#broker.scheduleDispatch(group);
  }
}

class Connection implements InMemoryConnection {
  readonly id: number;
  readonly deadLetters: TransportDeadLetters;
  readonly #broker: BrokerCore;
  readonly #consumers = new Set<Consumer>();
  #state: InMemoryConnection['state'] = 'open';
  #closing: Promise<void> | null = null;

  constructor(id: number, broker: BrokerCore) {
    this.id = id;
    this.#broker = broker;
    this.deadLetters = {
      list: async (consumer, options = {}) => {
        this.#assertOpen('deadLetters.list');
        const dead = [...(this.#broker.group(consumer)?.dead.values() ?? [])];
        return options.limit === undefined ? dead : dead.slice(0, options.limit);
      },
      replay: async (consumer, ids) => {
        this.#assertOpen('deadLetters.replay');
        const group = this.#broker.group(consumer);
        if (!group) return 0;
        let count = 0;
        for (const id of new Set(ids)) {
          const letter = group.dead.get(id);
          if (!letter) continue;
          group.dead.delete(id);
          group.queue.push({ envelope: letter.envelope, replayed: true, attempt: 1, availableAt: 0, holder: null });
          count += 1;
        }
        if (count > 0) this.#broker.scheduleDispatch(group);
        return count;
      },
      purge: async (consumer, ids) => {
        this.#assertOpen('deadLetters.purge');
        const group = this.#broker.group(consumer);
        if (!group) return 0;
        let count = 0;
        for (const id of new Set(ids)) if (group.dead.delete(id)) count += 1;
        return count;
      },
    };
  }

  get capabilities(): TransportCapabilities {
    return this.#broker.capabilities;
  }

  get state(): InMemoryConnection['state'] {
    return this.#state;
  }

  async publish(messages: readonly Envelope[], signal?: AbortSignal): Promise<readonly PublishResult[]> {
    this.#assertOpen('publish');
    // The Transport contract's ABORTED: retriable, nothing about the messages was wrong.
    if (signal?.aborted) throw new TransportError(`'publish' was aborted`, { code: 'ABORTED', retriable: true, cause: signal.reason });
    this.#broker.assertAvailable('publish');
    // Ordered pipelining's promise: once a message of a key is refused, no later message
    // of that key in the same call is delivered (it would overtake the refused one).
    const refusedKeys = new Set<string>();
    return messages.map((envelope) => {
      const key = envelope?.key === null || envelope?.key === undefined ? null : `${envelope.topic}\u0000${envelope.key}`;
      if (key !== null && refusedKeys.has(key)) {
        return {
          messageId: String(envelope.messageId),
          ok: false as const,
          error: new TransportError(`an earlier message of key '${envelope.key}' in this call was refused`, { code: 'PUBLISH_REJECTED', retriable: true }),
        };
      }
      const result = this.#broker.publishOne(envelope);
      if (!result.ok && key !== null) refusedKeys.add(key);
      return result;
    });
  }

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    this.#assertOpen('subscribe');
    const problems: string[] = [];
    if (typeof endpoint.consumer !== 'string' || endpoint.consumer.length === 0) problems.push(`'consumer' must be a non-empty string`);
    if (!Array.isArray(endpoint.topics) || endpoint.topics.length === 0) problems.push(`'topics' must list at least one topic`);
    else for (const topic of endpoint.topics) if (typeof topic !== 'string' || topic.length === 0) problems.push(`topic ${JSON.stringify(topic)} must be a non-empty string`);
    if (!Number.isSafeInteger(endpoint.concurrency) || endpoint.concurrency < 1) problems.push(`'concurrency' must be an integer of 1 or more`);
    if (typeof handler !== 'function') problems.push(`'handler' must be a function`);
    if (problems.length > 0) throw new ConfigError(problems);
    this.#broker.assertAvailable('subscribe');
    const consumer = new Consumer(this.#broker, this, endpoint, handler);
    this.#consumers.add(consumer);
    consumer.attach();
    return {
      close: async () => {
        await consumer.close();
        this.#consumers.delete(consumer);
      },
    };
  }

  close(): Promise<void> {
    if (this.#state === 'killed') return Promise.resolve();
    this.#closing ??= (async () => {
      this.#state = 'closing';
      await Promise.all([...this.#consumers].map((consumer) => consumer.close()));
      this.#consumers.clear();
      this.#state = 'closed';
      this.#broker.forget(this);
    })();
    return this.#closing;
  }

  kill(): void {
    if (this.#state === 'killed' || this.#state === 'closed') return;
    this.#state = 'killed';
    for (const consumer of this.#consumers) consumer.kill();
    this.#consumers.clear();
    this.#broker.forget(this);
  }

  #assertOpen(operation: string): void {
    if (this.#state !== 'open') {
      throw new ClosedError(`in-memory connection ${this.id}`, {
        cause: new Error(`'${operation}' called on a connection that is ${this.#state}`),
      });
    }
  }
}
