import {
  consoleLogger,
  createBus,
  describeError,
  type InboxOperations,
  type Logger,
  type OutboxOperations,
  type TransportDeadLetters,
} from '@courier/core';
import type { CourierRelaySetup } from './config.js';
import { serveCourierMetrics, type CourierMetricsServer } from './metrics-server.js';

/** Arguments of {@link runRelay}. */
export interface RunRelayOptions {
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
 * with the exit code: 0 after a clean stop, 1 when the relay could not start or the stop
 * ran out of time. A second signal during the stop exits at once with 1.
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
    const setup = await options.build(logger);
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
      outbox: options.operations ?? setup.outbox,
      ...(options.inbox ? { inbox: options.inbox } : {}),
      ...(options.deadLetters ? { deadLetters: options.deadLetters } : {}),
    });

    let signalled: (name: string) => void = () => undefined;
    const stopRequested = new Promise<string>((resolve) => {
      signalled = resolve;
    });
    let stopping = false;
    const onSignal = (name: NodeJS.Signals): void => {
      if (stopping) {
        logger.error('second signal during stop; exiting now, leases left to expire', { signal: name });
        process.exit(1);
      }
      stopping = true;
      signalled(name);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    try {
      await bus.start({ relay: true, consumers: false });
      logger.info('relay started', { pid: process.pid });
      const signal = await stopRequested;
      logger.info('relay stopping', { signal, timeoutMs: options.stopTimeoutMs });
      const started = Date.now();
      await bus.stop({ timeoutMs: options.stopTimeoutMs });
      const tookMs = Date.now() - started;
      const counters = bus.health().counters;
      logger.info('relay stopped', { tookMs, published: counters.published, publishFailures: counters.publishFailures });
      await setup.transport.close();
      await setup.outbox.close?.();
      return tookMs > options.stopTimeoutMs ? 1 : 0;
    } finally {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    }
  } catch (error) {
    logger.error('relay failed', { error: describeError(error) });
    return 1;
  } finally {
    await served?.close();
  }
}
