import type { Envelope } from '../envelope.js';
import type {
  DeliveryHandler,
  Endpoint,
  PublishResult,
  Subscription,
  Transport,
  TransportCapabilities,
  TransportDeadLetters,
} from '../transport.js';
import type { InMemoryConnection } from './in-memory-broker.js';

/**
 * One connection to an {@link InMemoryBroker}, implementing {@link Transport}. Obtain it
 * with `broker.connect()`.
 *
 * Guarantees: `publish` answers with one result per message in input order (a rejected
 * or oversized message never fails its neighbours) and rejects with a retriable
 * `TransportError` only during a simulated broker outage; deliveries are manually
 * settled and redelivered when left unsettled; `close()` is idempotent and waits for
 * handlers in flight; after `kill()` (a crash) every call rejects and nothing it held is
 * lost.
 */
export class InMemoryTransport implements Transport {
  readonly #connection: InMemoryConnection;

  /** Use {@link InMemoryBroker.connect}. */
  constructor(connection: InMemoryConnection) {
    this.#connection = connection;
  }

  /** Ordering by key, ordered pipelining, native delay and dead letter; `maxMessageBytes` from the broker's config. */
  get capabilities(): TransportCapabilities {
    return this.#connection.capabilities;
  }

  /** Operator access to the broker's dead letters, per consumer group. */
  get deadLetters(): TransportDeadLetters {
    return this.#connection.deadLetters;
  }

  /** `open` until closed or killed. */
  get state(): InMemoryConnection['state'] {
    return this.#connection.state;
  }

  /** Publishes `messages`, resolving with one result per message in input order. */
  publish(messages: readonly Envelope[], options: { signal?: AbortSignal } = {}): Promise<readonly PublishResult[]> {
    return this.#connection.publish(messages, options.signal);
  }

  /** Subscribes `handler` to `endpoint`'s consumer group; it must settle each delivery. */
  subscribe(endpoint: Endpoint, handler: DeliveryHandler): Promise<Subscription> {
    return this.#connection.subscribe(endpoint, handler);
  }

  /** Drops the connection as a crash would: its unsettled deliveries are redelivered elsewhere. */
  kill(): void {
    this.#connection.kill();
  }

  /** Closes every subscription of this connection, waiting for handlers in flight. Idempotent. */
  close(): Promise<void> {
    return this.#connection.close();
  }

  /** Same as {@link InMemoryTransport.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
