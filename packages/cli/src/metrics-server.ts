import type { Server } from 'node:http';
import { metrics } from '@opentelemetry/api';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AggregationTemporality, InstrumentType, MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics';
import {
  describeError,
  hasInboxHalts,
  hasLogSlot,
  defaultLogger,
  observeDeadLetters,
  observeInbox,
  observeInboxHalts,
  observeLogSlot,
  observeOutbox,
  observeRelay,
  PROMETHEUS_VIEWS,
  type Bus,
  type InboxOperations,
  type LogSlotOperations,
  type Logger,
  type OutboxOperations,
  type TransportDeadLetters,
} from '@courier/core';
import { isLoopback, serveRelayHttp } from './relay-http.js';

/**
 * The reader `/metrics` collects through: cumulative for counters and histograms (what
 * Prometheus expects), delta for observable gauges. A cumulative reader of
 * `@opentelemetry/sdk-metrics` keeps every series a gauge ever observed and repeats its last
 * value when a callback observes nothing, so an outbox whose `stats()` fails kept serving its
 * last backlog (and `CourierOutboxMetricsAbsent` could never fire), a dropped replication slot
 * its last lag, a resumed consumer its halted keys, until a restart. With delta, a gauge
 * exposes exactly what this collection observed; a gauge's value is not a sum, so nothing
 * else changes.
 */
class ScrapeReader extends MetricReader {
  constructor() {
    super({
      aggregationTemporalitySelector: (type) => (type === InstrumentType.OBSERVABLE_GAUGE ? AggregationTemporality.DELTA : AggregationTemporality.CUMULATIVE),
    });
  }

  protected override async onForceFlush(): Promise<void> {}

  protected override async onShutdown(): Promise<void> {}
}

/** Arguments of {@link serveCourierMetrics}. */
export interface CourierMetricsOptions {
  /** Port of `/health` and `/metrics` (0: any free port; read it from `address`). */
  readonly port: number;
  /** Address to listen on. Default `127.0.0.1`: only this machine (or pod) can connect. */
  readonly host?: string;
  /** When set, every request must carry `Authorization: Bearer <token>` (else 401). */
  readonly token?: string | undefined;
  /** How long one collection answers further scrapes (milliseconds). Default 5,000. */
  readonly metricsMaxAgeMs?: number;
  /**
   * OpenTelemetry `service.name` of the metrics (Prometheus: `target_info`). Default: the
   * `OTEL_SERVICE_NAME` environment variable, else `courier`.
   */
  readonly serviceName?: string;
  /** Where collection failures and the unauthenticated-bind warning go. Default `defaultLogger` (warn and error on stderr). */
  readonly logger?: Logger;
  /** First word of its log lines (`<name> http listening`). Default `metrics`; `courier relay` uses `relay`. */
  readonly logName?: string;
}

/** What {@link CourierMetricsServer.watch} reports on; every member optional. */
export interface CourierMetricsSources {
  /** `/health` answers with its health (200 when ready, 503 when not); `courier.relay.paused` follows it. */
  readonly bus?: Pick<Bus<unknown>, 'health'>;
  /**
   * The outbox gauges (pending, oldest pending age, in flight, dead, halted keys); and, when
   * it tails a replication slot (`PgLogicalOutboxStore`) and `logSlot` is not given, the slot's.
   */
  readonly outbox?: OutboxOperations;
  /**
   * The log-tailing store whose slot gauges to report (lag bytes, unacknowledged age), when it
   * is not `outbox`: `courier relay` passes the relay's own store, the one reading the slot,
   * whose unacknowledged age is the real one (another instance on the same slot reads 0).
   */
  readonly logSlot?: LogSlotOperations;
  /** The inbox gauges: halted keys per consumer (a store with halts), records and dead letters per consumer (a store with `stats()`). */
  readonly inbox?: InboxOperations;
  /** The transport's dead letters per consumer, counted at most once a minute. */
  readonly deadLetters?: { readonly deadLetters: Pick<TransportDeadLetters, 'list'>; readonly consumers: readonly string[] };
}

/** A running metrics endpoint; see {@link serveCourierMetrics}. */
export interface CourierMetricsServer {
  /** Where it listens (the port chosen when `port` was 0). */
  readonly address: { readonly address: string; readonly port: number };
  /** Registers the gauges of `sources` and, with `bus`, answers `/health` from it. Call once per source. */
  watch(sources: CourierMetricsSources): void;
  /** Stops serving, unregisters the gauges and the meter provider. */
  close(): Promise<void>;
}

/**
 * Serves Prometheus `/metrics` and `/health` for a process of your own — a consumer-only
 * service, say — as `courier relay --port` does for the relay: the bus's counters and
 * histograms, and the gauges of what you `watch`.
 *
 * Call it **before** `createBus`: it registers the process's global meter provider (with a
 * Prometheus reader, `PROMETHEUS_VIEWS` for `_seconds` names, and `service.name`), and a
 * bus takes its instruments from the global provider when it is created. A process that
 * already registers an OpenTelemetry SDK should add a Prometheus reader to it instead, with
 * delta temporality for observable gauges (as this endpoint's reader has): a cumulative reader
 * repeats a gauge's last value after a failed read, and the gauge's absence — what
 * `CourierOutboxMetricsAbsent` alerts on — never shows.
 *
 * Guarantees: the same as the relay's endpoint — one collection at a time, reused for
 * `metricsMaxAgeMs`; with `token`, a request without it is answered 401 before anything is
 * read; a non-loopback `host` without a token is logged as a warning. `/health` answers 503
 * until a bus is watched. A gauge whose read failed, or whose subject is gone, is absent from
 * that scrape (never zero, never its last value), and the failure counts in
 * `courier_metrics_read_failures_total`.
 */
export async function serveCourierMetrics(options: CourierMetricsOptions): Promise<CourierMetricsServer> {
  const logger = options.logger ?? defaultLogger;
  const host = options.host ?? '127.0.0.1';
  // Loaded here, not with the module: `@courier/cli`'s index (which every courier.config.ts
  // imports for defineCourierConfig) re-exports this function, and the exporter with its
  // HTTP server was 0.7 s of a 7.3 s `courier stats` (CPU profile, loaded 2-core machine).
  const { PrometheusSerializer } = await import('@opentelemetry/exporter-prometheus');
  const reader = new ScrapeReader();
  const provider = new MeterProvider({
    readers: [reader],
    views: [...PROMETHEUS_VIEWS],
    resource: resourceFromAttributes({ 'service.name': options.serviceName ?? (process.env['OTEL_SERVICE_NAME'] || 'courier') }),
  });
  metrics.setGlobalMeterProvider(provider);
  const cleanups: (() => void)[] = [];
  let bus: Pick<Bus<unknown>, 'health'> | undefined;
  const serializer = new PrometheusSerializer('', false);
  let served: Awaited<ReturnType<typeof serveRelayHttp>>;
  try {
    served = await serveRelayHttp({
      port: options.port,
      host,
      token: options.token,
      health: () => bus?.health() ?? { ready: false, status: 'starting' },
      collect: async () => {
        const { resourceMetrics, errors } = await reader.collect();
        if (errors.length > 0) logger.warn('metrics collection errors', { errors: errors.map((error) => describeError(error)) });
        return serializer.serialize(resourceMetrics);
      },
      ...(options.metricsMaxAgeMs !== undefined ? { metricsMaxAgeMs: options.metricsMaxAgeMs } : {}),
    });
  } catch (error) {
    await provider.shutdown().catch(() => undefined);
    metrics.disable();
    throw error;
  }
  const { address, port } = served.address;
  const name = options.logName ?? 'metrics';
  logger.info(`${name} http listening`, { host: address, port, endpoints: ['/health', '/metrics'], token: options.token !== undefined });
  if (!isLoopback(host) && options.token === undefined) {
    logger.warn(`${name} http endpoints are reachable from other hosts without authentication; set COURIER_RELAY_TOKEN (or --token, or the token option), or bind loopback`, { host: address });
  }
  return {
    address: { address, port },
    watch(sources) {
      if (sources.bus) {
        bus = sources.bus;
        cleanups.push(observeRelay(sources.bus));
      }
      if (sources.outbox) cleanups.push(observeOutbox(sources.outbox, { logger }));
      // A log-tailing outbox (@courier/pg-logical): its slot's lag, found at runtime.
      const logSlot = sources.logSlot ?? (hasLogSlot(sources.outbox) ? sources.outbox : undefined);
      if (logSlot) cleanups.push(observeLogSlot(logSlot, { logger }));
      if (sources.deadLetters && sources.deadLetters.consumers.length > 0) {
        cleanups.push(observeDeadLetters(sources.deadLetters.deadLetters, sources.deadLetters.consumers, { logger }));
      }
      const { inbox } = sources;
      if (inbox && hasInboxHalts(inbox)) cleanups.push(observeInboxHalts(inbox, { logger }));
      if (inbox && typeof inbox.stats === 'function') cleanups.push(observeInbox(inbox, { logger }));
    },
    async close() {
      for (const cleanup of cleanups.splice(0)) cleanup();
      await new Promise<void>((resolve) => (served.server as Server).close(() => resolve()));
      await provider.shutdown().catch(() => undefined);
      metrics.disable();
    },
  };
}
