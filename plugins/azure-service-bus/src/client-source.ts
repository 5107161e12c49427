import type { ServiceBusClient } from '@azure/service-bus';
import type { Logger } from '@courier/core';
import { noopLogger } from '@courier/core';

/** The client in use and the signal that says it has been given up (replaced or closed). */
export interface ClientGeneration {
  readonly client: ServiceBusClient;
  /** Grows by one with every replacement; 0 for the first client. */
  readonly generation: number;
  /** Aborted once this client is replaced or the source closes: operations on it stop waiting. */
  readonly signal: AbortSignal;
}

/** One client of a source and what is known of it. */
interface Entry {
  readonly client: ServiceBusClient;
  readonly generation: number;
  readonly controller: AbortController;
  readonly madeAt: number;
  /** Some operation on it got its answer (it connected). */
  answered: boolean;
}

/**
 * @internal The ServiceBusClient a transport works through, replaced after a lost connection.
 *
 * Why: after a cut connection, `@azure/service-bus` 7.9.5 re-opens links only once a link
 * that was being attached at the moment of the cut gave up, after the SDK's fixed 60 s
 * operation timeout (its connection refresh waits on that link's lock), whatever the
 * client's retryOptions say. A fresh client has none of that state, so it works as soon as
 * the broker answers again.
 *
 * Guarantees: with a factory, `lost(generation)` replaces the client of that generation at
 * most once (later reports of the same generation, or of older ones, change nothing), aborts
 * its signal so every wait on it ends, and closes it in the background; clients made here
 * are closed by `close()`. With the user's own client nothing is replaced or closed (the
 * source cannot build another one): recovery then takes as long as the SDK's.
 * When the factory throws, the current client stays.
 *
 * `close()` waits for the live client's orderly close in full, but for the close of a client
 * already given up only up to `abandonCloseAfterMs` (default 2 s): its connection is dead,
 * and the SDK can hold that close for its 60 s operation timeouts, which would hold
 * `bus.stop()` as long. Such a close is abandoned (its outcome ignored) and logged as a
 * warning, and the socket under the client's connection is destroyed: on a wedged
 * connection (open, but nothing comes back) the SDK's pending close otherwise kept its
 * socket and timers, and with them a process that had finished, alive for minutes (117 s
 * measured after `close()` resolved). The client holds nothing the broker does not release
 * by itself.
 *
 * A timeout alone does not condemn a client that has never answered: a fresh client spends
 * its first operations connecting (TCP, SASL, CBS, link attach), which on a slow link or a
 * loaded machine can outlast an operation's deadline while still making progress. Replacing
 * it then starts the handshake over, so a broker that is slow but working would never be
 * reached (a livelock: every publish timed out on a new client). Such a client is kept
 * until it is older than a patience that starts at `patienceMs` and doubles with each
 * client given up that way (up to `maxPatienceMs`), and drops back after any success, so
 * any handshake that finishes at all eventually gets through. A client that has answered
 * before, a disconnect, or an operation that failed on the connection replaces at once.
 */
export class ClientSource {
  readonly #factory: (() => ServiceBusClient) | undefined;
  #current: Entry;
  /** Closes under way of clients given up, with the client and the generation each belonged to. */
  readonly #retiring = new Map<Promise<void>, { readonly client: ServiceBusClient; readonly generation: number }>();
  /** The orderly close of the client that was live when the source closed. */
  #liveClosing: Promise<void> | undefined;
  readonly #abandonCloseAfterMs: number;
  readonly #logger: Logger;
  readonly #basePatienceMs: number;
  readonly #maxPatienceMs: number;
  #patienceMs: number;
  #closed = false;

  constructor(
    client: ServiceBusClient | (() => ServiceBusClient),
    options: { patienceMs?: number; maxPatienceMs?: number; abandonCloseAfterMs?: number; logger?: Logger } = {},
  ) {
    this.#factory = typeof client === 'function' ? client : undefined;
    this.#abandonCloseAfterMs = options.abandonCloseAfterMs ?? 2_000;
    this.#logger = options.logger ?? noopLogger;
    this.#basePatienceMs = options.patienceMs ?? 20_000;
    this.#maxPatienceMs = Math.max(this.#basePatienceMs, options.maxPatienceMs ?? 120_000);
    this.#patienceMs = this.#basePatienceMs;
    this.#current = this.#watch(this.#entry(typeof client === 'function' ? client() : client, 0));
  }

  /** Whether this source can replace its client (it was given a factory). */
  get replaceable(): boolean {
    return this.#factory !== undefined;
  }

  /** The client to use now. */
  get current(): ClientGeneration {
    const { client, generation, controller } = this.#current;
    return { client, generation, signal: controller.signal };
  }

  /** Reports that an operation on `generation`'s client got its answer: the client is connected. */
  answered(generation: number): void {
    if (generation !== this.#current.generation || this.#current.answered) return;
    this.#current.answered = true;
    this.#patienceMs = this.#basePatienceMs;
  }

  /**
   * Reports that the connection of `generation`'s client is gone (a disconnect, a send or
   * receive that failed on the connection, or — `timedOut` — an operation that outlived its
   * deadline; a timeout replaces a client that never answered only once it is older than
   * the patience, see the class). Returns whether the client was replaced.
   */
  lost(generation: number, options: { timedOut?: boolean } = {}): boolean {
    if (this.#closed || !this.#factory || generation !== this.#current.generation) return false;
    const old = this.#current;
    const stillConnecting = options.timedOut === true && !old.answered;
    if (stillConnecting && Date.now() - old.madeAt < this.#patienceMs) return false;
    let client: ServiceBusClient;
    try {
      client = this.#factory();
    } catch {
      return false;
    }
    if (stillConnecting) this.#patienceMs = Math.min(this.#maxPatienceMs, this.#patienceMs * 2);
    this.#current = this.#watch(this.#entry(client, old.generation + 1));
    old.controller.abort();
    this.#retire(old.client, old.generation);
    return true;
  }

  #entry(client: ServiceBusClient, generation: number): Entry {
    return { client, generation, controller: new AbortController(), madeAt: Date.now(), answered: false };
  }

  /**
   * Aborts the current signal and closes every client this source made: the live one's
   * close is waited for in full, those of clients given up before for at most
   * `abandonCloseAfterMs` (see the class). Idempotent.
   */
  async close(): Promise<void> {
    const given = [...this.#retiring];
    if (!this.#closed) {
      this.#closed = true;
      this.#current.controller.abort();
      if (this.#factory) this.#liveClosing = this.#current.client.close().catch(() => undefined);
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const bound = new Promise<'late'>((resolve) => {
      timer = setTimeout(() => resolve('late'), this.#abandonCloseAfterMs);
    });
    const replaced = Promise.race([Promise.allSettled(given.map(([closing]) => closing)), bound]).finally(() => clearTimeout(timer));
    const [outcome] = await Promise.all([replaced, this.#liveClosing]);
    if (outcome === 'late') {
      for (const [closing, { client, generation }] of given) {
        if (!this.#retiring.has(closing)) continue;
        // Its close stays pending on a connection that answers nothing: cut the socket, so the
        // SDK's waits end (rhea drops a close's timer on a disconnect) and nothing of this
        // client keeps the process alive.
        const cut = sdkConnection.destroySocket(client);
        this.#logger.warn('azure-service-bus: abandoned the close of a client given up after a lost connection; it did not close in time', {
          generation,
          waitedMs: this.#abandonCloseAfterMs,
          socketDestroyed: cut,
        });
      }
    }
  }

  #retire(client: ServiceBusClient, generation: number): void {
    // A client whose connection is wedged can take the SDK's operation timeout to close:
    // nothing waits for it but `close()`, and that only for a while.
    const closing = client.close().catch(() => undefined);
    this.#retiring.set(closing, { client, generation });
    void closing.finally(() => this.#retiring.delete(closing));
  }

  /**
   * Listens for the disconnect of the client's AMQP connection, so even a process that only
   * waits (a session receiver waiting for a session) replaces its client at once. This reads
   * an SDK internal (`_connectionContext.connection`, the rhea-promise connection, the one the
   * SDK itself listens on); when it is missing the source relies on failed operations alone.
   * The SDK swaps in a new connection object after a disconnect, but this source replaces
   * the whole client at the first one, so the first connection is the only one watched.
   */
  #watch(entry: Entry): Entry {
    if (this.#factory) sdkConnection.of(entry.client)?.once('disconnected', () => this.lost(entry.generation));
    return entry;
  }
}

/** The part of the SDK's rhea-promise connection the disconnect watch uses. */
export interface WatchableConnection {
  once(event: 'disconnected', listener: () => void): unknown;
}

/**
 * @internal The one place that reads the SDK internal `_connectionContext.connection`. Why
 * an object: a test replaces `of` to take the field away (as an SDK release that renamed it
 * would) and shows that recovery still comes from failed or late operations alone.
 */
export const sdkConnection = {
  /** The AMQP connection of `client`, or undefined when the SDK no longer has it where 7.9 keeps it. */
  of(client: ServiceBusClient): WatchableConnection | undefined {
    const connection = (client as unknown as { _connectionContext?: { connection?: { once?: unknown } } })._connectionContext?.connection;
    return typeof connection?.once === 'function' ? (connection as WatchableConnection) : undefined;
  },
  /**
   * Destroys the TCP socket under `client`'s current AMQP connection (rhea-promise's
   * `_connection`, rhea's `socket`); returns whether there was one to destroy. For a client
   * given up whose close did not finish: the SDK does not reconnect a client it is closing.
   */
  destroySocket(client: ServiceBusClient): boolean {
    type Internals = { _connectionContext?: { connection?: { _connection?: { socket?: { destroy?: unknown; destroyed?: boolean } } } } };
    const socket = (client as unknown as Internals)._connectionContext?.connection?._connection?.socket;
    if (typeof socket?.destroy !== 'function' || socket.destroyed === true) return false;
    // With an error: rhea learns of a socket's end through 'error' or 'end', which a plain
    // destroy() does not emit; then it reports the disconnect and its pending waits end.
    (socket.destroy as (error: Error) => void).call(socket, new Error('azure-service-bus: the close of a client given up did not finish; its socket is destroyed'));
    return true;
  },
};
