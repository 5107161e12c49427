import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Arguments of {@link serveRelayHttp}. */
export interface RelayHttpOptions {
  readonly port: number;
  /** Address to listen on; the CLI's default is loopback (`127.0.0.1`). */
  readonly host: string;
  /**
   * When set, every request must carry `Authorization: Bearer <token>`; others are answered
   * 401. Absent: no authentication (bind loopback, or put the endpoint behind a proxy).
   */
  readonly token?: string | undefined;
  /** The health document and whether it is ready (200) or not (503). */
  readonly health: () => { readonly ready: boolean };
  /** One Prometheus text collection (reads the stores: see {@link cachedSnapshot}). */
  readonly collect: () => Promise<string>;
  /** How long a collection answers further scrapes (milliseconds). Default 5,000. */
  readonly metricsMaxAgeMs?: number;
}

/**
 * Wraps an expensive read so that concurrent callers share one read in flight and a
 * result is reused while younger than `maxAgeMs`. A failed read is not kept: the next
 * caller reads again.
 */
export function cachedSnapshot<T>(read: () => Promise<T>, maxAgeMs: number): () => Promise<T> {
  let last: { readonly value: T; readonly at: number } | undefined;
  let reading: Promise<T> | undefined;
  return async () => {
    if (last && performance.now() - last.at < maxAgeMs) return last.value;
    reading ??= read()
      .then((value) => {
        last = { value, at: performance.now() };
        return value;
      })
      .finally(() => {
        reading = undefined;
      });
    return reading;
  };
}

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

/**
 * Serves `/health` (the health document as JSON: 200 when ready, 503 when not) and
 * `/metrics` (Prometheus text) for `courier relay --port`, and resolves once listening.
 *
 * Guarantees: a scrape never starts a collection while another runs, and a collection
 * answers every scrape for `metricsMaxAgeMs` (the outbox `stats()` and the inbox halt
 * listing behind it run at most once per that age, however many scrapers there are); with
 * `token`, a request without the matching bearer token is answered 401 before anything is
 * read (compared in constant time).
 */
export async function serveRelayHttp(options: RelayHttpOptions): Promise<{ readonly server: Server; readonly address: AddressInfo }> {
  const metrics = cachedSnapshot(options.collect, options.metricsMaxAgeMs ?? 5_000);
  const expected = options.token !== undefined ? digest(`Bearer ${options.token}`) : undefined;
  const authorised = (request: IncomingMessage): boolean =>
    expected === undefined || timingSafeEqual(digest(request.headers.authorization ?? ''), expected);
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    if (!authorised(request)) {
      response.writeHead(401, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer realm="courier relay"' });
      response.end('unauthorised: send Authorization: Bearer <token>\n');
      return;
    }
    const path = (request.url ?? '/').split('?')[0];
    if (path === '/metrics') {
      metrics().then(
        (text) => {
          response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
          response.end(text);
        },
        (error: unknown) => {
          response.writeHead(500, { 'content-type': 'text/plain' });
          response.end(`# failed to collect metrics: ${error instanceof Error ? error.message : String(error)}\n`);
        },
      );
    } else if (path === '/health') {
      const health = options.health();
      response.writeHead(health.ready ? 200 : 503, { 'content-type': 'application/json' });
      response.end(JSON.stringify(health));
    } else {
      response.writeHead(404, { 'content-type': 'text/plain' });
      response.end('not found: try /health or /metrics\n');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return { server, address: server.address() as AddressInfo };
}

/** Whether `host` is a loopback address (only this machine can connect). */
export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}
