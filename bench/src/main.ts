// Courier's benchmarks: every run measures the raw ceilings first, then Courier on the
// same work, and reports each result as a ratio of its ceiling (issue 5).
//
//   pnpm bench [--quick] [--only scenario,…] [--services …] [--json out.json]
//
// Results: printed as a Markdown table, and written as JSON and Markdown to --json (or
// bench/results/latest.json and .md).
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions, type ServiceName } from './options.js';
import { markdown, ScenarioReport, type BenchRun, type ScenarioResult } from './report.js';
import { checkService, redact, URLS } from './services.js';
import { runId } from './setup.js';
import type { Scenario } from './scenarios/context.js';
import { backlogScenario, drainScenario, mariaDbDrainScenario } from './scenarios/drain.js';
import { inboxScenario } from './scenarios/inbox.js';
import { kafkaScenario } from './scenarios/kafka.js';
import { sqsScenario } from './scenarios/sqs.js';
import { idleScenario, steadyScenario } from './scenarios/latency.js';
import { orderedScenario } from './scenarios/ordered.js';
import { pipelineScenario } from './scenarios/pipeline.js';
import { producerScenario } from './scenarios/producer.js';
import { startupScenario } from './scenarios/startup.js';
import { sqlTransportScenario } from './scenarios/sql-transport.js';

const SCENARIOS: readonly Scenario[] = [producerScenario, drainScenario, backlogScenario, steadyScenario, idleScenario, inboxScenario, orderedScenario, mariaDbDrainScenario, startupScenario, sqlTransportScenario, kafkaScenario, pipelineScenario, sqsScenario];

async function main(): Promise<number> {
  let options;
  try {
    options = parseOptions(process.argv.slice(2));
  } catch (error) {
    console.error(error instanceof Error ? error.message : String(error));
    return 2;
  }
  const selected = SCENARIOS.filter((scenario) => options.only === null || options.only.has(scenario.id));
  const runnable = selected.filter((scenario) => scenario.services.every((service) => options.services.has(service)));
  const needed = new Set<ServiceName>(runnable.flatMap((scenario) => scenario.services));
  // A service that was asked for and does not answer fails the run, loudly, before anything is measured.
  const unreachable: string[] = [];
  for (const service of needed) {
    try {
      await checkService(service);
    } catch (error) {
      unreachable.push(error instanceof Error ? error.message : String(error));
    }
  }
  if (unreachable.length > 0) {
    console.error(`bench cannot run:\n${unreachable.map((line) => `  - ${line}`).join('\n')}\n(ask only for the services you have with --services, e.g. --services postgresql)`);
    return 1;
  }

  const id = runId();
  const mode = options.quick ? 'quick' : 'full';
  console.log(`Courier bench (${mode}), run ${id}; ${[...needed].map((service) => `${service} ${redact(URLS[service])}`).join(', ') || 'no services'}`);
  const started = Date.now();
  const results: ScenarioResult[] = [];
  const shared = new Map<string, number>();
  let failed = false;
  for (const scenario of SCENARIOS) {
    const base = { id: scenario.id, name: scenario.name, measurements: [], latencies: [], targets: [], notes: [], seconds: 0 };
    if (!selected.includes(scenario)) {
      results.push({ ...base, status: 'not selected' });
      continue;
    }
    const missing = scenario.services.filter((service) => !options.services.has(service));
    if (missing.length > 0) {
      results.push({ ...base, status: 'not requested', notes: [`needs ${missing.join(', ')}, which --services did not ask for`] });
      continue;
    }
    console.log(`\n${scenario.id}. ${scenario.name}`);
    const report = new ScenarioReport();
    const scenarioStarted = performance.now();
    let status: ScenarioResult['status'] = 'ok';
    try {
      await scenario.run({ quick: options.quick, prefix: `${id}_${scenario.id}`, report, shared });
    } catch (error) {
      status = 'failed';
      failed = true;
      const text = error instanceof Error ? (error.stack ?? error.message) : String(error);
      console.error(`    FAILED: ${text}`);
      report.note(`failed: ${error instanceof Error ? error.message : String(error)}`);
    }
    const seconds = Math.round((performance.now() - scenarioStarted) / 100) / 10;
    console.log(`    (${seconds} s)`);
    results.push({ ...base, status, measurements: report.measurements, latencies: report.latencies, targets: report.targets, notes: report.notes, seconds });
  }

  const cpu = cpus();
  const run: BenchRun = {
    startedAt: new Date(started).toISOString(),
    mode,
    machine: {
      cpus: cpu.length,
      cpu: cpu[0]?.model.trim() ?? 'unknown',
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      platform: `${process.platform}-${process.arch}`,
    },
    scenarios: results,
  };
  const table = markdown(run);
  console.log(`\n${table}`);
  const jsonPath = options.json ?? join(dirname(fileURLToPath(import.meta.url)), '..', 'results', 'latest.json');
  mkdirSync(dirname(jsonPath), { recursive: true });
  writeFileSync(jsonPath, `${JSON.stringify(run, null, 2)}\n`);
  const mdPath = jsonPath.replace(/\.json$/i, '') + '.md';
  writeFileSync(mdPath, table);
  console.log(`results: ${jsonPath} and ${mdPath} (${Math.round((Date.now() - started) / 1000)} s)`);
  return failed ? 1 : 0;
}

process.exitCode = await main();
