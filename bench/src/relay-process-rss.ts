// Target 12 alone: the relay-only process of scenario 2 (the startup worker: MikroORM +
// RabbitMQ, default relay settings) draining a seeded PostgreSQL backlog, without the raw
// loops and the in-process drains around it, so before/after pairs of a change can be
// alternated in minutes. Prints the worker's peak RSS (start-up included), CPU per message,
// rate and V8's spaces, the same figures `--only 2` reports for this line.
//
//   node --conditions=@courier/source --import tsx src/relay-process-rss.ts [rows] [node flags…]
//
// The worker runs the built packages when every one has a dist/ (`pnpm build`: what users
// run, and what target 12 is measured on), the sources through tsx otherwise.
import { BenchBroker, openDb, runId, seedBacklog } from './setup.js';
import { builtPackages, startWorker, workerConfig } from './scenarios/startup.js';

const rows = Number(process.argv[2] ?? 100_000);
const nodeFlags = process.argv.slice(3);
const prefix = `${runId()}_rss`;
const db = await openDb('postgresql', { prefix, wakeups: false });
const broker = new BenchBroker(prefix);
try {
  await broker.declareSink();
  await seedBacklog(db, rows);
  const built = builtPackages();
  const marks = await startWorker({ role: 'relay', ormLoader: 'require', nodeFlags }, workerConfig(prefix, broker.prefix, { drain: rows }), built, 3_600_000);
  const m = (name: string): number => marks.get(`drain.${name}`) ?? Number.NaN;
  const mb = (name: string): string => m(name).toFixed(0);
  console.log(
    `relay-only process draining ${rows}${nodeFlags.length > 0 ? ` (node ${nodeFlags.join(' ')})` : ''}, ${built ? 'built packages' : 'sources through tsx'}: ` +
      `peak RSS ${m('maxRssMb').toFixed(1)} MB; CPU ${((m('cpuSeconds') * 1e6) / rows).toFixed(1)} µs/msg; ${(rows / m('seconds')).toFixed(0)} msg/s; ` +
      `at start RSS ${mb('startRssMb')} MB; peaks: new space ${mb('peakNewSpaceMb')} MB, old space ${mb('peakOldSpaceMb')} MB, ` +
      `heap ${mb('peakHeapUsedMb')} of ${mb('peakHeapTotalMb')} MB; live after full GC ${m('liveHeapAfterGcMb').toFixed(1)} MB`,
  );
} finally {
  await broker.close();
  await db.close();
}
