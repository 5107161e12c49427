import type { ChildProcess } from 'node:child_process';
import {
  ClosedError,
  CourierError,
  InMemoryBroker,
  TransportError,
  type CourierErrorCode,
  type DeadLetterReason,
  type Delivery,
  type DeliveryHandler,
  type Endpoint,
  type Envelope,
  type PublishResult,
  type Subscription,
  type Transport,
  type TransportCapabilities,
} from '@courier/core';
import type { TransportFixture } from '../fixtures.js';

// An in-memory broker that outlives the worker processes using it: it lives in the test
// process, and workers reach it over their IPC channel. When a worker is SIGKILLed its
// channel closes and the broker treats that as a dropped connection (unsettled
// deliveries go back to the queue), exactly as a real broker would. This lets the
// process-level scenarios prove a store without a real broker.

type ToHost =
  | { readonly courier: 'publish'; readonly id: number; readonly envelopes: readonly Envelope[] }
  | { readonly courier: 'subscribe'; readonly id: number; readonly subscription: number; readonly endpoint: Endpoint }
  | { readonly courier: 'unsubscribe'; readonly id: number; readonly subscription: number }
  | {
      readonly courier: 'settle';
      readonly id: number;
      readonly delivery: number;
      readonly action: 'ack' | 'retry' | 'dead-letter';
      readonly delayMs?: number;
      readonly reason?: DeadLetterReason;
    };

type ToWorker =
  | { readonly courier: 'reply'; readonly id: number; readonly value?: unknown; readonly error?: WireError }
  | { readonly courier: 'deliver'; readonly subscription: number; readonly delivery: number; readonly envelope: Envelope; readonly attempt: number; readonly redelivered: boolean; readonly replayed: boolean };

interface WireError {
  readonly code: string;
  readonly message: string;
  readonly retriable: boolean;
}

const toWire = (error: unknown): WireError =>
  error instanceof CourierError
    ? { code: error.code, message: error.message, retriable: error.retriable }
    : { code: 'TRANSPORT', message: error instanceof Error ? error.message : String(error), retriable: true };

const fromWire = (error: WireError): CourierError =>
  new TransportError(error.message, { code: error.code as CourierErrorCode, retriable: error.retriable });

/**
 * Serves `broker` to one worker process over its IPC channel (spawn it with an `'ipc'`
 * stdio entry). Each worker gets its own connection, killed when the channel closes.
 */
export function hostBrokerFor(broker: InMemoryBroker, child: ChildProcess): void {
  const connection = broker.connect();
  const subscriptions = new Map<number, Subscription>();
  const deliveries = new Map<number, Delivery & { done: () => void }>();
  let nextDelivery = 1;
  let alive = true;
  const send = (message: ToWorker) => {
    // A SIGKILLed worker's channel reads as connected until this process runs its
    // 'disconnect' event, so a send can still fail with EPIPE. The callback takes that
    // failure (without one Node emits it as an 'error' event, uncaught here); the worker is
    // gone, so it is treated as the drop it is.
    if (alive && child.connected) child.send(message, (error) => {
      if (error) drop();
    });
  };
  const reply = (id: number, work: () => Promise<unknown>) => {
    work().then(
      (value) => send({ courier: 'reply', id, value }),
      (error: unknown) => send({ courier: 'reply', id, error: toWire(error) }),
    );
  };
  child.on('message', (raw: unknown) => {
    const message = raw as ToHost;
    if (!message || typeof message !== 'object' || !('courier' in message)) return;
    switch (message.courier) {
      case 'publish':
        reply(message.id, async () => {
          const results = await connection.publish(message.envelopes);
          return results.map((result) => (result.ok ? result : { messageId: result.messageId, ok: false, error: toWire(result.error) }));
        });
        return;
      case 'subscribe':
        reply(message.id, async () => {
          const id = message.subscription;
          const handler: DeliveryHandler = (delivery) =>
            new Promise<void>((resolve) => {
              const deliveryId = nextDelivery++;
              deliveries.set(deliveryId, Object.assign(delivery, { done: resolve }));
              send({ courier: 'deliver', subscription: id, delivery: deliveryId, envelope: delivery.envelope, attempt: delivery.attempt, redelivered: delivery.redelivered, replayed: delivery.replayed === true });
            });
          subscriptions.set(id, await connection.subscribe(message.endpoint, handler));
        });
        return;
      case 'unsubscribe':
        reply(message.id, async () => {
          await subscriptions.get(message.subscription)?.close();
          subscriptions.delete(message.subscription);
        });
        return;
      case 'settle':
        reply(message.id, async () => {
          const delivery = deliveries.get(message.delivery);
          if (!delivery) return;
          deliveries.delete(message.delivery);
          try {
            if (message.action === 'ack') await delivery.ack();
            else if (message.action === 'retry') await delivery.retry(message.delayMs ?? 0, message.reason!);
            else await delivery.deadLetter(message.reason!);
          } finally {
            delivery.done();
          }
        });
        return;
    }
  });
  function drop(): void {
    if (!alive) return;
    alive = false;
    // Like a crashed consumer, the dead worker never finishes its handlers: the broker
    // takes their deliveries back when the connection is killed.
    broker.kill(connection);
    deliveries.clear();
  }
  child.on('disconnect', drop);
  child.on('exit', drop);
}

/** The worker's side: a Transport whose broker is in the parent test process. */
export class IpcBrokerTransport implements Transport {
  readonly capabilities: TransportCapabilities;
  #nextId = 1;
  #nextSubscription = 1;
  #closed = false;
  readonly #pending = new Map<number, { resolve: (value: unknown) => void; reject: (error: unknown) => void }>();
  readonly #handlers = new Map<number, DeliveryHandler>();
  readonly #listener = (raw: unknown) => this.#receive(raw as ToWorker);

  constructor(capabilities: TransportCapabilities) {
    if (!process.send) throw new Error('IpcBrokerTransport runs only in a worker process started with an IPC channel');
    this.capabilities = capabilities;
    process.on('message', this.#listener);
  }

  async publish(messages: readonly Envelope[]): Promise<readonly PublishResult[]> {
    const results = (await this.#call({ courier: 'publish', envelopes: messages })) as (PublishResult | { messageId: string; ok: false; error: WireError })[];
    return results.map((result) => (result.ok ? result : { messageId: result.messageId, ok: false as const, error: fromWire(result.error as WireError) }));
  }

  async subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    // The handler is in place before the request leaves: the host may deliver right after
    // its reply, and both can arrive in one read, before this function resumes.
    const id = this.#nextSubscription++;
    this.#handlers.set(id, handler);
    try {
      await this.#call({ courier: 'subscribe', subscription: id, endpoint });
    } catch (error) {
      this.#handlers.delete(id);
      throw error;
    }
    return {
      close: async () => {
        if (!this.#handlers.delete(id)) return;
        await this.#call({ courier: 'unsubscribe', subscription: id }).catch(() => undefined);
      },
    };
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    process.off('message', this.#listener);
    for (const pending of this.#pending.values()) pending.reject(new ClosedError('ipc broker transport'));
    this.#pending.clear();
  }

  #call(message: Record<string, unknown>): Promise<unknown> {
    if (this.#closed) return Promise.reject(new ClosedError('ipc broker transport'));
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      process.send!({ ...message, id });
    });
  }

  #receive(message: ToWorker): void {
    if (!message || typeof message !== 'object' || !('courier' in message)) return;
    if (message.courier === 'reply') {
      const pending = this.#pending.get(message.id);
      if (!pending) return;
      this.#pending.delete(message.id);
      if (message.error) pending.reject(fromWire(message.error));
      else pending.resolve(message.value);
      return;
    }
    const handler = this.#handlers.get(message.subscription);
    if (!handler) return;
    let settled = false;
    const settle = async (action: 'ack' | 'retry' | 'dead-letter', extra: { delayMs?: number; reason?: DeadLetterReason } = {}) => {
      if (settled) return;
      settled = true;
      await this.#call({ courier: 'settle', delivery: message.delivery, action, ...extra });
    };
    const delivery: Delivery = {
      envelope: message.envelope,
      attempt: message.attempt,
      redelivered: message.redelivered,
      replayed: message.replayed,
      ack: () => settle('ack'),
      retry: (delayMs, reason) => settle('retry', { delayMs, reason }),
      deadLetter: (reason) => settle('dead-letter', { reason }),
    };
    void handler(delivery).catch(() => undefined);
  }
}

/** True in a worker process started by the process-level scenarios (it has an IPC channel to the test). */
export function isScenarioWorker(): boolean {
  return process.env['COURIER_CONFORMANCE_WORKER'] !== undefined && typeof process.send === 'function';
}

/**
 * A transport fixture for process-level scenarios without a real broker: in the test
 * process it owns an {@link InMemoryBroker} and serves it to each worker it hosts; in a
 * worker it is an {@link IpcBrokerTransport} to that broker.
 */
export async function createIpcBrokerTransportFixture(): Promise<TransportFixture> {
  if (isScenarioWorker()) {
    const capabilities = JSON.parse(process.env['COURIER_IPC_BROKER_CAPABILITIES'] ?? 'null') as TransportCapabilities | null;
    if (!capabilities) throw new Error('the worker was started without the IPC broker capabilities');
    const transport = new IpcBrokerTransport(capabilities);
    return {
      transport,
      connect: async () => new IpcBrokerTransport(capabilities),
      kill: async () => {
        throw new Error('a worker cannot kill connections; the test process does');
      },
      close: () => transport.close(),
    };
  }
  const broker = new InMemoryBroker();
  return {
    transport: broker.connect(),
    connect: async () => broker.connect(),
    kill: async (transport) => broker.kill(transport),
    outage: { begin: async () => broker.setAvailable(false), end: async () => broker.setAvailable(true) },
    hostWorker: (child) => hostBrokerFor(broker, child),
    workerEnv: () => ({ COURIER_IPC_BROKER_CAPABILITIES: JSON.stringify(broker.capabilities) }),
    close: () => broker.close(),
  };
}
