// A loopback TCP proxy a test can close and open, to put one client (not the shared
// server) through an outage: closed, nothing listens on its port and connecting is
// refused (ECONNREFUSED), as with a server that is down; open, it forwards to the target.
// Published in the kit because a transport fixture needs exactly this for `kill` and
// `outage` on a broker that other tests share (see docs/writing-a-transport.md).
import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * A TCP forwarder in front of `target` on a loopback port of its own, created closed.
 *
 * Guarantees: while closed, connecting is refused and every connection it forwarded has
 * been destroyed (both sides), so clients see a server that went away; `open()` forwards
 * new connections again on the same port. `close()` and `open()` are idempotent; disposing
 * closes it.
 */
export class TcpProxy implements AsyncDisposable {
  readonly #target: { readonly host: string; readonly port: number };
  readonly #port: number;
  readonly #sockets = new Set<Socket>();
  #server: Server | undefined;

  private constructor(target: { host: string; port: number }, port: number) {
    this.#target = target;
    this.#port = port;
  }

  /** A closed proxy to `target`, on a free loopback port (reserved by listening on it once). */
  static async create(target: { host: string; port: number }): Promise<TcpProxy> {
    const probe = createServer();
    await new Promise<void>((resolve, reject) => probe.once('error', reject).listen(0, '127.0.0.1', resolve));
    const address = probe.address();
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    if (address === null || typeof address === 'string') throw new Error('could not reserve a loopback port');
    return new TcpProxy(target, address.port);
  }

  /** The loopback port clients connect to. */
  get port(): number {
    return this.#port;
  }

  /** Starts listening and forwarding. Idempotent. */
  async open(): Promise<void> {
    if (this.#server) return;
    const server = createServer((client) => {
      const upstream = connect(this.#target.port, this.#target.host);
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on('close', () => this.#sockets.delete(socket));
        socket.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve, reject) => server.once('error', reject).listen(this.#port, '127.0.0.1', resolve));
    this.#server = server;
  }

  /** Stops listening (new connections are refused) and cuts every forwarded connection. Idempotent. */
  async close(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    for (const socket of this.#sockets) socket.destroy();
    this.#sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** `url` with its host and port replaced by the proxy's. */
export function throughProxy(url: string, proxy: TcpProxy): string {
  const parsed = new URL(url);
  parsed.hostname = '127.0.0.1';
  parsed.port = String(proxy.port);
  return parsed.toString();
}

/** Host and port of a service URL, with the protocol's default port. */
export function targetOf(url: string, defaultPort: number): { host: string; port: number } {
  const parsed = new URL(url);
  return { host: parsed.hostname, port: parsed.port === '' ? defaultPort : Number(parsed.port) };
}
