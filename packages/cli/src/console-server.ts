import { createHash, timingSafeEqual } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { extname, join, normalize, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describeError, groupFailures, hasInboxHalts } from '@courier/core';
import { collectStats, listHaltedEverywhere, parkingPlacesOf, resumeHaltedEntry, type CliStats, type HaltedEntry } from './cli.js';
import type { CourierCliSetup } from './config.js';
import { actOnParked, countParked, failureFacts, findParked, listParked, NotFoundError, listParkedPage, unreadParkedHeads, unreadTransportLetters, type ParkedMessage } from './dead-letters.js';
import { diagnose } from './diagnose.js';
import { endpointOf, METRIC_ALERTS, ratesBetween, readMetrics, type EndpointRead, type MetricsRates } from './metrics-read.js';
import { toJson, UsageError } from './format.js';

/** Arguments of {@link serveConsole}. */
export interface ConsoleOptions {
  /** The objects of the user's `courier.config.ts`, as every CLI command gets them. */
  readonly setup: CourierCliSetup;
  readonly port: number;
  /** Address to listen on; `courier console` defaults to loopback (`127.0.0.1`). */
  readonly host: string;
  /**
   * The operator token every changing request must carry (`Authorization: Bearer <token>`).
   * Absent: the console is read-only (every changing request is answered 403).
   */
  readonly token?: string | undefined;
  /**
   * Named tokens, one per person (instead of `token`): every API request but `/api/info`
   * must carry one of them (401 otherwise), a `viewer` may read, an `operator` may also act,
   * and the audit line names the token's holder rather than what the page says.
   */
  readonly tokens?: readonly ConsoleToken[] | undefined;
  /** Refuse every changing request even with a token (403). */
  readonly readOnly?: boolean;
  /** How often the overview's history is sampled (milliseconds). Default 5,000. */
  readonly sampleIntervalMs?: number;
  /** Where each action (and each refused one) is logged as one JSON line: who, from where, what, and the outcome. */
  readonly audit: (line: string) => void;
  /** The built front end (index.html and its assets); defaults to `console/` beside this module in `dist/`. */
  readonly staticDir?: string;
}

/** A named console token (`courier console --tokens-file`): who holds it and what it may do. */
export interface ConsoleToken {
  /** The holder's name, written into every audit line of their actions. */
  readonly name: string;
  readonly token: string;
  /** `viewer`: reads only; `operator`: reads and actions (replay, purge, resume). */
  readonly role: 'viewer' | 'operator';
}

/**
 * Parses a tokens file: one `<name> <viewer|operator> <token>` a line, `#` comments and blank
 * lines skipped. Throws naming the line that is wrong, a repeated name or token, or an empty file.
 */
export function parseConsoleTokens(text: string, file: string): ConsoleToken[] {
  const tokens: ConsoleToken[] = [];
  text.split('\n').forEach((raw, index) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    const [name, role, token, ...rest] = line.split(/\s+/);
    const where = `${file} line ${index + 1}`;
    if (!name || !token || rest.length > 0) throw new UsageError(`${where}: write '<name> <viewer|operator> <token>'`);
    if (role !== 'viewer' && role !== 'operator') throw new UsageError(`${where}: role '${role ?? ''}' is neither 'viewer' nor 'operator'`);
    if (token.length < 12) throw new UsageError(`${where}: the token of '${name}' is shorter than 12 characters`);
    if (tokens.some((one) => one.name === name)) throw new UsageError(`${where}: '${name}' is named twice`);
    if (tokens.some((one) => one.token === token)) throw new UsageError(`${where}: the token of '${name}' is also another's: each person needs their own`);
    tokens.push({ name, role, token });
  });
  if (tokens.length === 0) throw new UsageError(`${file} names no tokens ('<name> <viewer|operator> <token>' a line)`);
  return tokens;
}

/** A running console; `close()` stops sampling and the server (idempotent). */
export interface CourierConsole {
  readonly url: string;
  readonly address: AddressInfo;
  close(): Promise<void>;
}

/** One point of the overview's charts. */
export interface ConsoleSample {
  readonly at: number;
  readonly pending: number | null;
  readonly inFlight: number | null;
  readonly oldestPendingAgeMs: number | null;
  /** Dead outbox rows plus transport dead letters plus parked consumer heads that the stats count. */
  readonly dead: number | null;
  /** The outbox's halted keys plus every consumer's. */
  readonly halted: number | null;
  /**
   * Rates and p99 latencies since the previous sample, from the config's `metrics`
   * endpoints (`courier metrics`' reader); null when the config names none or none answered.
   */
  readonly rates: MetricsRates | null;
}

/** One process of the config's `metrics` endpoints as the Relays and consumers page shows it. */
export interface ConsoleProcess extends EndpointRead {
  /** When it last answered `/metrics` (epoch milliseconds); null if never since the console started. */
  readonly lastSeen: number | null;
}

/** An hour of samples at the default interval. */
const HISTORY = 720;
const MAX_BODY = 1_000_000;
const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.json': 'application/json',
};

const digest = (text: string): Buffer => createHash('sha256').update(text).digest();

class HttpError extends Error {
  override readonly name = 'HttpError';
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** Overview numbers of one stats read, summed over consumers. */
function sampleOf(at: number, stats: CliStats, rates: MetricsRates | null): ConsoleSample {
  const transportDead = stats.transport?.reduce((sum, row) => sum + row.deadLetters, 0) ?? 0;
  const consumerHalted = stats.consumerHalts?.reduce((sum, row) => sum + row.haltedKeys, 0) ?? 0;
  const known = stats.outbox !== null || stats.transport !== null || stats.consumerHalts !== null;
  return {
    at,
    pending: stats.outbox?.pending ?? null,
    inFlight: stats.outbox?.inFlight ?? null,
    oldestPendingAgeMs: stats.outbox?.oldestPendingAgeMs ?? null,
    dead: known ? (stats.outbox?.dead ?? 0) + transportDead : null,
    halted: known ? (stats.outbox?.haltedKeys ?? 0) + consumerHalted : null,
    rates,
  };
}

/**
 * Serves the operator console: the built front end and a JSON API over the same functions
 * the `courier` commands call (stats, dead letters and their failure groups, halted keys,
 * replay, purge, resume), so the console has no query of its own.
 *
 * Guarantees: reads change nothing; a changing request (POST) is refused 403 in read-only
 * mode or without a configured token, 401 without the matching bearer token (compared in
 * constant time), before anything is read; each one, done or refused, writes one audit line.
 * A replay or purge acts only on the references the operator was shown and that still are
 * parked when it runs (those already changed are counted, not acted on), and replays go
 * through the stores' and transports' own replay, so a replayed dead letter keeps its
 * messageId and replay id and its effects apply once. Requests whose Host is not the
 * address bound (a DNS-rebinding page) are refused 421 when bound to loopback.
 */
export async function serveConsole(options: ConsoleOptions): Promise<CourierConsole> {
  const { setup } = options;
  // Installed: dist/console beside dist/console-server.js. Run from the sources (tsx, the
  // example's `pnpm courier`): the page a `pnpm build` left in dist/console.
  const staticDir =
    options.staticDir ??
    [new URL('./console/', import.meta.url), new URL('../dist/console/', import.meta.url)].map((url) => fileURLToPath(url)).find((dir) => existsSync(join(dir, 'index.html'))) ??
    fileURLToPath(new URL('./console/', import.meta.url));
  if (options.token !== undefined && options.tokens !== undefined) throw new UsageError('give either one operator token or named tokens, not both');
  const expected = options.token !== undefined ? digest(`Bearer ${options.token}`) : undefined;
  const named = options.tokens?.map((one) => ({ ...one, digest: digest(`Bearer ${one.token}`) }));
  const canAct = (expected !== undefined || (named?.some((one) => one.role === 'operator') ?? false)) && options.readOnly !== true;
  /** The named token a request carries; every token is compared (constant time each), so the time says nothing of which matched. */
  const holderOf = (request: IncomingMessage): ConsoleToken | undefined => {
    const given = digest(request.headers.authorization ?? '');
    let found: ConsoleToken | undefined;
    for (const one of named ?? []) if (timingSafeEqual(given, one.digest) && found === undefined) found = one;
    return found;
  };
  const history: ConsoleSample[] = [];
  const endpoints = setup.metrics ?? [];
  // Fails at start, naming the entry, rather than on every sample.
  endpoints.forEach((endpoint, index) => endpointOf(endpoint, index));
  let lastRead: EndpointRead[] | undefined;
  const lastSeen = new Map<string, number>();
  const statsCache = sharedRead(async () => {
    const [read, scraped] = await Promise.all([collectStats(setup), endpoints.length > 0 ? readMetrics(endpoints) : Promise.resolve(undefined)]);
    let rates: MetricsRates | null = null;
    if (scraped) {
      for (const one of scraped) if (one.up) lastSeen.set(one.url, one.at);
      if (lastRead && scraped.some((one) => one.up)) rates = ratesBetween(lastRead, scraped);
      lastRead = scraped;
    }
    history.push(sampleOf(Date.now(), read, rates));
    if (history.length > HISTORY) history.splice(0, history.length - HISTORY);
    return read;
  }, 1_000);
  const stats = statsCache.get;
  const notes: string[] = [];
  const halts = setup.inbox !== undefined && hasInboxHalts(setup.inbox as object);
  if (endpoints.length === 0) notes.push("the config names no 'metrics' endpoints: no publish and handle rates, latencies or processes are shown");
  if (!setup.outbox) notes.push("the config has no 'outbox': no outbox backlog, dead rows or halted outbox keys");
  if (!setup.inbox) notes.push("the config has no 'inbox': no consumers' records or halted keys");
  else if (!halts) notes.push("the inbox store has no halts: consumers' halted keys and parked heads cannot be shown");
  if (!setup.transport?.deadLetters) notes.push('the transport offers no dead-letter operations (or the config has none): transport dead letters are not shown');
  else if ((setup.consumers ?? []).length === 0) notes.push("the config lists no 'consumers': a transport keeps dead letters per consumer and cannot list its consumers, so none are shown");

  const authorise = (request: IncomingMessage): void => {
    if (options.readOnly) throw new HttpError(403, 'the console runs read-only (--read-only)');
    if (named) {
      const holder = holderOf(request);
      if (!holder) throw new HttpError(401, 'a valid token is required (Authorization: Bearer <token>)');
      if (holder.role !== 'operator') throw new HttpError(403, `the token of '${holder.name}' is a viewer's: it may read, not act`);
      return;
    }
    if (expected === undefined) throw new HttpError(403, 'the console runs read-only: start it with --token or COURIER_CONSOLE_TOKEN to allow actions');
    const given = digest(request.headers.authorization ?? '');
    if (!timingSafeEqual(given, expected)) throw new HttpError(401, 'a valid operator token is required (Authorization: Bearer <token>)');
  };
  const audit = (request: IncomingMessage, action: string, what: unknown, outcome: unknown): void => {
    options.audit(
      JSON.stringify({
        at: new Date().toISOString(),
        msg: 'console action',
        operator: named ? (holderOf(request)?.name ?? 'no valid token') : operatorOf(request),
        from: request.socket.remoteAddress ?? null,
        action,
        what,
        outcome,
      }),
    );
  };

  const routes = async (request: IncomingMessage, url: URL): Promise<unknown> => {
    const path = url.pathname;
    if (request.method === 'GET') {
      if (path === '/api/info') {
        const holder = named ? holderOf(request) : undefined;
        return {
          readOnly: !canAct,
          readOnlyReason: canAct ? null : options.readOnly ? '--read-only' : named ? 'no named token has the operator role' : 'no operator token configured',
          // Named tokens: reads need one too, and the page shows whose it holds.
          namedTokens: named !== undefined,
          you: holder ? { name: holder.name, role: holder.role } : null,
          consumers: setup.consumers ?? [],
          notes,
        };
      }
      if (named && !holderOf(request)) throw new HttpError(401, 'a valid token is required to read (Authorization: Bearer <token>)');
      if (path === '/api/stats') {
        const read = await stats();
        return { stats: read, history, alerts: METRIC_ALERTS };
      }
      if (path === '/api/processes') {
        await stats();
        const processes: ConsoleProcess[] = (lastRead ?? []).map((one) => ({ ...one, lastSeen: lastSeen.get(one.url) ?? null }));
        return { processes, alerts: METRIC_ALERTS };
      }
      if (path === '/api/groups') {
        const places = parkingPlacesOf(setup);
        const reads = new Map<string, number>();
        const found = await listParked(places, {}, Number.MAX_SAFE_INTEGER, reads);
        const groups = groupFailures(found, failureFacts).map(({ members, ...group }) => ({ ...group, members: members.map(summary) }));
        return { groups, notes: [...(await unreadParkedHeads(places, {})), ...(await unreadTransportLetters(places, reads))] };
      }
      if (path === '/api/dead') {
        // The failed-messages list a page at a time: the same keyset pages as `courier dead
        // list` (one function, no query of its own), so the two agree and neither shifts.
        const limitText = url.searchParams.get('limit') ?? '100';
        const limit = Number(limitText);
        if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) throw new HttpError(400, `limit '${limitText}' is not a whole number from 1 to 10000`);
        const after = url.searchParams.get('after');
        try {
          const places = parkingPlacesOf(setup);
          const page = await listParkedPage(places, {}, { limit, ...(after !== null ? { after } : {}) });
          // The M of "N of M shown": `courier dead list`'s count (null where only a read could tell).
          const total = await countParked(places, {});
          return { items: page.items, next: page.next, total, notes: [...(await unreadParkedHeads(places, {})), ...(await unreadTransportLetters(places, page.transportRead))] };
        } catch (error) {
          if (error instanceof UsageError) throw new HttpError(400, error.message);
          throw error;
        }
      }
      if (path.startsWith('/api/dead/')) {
        const ref = decodeURIComponent(path.slice('/api/dead/'.length));
        // `courier dead show`'s own lookup (a consumer outside the config's list too).
        try {
          const [item] = await findParked(parkingPlacesOf(setup), [ref]);
          return item;
        } catch (error) {
          if (error instanceof NotFoundError) throw new HttpError(404, `no dead letter '${ref}' (it may have been replayed or purged)`);
          if (error instanceof UsageError) throw new HttpError(400, error.message);
          throw error;
        }
      }
      if (path === '/api/halted') {
        const skipped: string[] = [];
        const keys = await listHaltedEverywhere(setup, { source: 'all' }, { err: (text) => skipped.push(text.replace(/^courier: note: /, '')) });
        return { keys, notes: skipped };
      }
      throw new HttpError(404, `no such page '${path}'`);
    }
    if (request.method !== 'POST') throw new HttpError(405, `method ${request.method ?? ''} not allowed`);
    const dead = /^\/api\/dead\/(replay|purge)$/.exec(path);
    if (dead) {
      const action = dead[1] as 'replay' | 'purge';
      const body = await jsonBody(request);
      try {
        authorise(request);
      } catch (error) {
        audit(request, action, { refs: body['refs'] ?? null }, { refused: (error as Error).message });
        throw error;
      }
      const refs = stringArray(body['refs'], 'refs');
      const places = parkingPlacesOf(setup);
      // Only what is still parked is acted on: a member replayed by another operator since
      // the page was shown is counted as already changed, never replayed a second time here.
      const current = new Map((await listParked(places, {}, Number.MAX_SAFE_INTEGER)).map((item) => [item.ref, item]));
      const present = refs.map((ref) => current.get(ref)).filter((item): item is ParkedMessage => item !== undefined);
      // Parked consumer heads are acted on too (the inbox store's replayParked/purgeParked);
      // a replayed head whose key was halted again meanwhile waits behind that halt.
      const done = present.length > 0 ? await actOnParked(places, present, action) : { outbox: 0, transport: 0, inbox: 0, heldBehind: [] };
      const outcome = {
        requested: refs.length,
        outbox: done.outbox,
        transport: done.transport,
        inbox: done.inbox,
        alreadyChanged: refs.length - present.length + (present.length - done.outbox - done.transport - done.inbox),
        heldBehind: done.heldBehind.map((item) => item.ref),
      };
      statsCache.invalidate();
      audit(request, action, { refs, group: typeof body['group'] === 'string' ? body['group'] : null }, outcome);
      return outcome;
    }
    if (path === '/api/halted/resume') {
      const body = await jsonBody(request);
      const what = { consumer: body['consumer'] ?? null, topic: body['topic'] ?? null, key: body['key'] ?? null, resume: body['action'] ?? null };
      try {
        authorise(request);
      } catch (error) {
        audit(request, 'resume', what, { refused: (error as Error).message });
        throw error;
      }
      const action = body['action'];
      if (action !== 'retry' && action !== 'park') throw new HttpError(400, "'action' must be 'retry' or 'park'");
      const consumer = body['consumer'] === null || body['consumer'] === undefined ? null : text(body['consumer'], 'consumer');
      const entry: Pick<HaltedEntry, 'consumer' | 'topic' | 'key'> = { consumer, topic: text(body['topic'], 'topic'), key: text(body['key'], 'key') };
      const changed = await resumeHaltedEntry(setup, entry, action);
      statsCache.invalidate();
      audit(request, 'resume', what, { changed });
      return { changed };
    }
    throw new HttpError(404, `no such action '${path}'`);
  };

  const serveStatic = async (path: string, response: ServerResponse): Promise<void> => {
    const index = join(staticDir, 'index.html');
    if (!existsSync(index)) {
      response.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
      response.end(`the console's front end is not built (no ${index}); in a source checkout run \`pnpm --filter @courier/cli build\``);
      return;
    }
    const file = normalize(join(staticDir, path === '/' ? 'index.html' : decodeURIComponent(path)));
    // Unknown paths are the single-page app's own routes: they get index.html.
    const target = file.startsWith(staticDir.endsWith(sep) ? staticDir : `${staticDir}${sep}`) && existsSync(file) && extname(file) !== '' ? file : index;
    const body = await readFile(target);
    response.writeHead(200, {
      'content-type': TYPES[extname(target)] ?? 'application/octet-stream',
      'cache-control': target === index ? 'no-store' : 'public, max-age=31536000, immutable',
      'x-content-type-options': 'nosniff',
      'x-frame-options': 'DENY',
      'content-security-policy': "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    });
    response.end(body);
  };

  const loopback = /^(127\.|::1$|localhost$)/.test(options.host);
  const server: Server = createServer((request, response) => {
    const url = new URL(request.url ?? '/', 'http://console.invalid');
    // Bound to loopback, the console trusts the machine: a page from elsewhere that rebinds
    // its own name to 127.0.0.1 would otherwise read it, so only loopback names are served.
    const hostname = (request.headers.host ?? '').replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
    if (loopback && !/^(localhost|127\.\d+\.\d+\.\d+|::1)$/.test(hostname)) {
      response.writeHead(421, { 'content-type': 'text/plain; charset=utf-8' }).end(`host '${hostname}' is not served: open the console at its loopback address`);
      return;
    }
    if (!url.pathname.startsWith('/api/')) {
      serveStatic(url.pathname, response).catch((error: unknown) => {
        if (!response.headersSent) response.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
        response.end(describeError(error));
      });
      return;
    }
    routes(request, url).then(
      (value) => {
        response.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' }).end(toJson(value));
      },
      (error: unknown) => {
        const status = error instanceof HttpError ? error.status : error instanceof UsageError ? 400 : error instanceof Error && error.name === 'NotFoundError' ? 404 : 500;
        const remedy = diagnose(error)?.remedy;
        response
          .writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' })
          .end(toJson({ error: error instanceof Error ? error.message : String(error), ...(remedy !== undefined ? { remedy } : {}) }));
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  // Sample in the background too, so the charts have a history when the page is first opened.
  const sampleEvery = options.sampleIntervalMs ?? 5_000;
  const sampler = setInterval(() => {
    stats().catch(() => undefined);
  }, sampleEvery);
  sampler.unref();
  stats().catch(() => undefined);
  const address = server.address() as AddressInfo;
  const shownHost = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  let closing: Promise<void> | undefined;
  return {
    url: `http://${shownHost}:${address.port}/`,
    address,
    close: () =>
      (closing ??= new Promise<void>((resolve) => {
        clearInterval(sampler);
        server.close(() => resolve());
        server.closeAllConnections();
      })),
  };
}

/**
 * One read shared by concurrent callers and reused for `maxAgeMs`; `invalidate()` (after an
 * action) makes the next caller read anew, and a read already in flight then is not kept,
 * so a page never shows the state from before its own action as current.
 */
function sharedRead<T>(read: () => Promise<T>, maxAgeMs: number): { get: () => Promise<T>; invalidate: () => void } {
  let last: { readonly value: T; readonly at: number } | undefined;
  let reading: Promise<T> | undefined;
  let generation = 0;
  return {
    get: async () => {
      if (last && performance.now() - last.at < maxAgeMs) return last.value;
      if (reading) return reading;
      const started = generation;
      const current = read()
        .then((value) => {
          if (started === generation) last = { value, at: performance.now() };
          return value;
        })
        .finally(() => {
          if (reading === current) reading = undefined;
        });
      reading = current;
      return current;
    },
    invalidate: () => {
      generation += 1;
      last = undefined;
      reading = undefined;
    },
  };
}

/** What a failure group's member list shows of each member. */
function summary(item: ParkedMessage) {
  return {
    ref: item.ref,
    state: item.state,
    source: item.source,
    consumer: item.consumer,
    topic: item.envelope.topic,
    key: item.envelope.key ?? null,
    messageId: item.envelope.messageId,
    attempts: item.attempts,
    parkedAt: item.parkedAt,
    actionable: item.source !== 'inbox',
  };
}

/** Who did it, as the page says (an operator name it keeps per browser); the audit line adds the address. */
function operatorOf(request: IncomingMessage): string {
  const name = request.headers['x-courier-operator'];
  return typeof name === 'string' && name.trim() !== '' ? name.trim().slice(0, 100) : 'anonymous';
}

async function jsonBody(request: IncomingMessage): Promise<Record<string, unknown>> {
  // A form post from another page cannot set this type without a CORS preflight, which is never granted.
  if (!(request.headers['content-type'] ?? '').startsWith('application/json')) throw new HttpError(415, 'send the body as application/json');
  let size = 0;
  const chunks: Buffer[] = [];
  for await (const chunk of request as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new HttpError(413, 'request body too large');
    chunks.push(chunk);
  }
  try {
    const value: unknown = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('not an object');
    return value as Record<string, unknown>;
  } catch {
    throw new HttpError(400, 'the body is not a JSON object');
  }
}

function stringArray(value: unknown, what: string): string[] {
  if (!Array.isArray(value) || value.length === 0 || !value.every((item) => typeof item === 'string')) throw new HttpError(400, `'${what}' must be a non-empty array of references`);
  return value as string[];
}

function text(value: unknown, what: string): string {
  if (typeof value !== 'string' || value === '') throw new HttpError(400, `'${what}' must be a non-empty string`);
  return value;
}
