import {
  consoleLogger,
  createBus,
  describeError,
  hasLogSlot,
  type InboxOperations,
  type Logger,
  type OutboxOperations,
  type TransportDeadLetters,
} from '@courier/core';
import type { CourierRelaySetup } from './config.js';
import { serveCourierMetrics, type CourierMetricsServer } from './metrics-server.js';

/**
 * What `courier relay` builds from the config before it can start: the relay's wiring and
 * the sources of its gauges.
 */
export interface PreparedRelay {
  readonly build: (logger: Logger) => CourierRelaySetup<unknown> | Promise<CourierRelaySetup<unknown>>;
  /** Gauges come from here when given, else from the relay's own outbox store. */
  readonly operations?: OutboxOperations;
  /**
   * The transport dead letters and the consumers whose depth `/metrics` reports as
   * `courier.transport.dead_letters` (the config's `transport` and `consumers`, as
   * `courier stats` shows them). Absent or no consumers: no such gauge.
   */
  readonly deadLetters?: { readonly deadLetters: Pick<TransportDeadLetters, 'list'>; readonly consumers: readonly string[] };
  /**
   * The config's inbox, when it has one: `/metrics` then reports its halted keys
   * (`courier.inbox.halted_keys`, when the store has halts) and, when it has `stats()`, its
   * dead letters, records and oldest record per consumer.
   */
  readonly inbox?: InboxOperations;
}

/** Arguments of {@link runRelay}. */
export interface RunRelayOptions {
  /**
   * Builds the config's objects (runs the config function). Called again, with capped
   * backoff, while it fails with an error `retryWhen` accepts: a config whose ORM connects
   * at init (MikroORM's default `connect: true`) fails while the database is down, and a
   * relay container must then wait for it, not crash-loop.
   */
  readonly prepare: () => Promise<PreparedRelay>;
  /** Whether a failure of `prepare` (or of the relay's `build`) is worth waiting out: the database or broker unreachable. */
  readonly retryWhen: (error: unknown) => boolean;
  /** First wait between two tries of `prepare` (milliseconds, doubling to 30 s). Default 1,000. */
  readonly retryInitialMs?: number;
  readonly port: number | undefined;
  readonly host: string;
  /** With `port`: requests must carry `Authorization: Bearer <token>` (else 401). */
  readonly token?: string | undefined;
  /** With `port`: how long one metrics collection answers scrapes (milliseconds). Default 5,000. */
  readonly metricsMaxAgeMs?: number;
  readonly stopTimeoutMs: number;
  readonly logger?: Logger;
}

/**
 * Runs the relay alone until SIGTERM or SIGINT, then stops it gracefully (the batch in
 * hand finishes within `stopTimeoutMs`, the rest of its leases are released) and resolves
 * with the exit code: 0 after a clean stop (also when stopped while still waiting to
 * start), 1 when the relay could not start or the stop ran out of time. A second signal
 * during the stop exits at once with 1. Rejects with the error of `prepare` when it is not
 * one to wait out (a bad config, a refused login), so the CLI reports it with its remedy.
 *
 * Waits instead of exiting while the database or broker is unreachable at start
 * (`retryWhen`): `prepare` and the relay's `build` are tried again with capped backoff,
 * each wait logged at warn, and `/health` answers 503 meanwhile; once built, the bus's
 * relay itself keeps claiming through an outage (paused, not failed).
 *
 * With `port`, serves `/health` (the bus's health as JSON: 200 when ready, 503 when not)
 * and `/metrics` (Prometheus text: the bus's counters and histograms, the outbox and relay
 * gauges, the transport dead-letter depth of `deadLetters`' consumers, and the inbox's
 * halted keys and per-consumer gauges when `inbox` is given and has them) on `host`, behind
 * `token` when given. One collection (and so one outbox `stats()` and halt listing) runs at a
 * time and answers every scrape for `metricsMaxAgeMs` (see {@link serveRelayHttp}); a
 * non-loopback `host` without a token is logged as a warning.
 * The process's own meter provider is registered globally before the bus is built, so
 * the library's `@opentelemetry/api` instruments report into it.
 */
export async function runRelay(options: RunRelayOptions): Promise<number> {
  const logger = options.logger ?? consoleLogger('info');
  let served: CourierMetricsServer | undefined;
  const stopRequested = new AbortController();
  let stopSignal = '';
  const onSignal = (name: NodeJS.Signals): void => {
    if (stopRequested.signal.aborted) {
      logger.error('second signal during stop; exiting now, leases left to expire', { signal: name });
      process.exit(1);
    }
    stopSignal = name;
    stopRequested.abort();
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  try {
    // Serving before the config's objects are built: `/health` says not ready (503) while the
    // relay waits for its database, instead of refusing connections.
    if (options.port !== undefined) {
      served = await serveCourierMetrics({
        port: options.port,
        host: options.host,
        token: options.token,
        logger,
        logName: 'relay',
        serviceName: process.env['OTEL_SERVICE_NAME'] || 'courier-relay',
        ...(options.metricsMaxAgeMs !== undefined ? { metricsMaxAgeMs: options.metricsMaxAgeMs } : {}),
      });
    }
    const started = await startWhenReachable(options, logger, stopRequested.signal);
    if (started === undefined) {
      logger.info('relay stopped before it started', { signal: stopSignal });
      return 0;
    }
    const { prepared, setup } = started;
    try {
      const bus = createBus({
        outbox: setup.outbox,
        transport: setup.transport,
        logger,
        ...(setup.relay ? { relay: setup.relay } : {}),
        onKeyHalted:
          setup.onKeyHalted ??
          ((topic, key, error) => {
            logger.error('key halted; resume it with `courier halted resume`', { topic, key, error });
          }),
      });
      served?.watch({
        bus,
        outbox: prepared.operations ?? setup.outbox,
        // The slot's gauges from the store that reads it (the config's operator outbox may be another instance).
        ...(hasLogSlot(setup.outbox) ? { logSlot: setup.outbox } : {}),
        ...(prepared.inbox ? { inbox: prepared.inbox } : {}),
        ...(prepared.deadLetters ? { deadLetters: prepared.deadLetters } : {}),
      });
      await bus.start({ relay: true, consumers: false });
      logger.info('relay started', { pid: process.pid });
      await aborted(stopRequested.signal);
      logger.info('relay stopping', { signal: stopSignal, timeoutMs: options.stopTimeoutMs });
      const stopStarted = Date.now();
      await bus.stop({ timeoutMs: options.stopTimeoutMs });
      const tookMs = Date.now() - stopStarted;
      const counters = bus.health().counters;
      logger.info('relay stopped', { tookMs, published: counters.published, publishFailures: counters.publishFailures });
      await setup.transport.close();
      await setup.outbox.close?.();
      return tookMs > options.stopTimeoutMs ? 1 : 0;
    } catch (error) {
      logger.error('relay failed', { error: describeError(error) });
      return 1;
    }
  } catch (error) {
    // The config's own failure goes to the CLI, which prints it with its remedy and exit code.
    if (error instanceof PrepareFailed) throw error.error;
    logger.error('relay failed', { error: describeError(error) });
    return 1;
  } finally {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
    await served?.close();
  }
}

/** Longest wait between two tries of building the relay while its servers are unreachable. */
const START_RETRY_MAX_MS = 30_000;

/**
 * Runs `prepare` and the relay's `build` until both succeed, waiting out the failures
 * `retryWhen` accepts (capped exponential backoff with jitter). Undefined when `signal`
 * stops it first; rethrows any other failure.
 */
async function startWhenReachable(
  options: RunRelayOptions,
  logger: Logger,
  signal: AbortSignal,
): Promise<{ prepared: PreparedRelay; setup: CourierRelaySetup<unknown> } | undefined> {
  let delayMs = options.retryInitialMs ?? 1_000;
  for (let attempt = 1; ; attempt += 1) {
    try {
      const prepared = await options.prepare();
      const setup = await prepared.build(logger);
      if (attempt > 1) logger.info('relay can start: its servers are reachable again', { attempt });
      return { prepared, setup };
    } catch (error) {
      if (!options.retryWhen(error)) throw new PrepareFailed(error);
      if (signal.aborted) return undefined;
      const waitMs = Math.round(delayMs * (0.5 + Math.random() / 2));
      logger.warn('relay cannot start yet: database or broker unreachable; retrying (GET /health answers 503 meanwhile)', {
        attempt,
        retryInMs: waitMs,
        error: describeError(error),
      });
      await aborted(signal, waitMs);
      if (signal.aborted) return undefined;
      delayMs = Math.min(START_RETRY_MAX_MS, delayMs * 2);
    }
  }
}

/** Carries a failure of building the config's objects that is not waited out. */
class PrepareFailed {
  constructor(readonly error: unknown) {}
}

/** Resolves when `signal` aborts, or after `timeoutMs` when given. */
function aborted(signal: AbortSignal, timeoutMs?: number): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = timeoutMs === undefined ? undefined : setTimeout(done, timeoutMs);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
