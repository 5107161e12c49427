import type { ServiceName } from '../options.js';
import type { ScenarioReport } from '../report.js';

/** What a scenario gets from the runner. */
export interface ScenarioContext {
  readonly quick: boolean;
  /** Prefix of this scenario's tables and queues (unique per run and scenario). */
  readonly prefix: string;
  readonly report: ScenarioReport;
  /** Numbers earlier scenarios of the same run share (e.g. the producer's maximum rate). */
  readonly shared: Map<string, number>;
}

/** A scenario of issue 5. */
export interface Scenario {
  readonly id: number;
  readonly name: string;
  readonly services: readonly ServiceName[];
  run(context: ScenarioContext): Promise<void>;
}

/** Median of a non-empty list. */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** Runs `modes` interleaved `rounds` times and returns each mode's median (noise on a shared machine). */
export async function interleaved<M extends string>(modes: readonly M[], rounds: number, measure: (mode: M) => Promise<number>): Promise<Record<M, number>> {
  const runs = new Map<M, number[]>(modes.map((mode) => [mode, []]));
  for (let round = 0; round < rounds; round += 1) {
    for (const mode of modes) runs.get(mode)!.push(await measure(mode));
  }
  return Object.fromEntries(modes.map((mode) => [mode, median(runs.get(mode)!)])) as Record<M, number>;
}
