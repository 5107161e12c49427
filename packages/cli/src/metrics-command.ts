// `courier metrics`: the config's relay and consumer endpoints read twice, a window apart —
// the same reader the console's charts and process list use.
import type { CourierCliSetup } from './config.js';
import { formatDuration, table, toJson, UsageError } from './format.js';
import { METRIC_ALERTS, ratesBetween, readMetrics, relayLeasesText, type EndpointRead, type MetricsRates } from './metrics-read.js';

/** What `courier metrics` prints with `--json`. */
export interface MetricsReport {
  readonly endpoints: readonly EndpointRead[];
  readonly rates: MetricsRates;
  /** Alerts of docs/operations.md the endpoints decide, by name, that would fire now. */
  readonly firing: readonly string[];
}

/** Reads the endpoints, waits `windowMs`, reads them again, and reports rates between the two. */
export async function metricsReport(setup: CourierCliSetup, windowMs: number, wait: (ms: number) => Promise<void>): Promise<MetricsReport> {
  const endpoints = setup.metrics ?? [];
  if (endpoints.length === 0) {
    throw new UsageError("the courier config names no 'metrics' endpoints; add metrics: ['http://127.0.0.1:9464'] (the /metrics and /health of each `courier relay --port` and serveCourierMetrics process)");
  }
  const first = await readMetrics(endpoints);
  await wait(windowMs);
  const second = await readMetrics(endpoints);
  const rates = ratesBetween(first, second);
  return { endpoints: second, rates, firing: firingOf(second, rates) };
}

/** The alerts the endpoints decide (`CourierPublishLatency`, relay paused, `CourierPublishFailing`) firing on this read. */
export function firingOf(reads: readonly EndpointRead[], rates: MetricsRates): string[] {
  const firing: string[] = [];
  if (rates.commitToConfirmP99 !== null && rates.commitToConfirmP99 > METRIC_ALERTS.publishLatencySeconds) firing.push('CourierPublishLatency');
  if (reads.some((read) => (read.totals?.relayPaused ?? 0) > 0)) firing.push('CourierRelayPaused');
  if (rates.publishFailuresPerSecond > 0) firing.push('CourierPublishFailing');
  if (rates.deadLettered > 0) firing.push('CourierDeadLettering');
  return firing;
}

const seconds = (value: number | null): string => (value === null ? '-' : formatDuration(value * 1000));

/** The human rendering of {@link metricsReport}. */
export function renderMetrics(report: MetricsReport, json: boolean): string {
  if (json) return toJson(report);
  const rows = report.endpoints.map((read) => {
    const relay = read.health?.relay;
    const consumers = read.health?.consumers ?? [];
    return [
      read.name,
      read.up ? 'up' : 'DOWN',
      read.health ? `${read.health.status}${read.health.ready ? '' : ' (not ready)'}` : '-',
      relay?.running
        ? `${relay.paused ? 'PAUSED' : 'running'}, last claim ${relay.sinceLastClaimMs < 0 ? 'never' : `${formatDuration(relay.sinceLastClaimMs)} ago`}${relayLeasesText(relay) ? `; ${relayLeasesText(relay)}` : ''}`
        : '-',
      consumers.length === 0 ? '-' : consumers.map((one) => `${one.consumer}${one.connected ? '' : ' (not connected)'} ${one.inFlight} in flight`).join(', '),
      read.error ?? '',
    ];
  });
  const r = report.rates;
  const window = formatDuration(Math.max(0, r.to - r.from));
  return [
    table(['ENDPOINT', 'METRICS', 'HEALTH', 'RELAY', 'CONSUMERS', 'ERROR'], rows),
    '',
    `over ${window}: published ${r.publishedPerSecond.toFixed(2)}/s, handled ${r.processedPerSecond.toFixed(2)}/s, publish failures ${r.publishFailuresPerSecond.toFixed(2)}/s, dead-lettered ${r.deadLettered}`,
    `p99: commit → confirm ${seconds(r.commitToConfirmP99)}, publish → handler ${seconds(r.occurredToHandlerP99)}, handler ${seconds(r.handlerP99)}, delivery → ack ${seconds(r.deliveryToAckP99)}`,
    report.firing.length > 0 ? `FIRING: ${report.firing.join(', ')}` : 'no alert the endpoints decide would fire',
  ].join('\n');
}
