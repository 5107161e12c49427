// The transport's Redis clients. ioredis reconnects by itself, but while it does, a command
// either waits in its offline queue (by default, for as long as the outage lasts) or fails at
// once; neither is the port's "reject retriably after a connect timeout". So nothing is sent
// on a client that is not ready: the transport waits for readiness up to its own timeout
// and rejects retriably after it. A client whose owner ended it for good (status `end`) is
// replaced from the factory.
import { TransportError, onAbort } from '@courier/core';
import type { Redis } from 'ioredis';

/** Makes one Redis client; called for the shared command client and once per subscription (blocking reads hold their client). */
export type RedisClientFactory = () => Redis | Promise<Redis>;

/** True when `error` is a reply the server sent (the server refused the command), not a lost or missing connection. */
export function isServerReply(error: unknown): boolean {
  return error instanceof Error && error.name === 'ReplyError';
}

/** Waits until `client` can take commands, at most `timeoutMs`; rejects retriably after it, or with `ABORTED` when `signal` aborts. */
export async function whenReady(client: Redis, timeoutMs: number, signal?: AbortSignal): Promise<void> {
  if (client.status === 'ready') return;
  if (client.status === 'wait') client.connect().catch(() => undefined);
  await new Promise<void>((resolve, reject) => {
    let cancel = () => {};
    const done = (error?: Error) => {
      clearTimeout(timer);
      client.off('ready', onReady);
      cancel();
      if (error) reject(error);
      else resolve();
    };
    const onReady = () => done();
    const timer = setTimeout(() => done(new TransportError(`redis-streams: no connection to redis within ${timeoutMs} ms (status '${client.status}')`, { retriable: true })), timeoutMs);
    client.on('ready', onReady);
    // One listener per signal however many waits (the caller's signal may live long).
    if (signal) cancel = onAbort(signal, () => done(new TransportError('redis-streams: aborted while waiting for a connection', { code: 'ABORTED', retriable: true })));
    if (client.status === 'ready') done();
  });
}

/** The clients of one transport: a shared one for commands, dedicated ones for blocking reads. */
export class RedisConnections {
  readonly #factory: RedisClientFactory;
  readonly #timeoutMs: number;
  readonly #clients = new Set<Redis>();
  #shared: Promise<Redis> | undefined;
  #closed = false;

  constructor(factory: RedisClientFactory, timeoutMs: number) {
    this.#factory = factory;
    this.#timeoutMs = timeoutMs;
  }

  /** The shared command client, ready; rejects retriably when Redis cannot be reached within the connect timeout. */
  async commands(signal?: AbortSignal): Promise<Redis> {
    let shared = this.#shared;
    if (shared === undefined) {
      shared = this.#make();
      this.#shared = shared;
      // A factory that failed is asked again next time (the outage may be over).
      shared.catch(() => {
        if (this.#shared === shared) this.#shared = undefined;
      });
    }
    const client = await shared;
    if (client.status === 'end') {
      if (this.#shared === shared) this.#shared = undefined;
      this.#clients.delete(client);
      return this.commands(signal);
    }
    await whenReady(client, this.#timeoutMs, signal);
    return client;
  }

  /** A new client of its own (for a subscription's blocking reads), ready. */
  async dedicated(signal?: AbortSignal): Promise<Redis> {
    const client = await this.#make();
    try {
      await whenReady(client, this.#timeoutMs, signal);
    } catch (error) {
      this.release(client);
      throw error;
    }
    return client;
  }

  /** Disconnects a dedicated client (no QUIT round trip: it may be blocked in a read). */
  release(client: Redis): void {
    this.#clients.delete(client);
    client.disconnect();
  }

  /** Disconnects every client; later calls reject. */
  close(): void {
    this.#closed = true;
    for (const client of this.#clients) client.disconnect();
    this.#clients.clear();
    this.#shared = undefined;
  }

  async #make(): Promise<Redis> {
    if (this.#closed) throw new TransportError('redis-streams: connections are closed', { retriable: false });
    let client: Redis;
    try {
      client = await this.#factory();
    } catch (error) {
      throw new TransportError(`redis-streams: the connection factory failed: ${(error as Error).message}`, { cause: error, retriable: true });
    }
    // An 'error' event without a listener would crash the process; the failures reach callers through their commands.
    client.on('error', () => undefined);
    if (this.#closed) {
      client.disconnect();
      throw new TransportError('redis-streams: connections are closed', { retriable: false });
    }
    this.#clients.add(client);
    return client;
  }
}
