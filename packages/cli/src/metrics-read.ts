// Reads the relays' and consumers' own /metrics and /health endpoints (served by
// `courier relay --port` and serveCourierMetrics) for `courier metrics` and the console's
// charts and process list: one reader, so the console has no query the CLI lacks.
import { ConfigError } from '@courier/core';

/**
 * One process whose `/metrics` and `/health` the CLI reads: a `courier relay --port`, or a
 * service that runs {@link serveCourierMetrics}. A bare string is its base URL.
 */
export interface MetricsEndpoint {
  /** Base URL (`http://10.0.0.5:9464`); a URL ending in `/metrics` or `/health` is taken as its base. */
  readonly url: string;
  /** What the console and `courier metrics` call it. Default: the URL's host and port. */
  readonly name?: string;
  /** Bearer token the endpoint requires (its `--token` / `COURIER_RELAY_TOKEN`). */
  readonly token?: string;
}

/** One series of a Prometheus text exposition. */
export interface PromSample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** The health document of a process (the bus's `health()`), as far as the readers use it. */
export interface ProcessHealth {
  readonly status: string;
  readonly ready: boolean;
  readonly relay?: {
    readonly running: boolean;
    readonly ready?: boolean;
    readonly paused: boolean;
    readonly lastError: string | null;
    readonly sinceLastClaimMs: number;
    /** The name it claims under (the outbox's `lease_owner`); absent from a process older than this CLI. */
    readonly owner?: string | null;
    /** The leases on batches it is sending (token, rows, held for); absent from a process older than this CLI. */
    readonly leases?: readonly { readonly token: string; readonly rows: number; readonly heldForMs: number }[];
  };
  readonly consumers?: readonly { readonly consumer: string; readonly connected: boolean; readonly inFlight: number; readonly lastError: string | null }[];
}

/** Counters and histogram buckets of one scrape, summed over every label but `le`. */
export interface MetricsTotals {
  /** `courier_relay_published_total`: messages confirmed by the broker and completed. */
  readonly published: number;
  /** `courier_relay_failures_total`: per-message publish failures. */
  readonly publishFailures: number;
  /** `courier_consumer_processed_total`: messages handled and committed. */
  readonly processed: number;
  /** `courier_dead_lettered_total`. */
  readonly deadLettered: number;
  /** `courier_relay_paused` (max over series), null when the process runs no relay gauge. */
  readonly relayPaused: number | null;
  /** Cumulative buckets (upper bound in seconds → count) of `courier_relay_commit_to_confirm_duration_seconds`. */
  readonly commitToConfirm: ReadonlyMap<number, number>;
  /** Of `messaging_process_duration_seconds` (one handler run). */
  readonly handler: ReadonlyMap<number, number>;
  /** Of `courier_consumer_delivery_to_ack_duration_seconds` (a delivery → its acknowledgement). */
  readonly deliveryToAck: ReadonlyMap<number, number>;
  /**
   * Of `courier_consumer_occurred_to_handler_duration_seconds`: a message's `occurredAt` (its
   * publish call, producer's clock) → its handler's first start (consumer's clock). Empty
   * from a process built before that histogram existed.
   */
  readonly occurredToHandler: ReadonlyMap<number, number>;
}

/** One read of one endpoint. */
export interface EndpointRead {
  readonly name: string;
  readonly url: string;
  /** When it was read (epoch milliseconds). */
  readonly at: number;
  /** `/metrics` answered 200 and parsed. */
  readonly up: boolean;
  /** Why `/metrics` or `/health` could not be read; null when both were. */
  readonly error: string | null;
  /** The `/health` document (also when it answered 503: not ready), null when unreadable. */
  readonly health: ProcessHealth | null;
  /** Null when `/metrics` was not read. */
  readonly totals: MetricsTotals | null;
}

/** Rates and latencies between two reads, over every endpoint that answered both. */
export interface MetricsRates {
  readonly from: number;
  readonly to: number;
  readonly publishedPerSecond: number;
  readonly publishFailuresPerSecond: number;
  readonly processedPerSecond: number;
  readonly deadLettered: number;
  /** 0.99 quantile of commit → confirm in the window (seconds), null without observations. */
  readonly commitToConfirmP99: number | null;
  readonly handlerP99: number | null;
  readonly deliveryToAckP99: number | null;
  /** 0.99 quantile of occurredAt (publish) → handler start in the window (seconds), null without observations. */
  readonly occurredToHandlerP99: number | null;
}

/** The alerts of docs/operations.md ("Alerts worth setting") that the endpoints can decide. */
export const METRIC_ALERTS = {
  /** `CourierPublishLatency`: p99 commit → confirm above 5 s. */
  publishLatencySeconds: 5,
} as const;

const DEFAULT_TIMEOUT_MS = 3_000;

/**
 * Parses the Prometheus text exposition format (0.0.4, as the OpenTelemetry exporter writes
 * it): every sample line, comments skipped. Label values are unescaped (`\\`, `\"`, `\n`).
 * A line that is not a sample is an error naming the line, since a reader that skipped it
 * would report a wrong rate without saying so.
 *
 * (Hand-written: the npm parser `parse-prometheus-text-format` 1.1.1 drops a histogram's
 * labels and merges its series, measured on the exporter's output.)
 */
export function parsePrometheusText(text: string): PromSample[] {
  const samples: PromSample[] = [];
  const lines = text.split('\n');
  for (let index = 0; index < lines.length; index += 1) {
    const line = lines[index]!.trim();
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$/.exec(line);
    if (!match) throw new Error(`line ${index + 1} of the metrics is not a Prometheus sample: ${line.slice(0, 120)}`);
    const labels: Record<string, string> = {};
    const body = match[2] ?? '';
    const label = /\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?/gy;
    let consumed = 0;
    for (let found = label.exec(body); found; found = label.exec(body)) {
      labels[found[1]!] = found[2]!.replace(/\\(.)/g, (_all, char: string) => (char === 'n' ? '\n' : char));
      consumed = label.lastIndex;
    }
    if (body.slice(consumed).trim() !== '') throw new Error(`line ${index + 1} of the metrics has malformed labels: ${line.slice(0, 120)}`);
    const raw = match[3]!;
    const value = raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : Number(raw);
    if (Number.isNaN(value) && raw !== 'NaN') throw new Error(`line ${index + 1} of the metrics has no number: ${line.slice(0, 120)}`);
    samples.push({ name: match[1]!, labels, value });
  }
  return samples;
}

/** Sums the counters and histogram buckets the console and `courier metrics` show. */
export function totalsOf(samples: readonly PromSample[]): MetricsTotals {
  const sum = (name: string): number => samples.reduce((total, sample) => (sample.name === name ? total + sample.value : total), 0);
  const buckets = (name: string): Map<number, number> => {
    const out = new Map<number, number>();
    for (const sample of samples) {
      if (sample.name !== `${name}_bucket`) continue;
      const le = sample.labels['le'] === '+Inf' ? Infinity : Number(sample.labels['le']);
      if (Number.isNaN(le)) continue;
      out.set(le, (out.get(le) ?? 0) + sample.value);
    }
    return out;
  };
  const paused = samples.filter((sample) => sample.name === 'courier_relay_paused');
  return {
    published: sum('courier_relay_published_total'),
    publishFailures: sum('courier_relay_failures_total'),
    processed: sum('courier_consumer_processed_total'),
    deadLettered: sum('courier_dead_lettered_total'),
    relayPaused: paused.length === 0 ? null : Math.max(...paused.map((sample) => sample.value)),
    commitToConfirm: buckets('courier_relay_commit_to_confirm_duration_seconds'),
    handler: buckets('messaging_process_duration_seconds'),
    deliveryToAck: buckets('courier_consumer_delivery_to_ack_duration_seconds'),
    occurredToHandler: buckets('courier_consumer_occurred_to_handler_duration_seconds'),
  };
}

/** Normalises an endpoint given in the config; throws a `ConfigError` naming the entry and what is wrong. */
export function endpointOf(given: string | MetricsEndpoint, index: number): Required<Pick<MetricsEndpoint, 'url' | 'name'>> & { readonly token: string | undefined } {
  const entry = typeof given === 'string' ? { url: given } : given;
  if (entry === null || typeof entry !== 'object' || typeof entry.url !== 'string') throw new ConfigError(`config 'metrics[${index}]' must be a URL string or { url, name?, token? }`);
  let url: URL;
  try {
    url = new URL(entry.url);
  } catch {
    throw new ConfigError(`config 'metrics[${index}]': '${entry.url}' is not a URL (give the base, e.g. http://127.0.0.1:9464)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigError(`config 'metrics[${index}]': '${entry.url}' is not http(s)`);
  url.pathname = url.pathname.replace(/\/(metrics|health)\/?$/, '/').replace(/\/?$/, '/');
  return { url: url.href, name: entry.name ?? url.host, token: entry.token };
}

/**
 * Reads `/metrics` and `/health` of every endpoint, concurrently, each within `timeoutMs`
 * (default 3 s). Never throws for an endpoint: one that cannot be read is reported with
 * `up: false` and the reason, so a dead process shows as dead rather than failing the read.
 * Reads only: an endpoint's own collection is cached by it (`--metrics-max-age`).
 */
export async function readMetrics(endpoints: readonly (string | MetricsEndpoint)[], options: { readonly timeoutMs?: number } = {}): Promise<EndpointRead[]> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  return Promise.all(
    endpoints.map(async (given, index) => {
      const endpoint = endpointOf(given, index);
      const headers: Record<string, string> = endpoint.token !== undefined ? { authorization: `Bearer ${endpoint.token}` } : {};
      const get = (path: string) => fetch(new URL(path, endpoint.url), { headers, signal: AbortSignal.timeout(timeoutMs) });
      const at = Date.now();
      const errors: string[] = [];
      const [totals, health] = await Promise.all([
        get('metrics').then(
          async (response) => {
            if (response.status !== 200) throw new Error(`/metrics answered HTTP ${response.status}${response.status === 401 ? ' (give the endpoint its token in the config)' : ''}`);
            return totalsOf(parsePrometheusText(await response.text()));
          },
          (error: unknown) => Promise.reject(new Error(`/metrics: ${reason(error)}`)),
        ),
        get('health').then(
          async (response) => {
            // 503 is a health document too: the process answers, and is not ready.
            if (response.status !== 200 && response.status !== 503) throw new Error(`/health answered HTTP ${response.status}`);
            return (await response.json()) as ProcessHealth;
          },
          (error: unknown) => Promise.reject(new Error(`/health: ${reason(error)}`)),
        ),
      ].map((read) => read.catch((error: unknown) => (errors.push(reason(error)), null))) as [Promise<MetricsTotals | null>, Promise<ProcessHealth | null>]);
      return { name: endpoint.name, url: endpoint.url, at, up: totals !== null, error: errors.length > 0 ? errors.join('; ') : null, health, totals };
    }),
  );
}

function reason(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    if (error.name === 'TimeoutError') return 'no answer in time';
    return cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
  }
  return String(error);
}

/**
 * Rates and p99 latencies between two reads of the same endpoints (the later one second),
 * summed over the endpoints up in both. A counter lower than before (the process restarted)
 * counts from zero, as Prometheus's `rate` does. The p99 is interpolated inside its bucket
 * the way `histogram_quantile` does.
 */
export function ratesBetween(before: readonly EndpointRead[], after: readonly EndpointRead[]): MetricsRates {
  let published = 0;
  let failures = 0;
  let processed = 0;
  let dead = 0;
  const windows = { commitToConfirm: new Map<number, number>(), handler: new Map<number, number>(), deliveryToAck: new Map<number, number>(), occurredToHandler: new Map<number, number>() };
  const from = Math.min(...before.map((read) => read.at), Infinity);
  const to = Math.max(...after.map((read) => read.at), -Infinity);
  for (const later of after) {
    const earlier = before.find((read) => read.url === later.url);
    if (!later.totals || !earlier?.totals) continue;
    const delta = (a: number, b: number): number => (b >= a ? b - a : b);
    published += delta(earlier.totals.published, later.totals.published);
    failures += delta(earlier.totals.publishFailures, later.totals.publishFailures);
    processed += delta(earlier.totals.processed, later.totals.processed);
    dead += delta(earlier.totals.deadLettered, later.totals.deadLettered);
    for (const key of ['commitToConfirm', 'handler', 'deliveryToAck', 'occurredToHandler'] as const) {
      for (const [le, count] of later.totals[key]) windows[key].set(le, (windows[key].get(le) ?? 0) + delta(earlier.totals[key].get(le) ?? 0, count));
    }
  }
  const seconds = Number.isFinite(from) && Number.isFinite(to) && to > from ? (to - from) / 1000 : 0;
  const per = (count: number): number => (seconds > 0 ? count / seconds : 0);
  return {
    from: Number.isFinite(from) ? from : 0,
    to: Number.isFinite(to) ? to : 0,
    publishedPerSecond: per(published),
    publishFailuresPerSecond: per(failures),
    processedPerSecond: per(processed),
    deadLettered: dead,
    commitToConfirmP99: quantile(0.99, windows.commitToConfirm),
    handlerP99: quantile(0.99, windows.handler),
    deliveryToAckP99: quantile(0.99, windows.deliveryToAck),
    occurredToHandlerP99: quantile(0.99, windows.occurredToHandler),
  };
}

/** `histogram_quantile` over cumulative buckets; null without observations. */
export function quantile(q: number, buckets: ReadonlyMap<number, number>): number | null {
  const sorted = [...buckets].sort(([a], [b]) => a - b);
  const total = sorted.at(-1)?.[1] ?? 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const [le, count] of sorted) {
    if (count >= rank) {
      // The top bucket has no upper bound: its lower one is the best answer (as Prometheus).
      if (le === Infinity) return lowerBound;
      return count === lowerCount ? le : lowerBound + (le - lowerBound) * ((rank - lowerCount) / (count - lowerCount));
    }
    lowerBound = le;
    lowerCount = count;
  }
  return lowerBound;
}

/**
 * What a relay holds, in words (`courier metrics` and the console say the same): the owner
 * it claims under and each lease on a batch it is sending, or that it holds none; null when
 * the process reports neither (older than this CLI).
 */
export function relayLeasesText(relay: NonNullable<NonNullable<EndpointRead['health']>['relay']>): string | null {
  if (relay.owner === undefined && relay.leases === undefined) return null;
  const owner = relay.owner ? `claims as ${relay.owner}` : 'claims under no name';
  const leases = relay.leases ?? [];
  if (leases.length === 0) return `${owner}; holds no lease (between batches)`;
  return `${owner}; holds ${leases.map((lease) => `lease ${lease.token} (${lease.rows} row${lease.rows === 1 ? '' : 's'}, ${Math.round(lease.heldForMs)} ms)`).join(', ')}`;
}
