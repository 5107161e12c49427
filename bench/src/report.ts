import type { LatencySummary } from './histogram.js';

/** One measured number; `ceiling` names the line it is compared with. */
export interface Measurement {
  readonly label: string;
  readonly value: number;
  readonly unit: string;
  /** Label of the ceiling line in the same scenario this one is a ratio of. */
  readonly vs?: string;
  readonly ratio?: number;
  readonly note?: string;
}

/** One latency distribution. */
export interface LatencyLine {
  readonly label: string;
  /** Offered load, e.g. "2,400 msg/s (open loop)" or "flat out". */
  readonly load: string;
  readonly summary: LatencySummary;
}

/** A target of issue 14 (issue 5's, where 14 did not restate it), recorded as met or missed. */
export interface TargetResult {
  readonly target: string;
  readonly actual: string;
  readonly met: boolean;
}

export type ScenarioStatus = 'ok' | 'failed' | 'not requested' | 'not selected';

export interface ScenarioResult {
  readonly id: number;
  readonly name: string;
  readonly status: ScenarioStatus;
  readonly measurements: readonly Measurement[];
  readonly latencies: readonly LatencyLine[];
  readonly targets: readonly TargetResult[];
  readonly notes: readonly string[];
  readonly seconds: number;
}

/** Collects what one scenario measures. */
export class ScenarioReport {
  readonly measurements: Measurement[] = [];
  readonly latencies: LatencyLine[] = [];
  readonly targets: TargetResult[] = [];
  readonly notes: string[] = [];

  /** Records a line and prints it at once. */
  measure(label: string, value: number, unit: string, options: { vs?: string; note?: string } = {}): Measurement {
    const ceiling = options.vs === undefined ? undefined : this.measurements.find((line) => line.label === options.vs);
    const ratio = ceiling && ceiling.value > 0 ? round(value / ceiling.value, 3) : undefined;
    const line: Measurement = {
      label,
      value: round(value, 1),
      unit,
      ...(options.vs !== undefined ? { vs: options.vs } : {}),
      ...(ratio !== undefined ? { ratio } : {}),
      ...(options.note !== undefined ? { note: options.note } : {}),
    };
    this.measurements.push(line);
    console.log(`    ${label}: ${formatNumber(line.value)} ${unit}${ratio !== undefined ? ` (${ratio.toFixed(2)} × ${options.vs})` : ''}${options.note ? ` — ${options.note}` : ''}`);
    return line;
  }

  latency(label: string, load: string, summary: LatencySummary): void {
    this.latencies.push({ label, load, summary });
    console.log(`    ${label} @ ${load}: n=${summary.count} p50 ${summary.p50} ms, p95 ${summary.p95} ms, p99 ${summary.p99} ms, max ${summary.max} ms`);
  }

  target(target: string, actual: string, met: boolean): void {
    this.targets.push({ target, actual, met });
    console.log(`    target ${target}: ${actual} — ${met ? 'met' : 'MISSED'}`);
  }

  note(text: string): void {
    this.notes.push(text);
  }
}

/** The whole run, as written to JSON. */
export interface BenchRun {
  readonly startedAt: string;
  readonly mode: 'quick' | 'full';
  readonly machine: Record<string, string | number>;
  readonly scenarios: readonly ScenarioResult[];
}

export function round(value: number, digits: number): number {
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}

export function formatNumber(value: number): string {
  if (Math.abs(value) >= 100) return Math.round(value).toLocaleString('en-US');
  return String(round(value, 2));
}

/** The Markdown tables: throughput lines with ratios, latency histograms, targets. */
export function markdown(run: BenchRun): string {
  const lines: string[] = [];
  lines.push(`Run ${run.startedAt} (${run.mode}) on ${Object.entries(run.machine).map(([key, value]) => `${key}: ${value}`).join(', ')}.`, '');
  lines.push('| # | scenario | measurement | value | ratio | of ceiling |', '|---|---|---|---:|---:|---|');
  for (const scenario of run.scenarios) {
    if (scenario.status !== 'ok') {
      lines.push(`| ${scenario.id} | ${scenario.name} | *${scenario.status}* | | | |`);
      continue;
    }
    for (const line of scenario.measurements) {
      lines.push(
        `| ${scenario.id} | ${scenario.name} | ${line.label}${line.note ? ` (${line.note})` : ''} | ${formatNumber(line.value)} ${line.unit} | ${line.ratio !== undefined ? line.ratio.toFixed(2) : ''} | ${line.vs ?? ''} |`,
      );
    }
  }
  const latencies = run.scenarios.flatMap((scenario) => scenario.latencies.map((line) => ({ scenario, line })));
  if (latencies.length > 0) {
    lines.push('', '| # | latency (ms) | offered load | n | p50 | p95 | p99 | max |', '|---|---|---|---:|---:|---:|---:|---:|');
    for (const { scenario, line } of latencies) {
      const s = line.summary;
      lines.push(`| ${scenario.id} | ${line.label} | ${line.load} | ${s.count} | ${s.p50} | ${s.p95} | ${s.p99} | ${s.max} |`);
    }
  }
  const targets = run.scenarios.flatMap((scenario) => scenario.targets.map((target) => ({ scenario, target })));
  if (targets.length > 0) {
    lines.push('', '| # | target | actual | result |', '|---|---|---|---|');
    for (const { scenario, target } of targets) lines.push(`| ${scenario.id} | ${target.target} | ${target.actual} | ${target.met ? 'met' : '**missed**'} |`);
  }
  const notes = run.scenarios.flatMap((scenario) => scenario.notes.map((note) => `- ${scenario.id}. ${note}`));
  if (notes.length > 0) lines.push('', ...notes);
  return `${lines.join('\n')}\n`;
}
