import { build, type Histogram } from 'hdr-histogram-js';

/** Percentiles of one latency distribution, in milliseconds. */
export interface LatencySummary {
  readonly count: number;
  readonly p50: number;
  readonly p95: number;
  readonly p99: number;
  readonly max: number;
}

/**
 * A latency histogram (HdrHistogram, 3 significant digits, microsecond resolution, up to
 * 10 minutes). Values are recorded in milliseconds and reported in milliseconds.
 */
export class LatencyHistogram {
  readonly #histogram: Histogram = build({ lowestDiscernibleValue: 1, highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: 3 });

  recordMs(ms: number): void {
    this.#histogram.recordValue(Math.max(1, Math.round(ms * 1000)));
  }

  get count(): number {
    return this.#histogram.totalCount;
  }

  summary(): LatencySummary {
    const h = this.#histogram;
    const at = (percentile: number) => round(h.getValueAtPercentile(percentile) / 1000);
    return { count: h.totalCount, p50: at(50), p95: at(95), p99: at(99), max: round(h.maxValue / 1000) };
  }
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
