import { setTimeout as sleep } from 'node:timers/promises';
import {
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  createBus,
  type Bus,
  type BusConfig,
  type CompleteAndClaimOptions,
  type CompletedAndClaimed,
  type CompleteOptions,
  type Delivery,
  type InMemoryBrokerConfig,
  type InMemoryTransaction,
  type OutboxFailure,
  type OutboxLease,
  type AppendResult,
  type OutboxStore,
  type PendingCompletion,
  type Transport,
} from '@courier/core';

/**
 * Calls `check` until it returns without throwing and returns its value; after
 * `timeoutMs` rethrows its last error. The one way these tests wait.
 */
export async function eventually<T>(check: () => T | Promise<T>, timeoutMs = 5_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() >= deadline) throw error;
    }
    await sleep(5);
  }
}

/** An outbox store that records every `fail` call, to observe the relay's retry decisions. */
export class SpyOutboxStore extends InMemoryOutboxStore {
  readonly failures: OutboxFailure[][] = [];
  /** How often the relay called `complete` and `completeAndClaim`. */
  readonly calls = { complete: 0, completeAndClaim: 0 };

  override async complete(lease: OutboxLease, sequences: readonly bigint[], options?: CompleteOptions): Promise<number> {
    this.calls.complete += 1;
    return super.complete(lease, sequences, options);
  }

  override async completeAndClaim(done: PendingCompletion, options: CompleteAndClaimOptions): Promise<CompletedAndClaimed> {
    this.calls.completeAndClaim += 1;
    return super.completeAndClaim(done, options);
  }

  override async fail(lease: OutboxLease, failures: readonly OutboxFailure[], options?: { signal?: AbortSignal }): Promise<number> {
    this.failures.push([...failures]);
    return super.fail(lease, failures, options);
  }
}

/** How a delivery was settled, as seen by a {@link spyTransport}. */
export interface Settlement {
  readonly messageId: string;
  readonly consumer: string;
  readonly how: 'ack' | 'retry' | 'deadLetter';
  readonly attempt: number;
}

/**
 * Wraps `inner` so that every settle of every delivery is recorded; `capabilities` may be
 * overridden, and `redelivered` may report deliveries as broker redeliveries (a process
 * that died with them in hand) without killing one.
 */
export function spyTransport(
  inner: Transport,
  capabilities: Partial<Transport['capabilities']> = {},
  redelivered: (delivery: Delivery) => boolean = (delivery) => delivery.redelivered,
): Transport & { readonly settlements: Settlement[] } {
  const settlements: Settlement[] = [];
  return {
    settlements,
    capabilities: { ...inner.capabilities, ...capabilities },
    ...(inner.deadLetters ? { deadLetters: inner.deadLetters } : {}),
    publish: (messages, options) => inner.publish(messages, options),
    subscribe: (endpoint, handler) =>
      inner.subscribe(endpoint, (delivery) => {
        const note = (how: Settlement['how']) => settlements.push({ messageId: delivery.envelope.messageId, consumer: endpoint.consumer, how, attempt: delivery.attempt });
        const spied: Delivery = {
          envelope: delivery.envelope,
          attempt: delivery.attempt,
          redelivered: redelivered(delivery),
          ...(delivery.replayed !== undefined ? { replayed: delivery.replayed } : {}),
          ack: async () => {
            await delivery.ack();
            note('ack');
          },
          retry: async (delayMs, reason) => {
            await delivery.retry(delayMs, reason);
            note('retry');
          },
          deadLetter: async (reason) => {
            await delivery.deadLetter(reason);
            note('deadLetter');
          },
        };
        return handler(spied);
      }),
    close: () => inner.close(),
  };
}

/** Options of {@link harness}. */
export interface HarnessOptions {
  readonly broker?: InMemoryBrokerConfig;
  /** Milliseconds added to the database clock (advance it to make delayed rows due). */
  readonly clock?: { offset: number };
  readonly bus?: Partial<BusConfig<InMemoryTransaction, void>>;
  /** Wraps the transport the bus gets. */
  readonly transport?: (transport: Transport) => Transport;
  /** `false`: the buses get the outbox without `renew` (a store that cannot renew leases). */
  readonly renew?: false;
}

/** A database, stores, broker and bus wired together, with fast retries; disposed with `await using`. */
export interface Harness extends AsyncDisposable {
  readonly db: InMemoryDatabase;
  readonly outbox: SpyOutboxStore;
  readonly inbox: InMemoryInboxStore;
  readonly broker: InMemoryBroker;
  /** The broker connection the bus uses (before any wrapping). */
  readonly connection: ReturnType<InMemoryBroker['connect']>;
  readonly bus: Bus<InMemoryTransaction>;
  /** Runs `work` in a unit of work and commits it. */
  commit(work: (tx: InMemoryTransaction) => void | Promise<void>): Promise<void>;
  /** Another bus over the same stores and broker (a second process). */
  another(config?: Partial<BusConfig<InMemoryTransaction, void>>): Bus<InMemoryTransaction>;
}

/** Fast retry and pause settings so failure paths finish in milliseconds. */
export const FAST = {
  retry: { initialDelayMs: 5, maxDelayMs: 20, jitter: 0 },
  relay: { pollIntervalMs: 20, retry: { initialDelayMs: 5, maxDelayMs: 20, jitter: 0 }, pause: { initialDelayMs: 10, maxDelayMs: 40 } },
} as const;

export function harness(options: HarnessOptions = {}): Harness {
  const clock = options.clock;
  const db = new InMemoryDatabase(clock ? { now: () => Date.now() + clock.offset } : {});
  const outbox = new SpyOutboxStore({ database: db });
  const inbox = new InMemoryInboxStore({ database: db });
  const broker = new InMemoryBroker(options.broker);
  const buses: Bus<InMemoryTransaction>[] = [];
  const make = (config: Partial<BusConfig<InMemoryTransaction, void>> = {}) => {
    const connection = broker.connect();
    const bus = createBus<InMemoryTransaction>({
      outbox: options.renew === false ? withoutRenew<InMemoryTransaction, void>(outbox) : outbox,
      inbox,
      transport: options.transport ? options.transport(connection) : connection,
      retry: FAST.retry,
      ...config,
      relay: { ...FAST.relay, ...config.relay },
    });
    buses.push(bus);
    return { bus, connection };
  };
  const first = make(options.bus);
  return {
    db,
    outbox,
    inbox,
    broker,
    connection: first.connection,
    bus: first.bus,
    commit: (work) => db.transaction(async (tx) => work(tx)),
    another: (config) => make(config).bus,
    async [Symbol.asyncDispose]() {
      await Promise.all(buses.map((bus) => bus.stop({ timeoutMs: 1_000 })));
      await broker.close();
    },
  };
}

/** `store` as a store that cannot renew leases: every member but `renew`, bound to it. */
export function withoutRenew<Tx, A extends AppendResult>(store: OutboxStore<Tx, A>): OutboxStore<Tx, A> {
  return new Proxy(store, {
    get(target, property) {
      if (property === 'renew') return undefined;
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
