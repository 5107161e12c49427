// Where the relay allocates per message (target 12, the relay process's RSS): drains a seeded
// PostgreSQL backlog into RabbitMQ with Courier's relay in this process under V8's sampling
// heap profiler, and prints bytes per message by allocating package, by allocation site, and
// by the first Courier frame on the allocating stack.
//
//   node --conditions=@courier/source --import tsx experiments/relay-heap-profile.ts [all|promoted] [rows]
//
// `all` counts every sampled allocation, collected or not (the allocation rate, which sizes
// V8's young generation). `promoted` leaves out what the young generation's scavenges
// collected: what remains survived them — promoted into old space, where it waits for a full
// GC (what grows the relay process's old space and RSS) — or is still live at the end.
// `none` samples nothing (for V8's own tracing: `node --trace-gc-verbose …` prints the heap
// growing factor each full GC picks). A 2,000-row drain first warms the code up; only the
// measured drain is sampled.
import { Session } from 'node:inspector/promises';
import { BenchBroker, benchBus, openDb, runId, seedBacklog, until } from '../src/setup.js';
import { scriptOwner } from './script-owner.js';

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: ProfileNode[];
}

const mode = process.argv[2] === 'promoted' || process.argv[2] === 'none' ? process.argv[2] : 'all';
const rows = Number(process.argv[3] ?? 20_000);
const WARM_UP = 2_000;


function add(totals: Map<string, number>, key: string, bytes: number): void {
  totals.set(key, (totals.get(key) ?? 0) + bytes);
}

/** `function package/file:line` of a frame. */
function frameName(frame: ProfileNode): string {
  const { functionName, url, lineNumber } = frame.callFrame;
  return `${functionName || '(anonymous)'} ${scriptOwner(url) ?? ''}/${url.split('/').pop() ?? ''}:${lineNumber + 1}`;
}

/** Sums each node's self size by package (a frame without a script takes its caller's), site and first Courier frame. */
function attribute(root: ProfileNode): { byPackage: Map<string, number>; bySite: Map<string, number>; byCourier: Map<string, number>; total: number } {
  const byPackage = new Map<string, number>();
  const bySite = new Map<string, number>();
  const byCourier = new Map<string, number>();
  let total = 0;
  const walk = (node: ProfileNode, stack: readonly ProfileNode[]) => {
    const frames = [...stack, node];
    if (node.selfSize > 0) {
      total += node.selfSize;
      const scripted = [...frames].reverse().find((frame) => scriptOwner(frame.callFrame.url) !== undefined);
      add(byPackage, scripted ? scriptOwner(scripted.callFrame.url)! : '(no script on the stack)', node.selfSize);
      add(bySite, `${frameName(node)}${scripted && scripted !== node ? ` ← ${frameName(scripted)}` : ''}`, node.selfSize);
      const courier = [...frames].reverse().find((frame) => scriptOwner(frame.callFrame.url)?.startsWith('@courier/'));
      add(byCourier, courier ? frameName(courier) : '(no Courier frame)', node.selfSize);
    }
    for (const child of node.children) walk(child, frames);
  };
  walk(root, []);
  return { byPackage, bySite, byCourier, total };
}

function print(title: string, totals: Map<string, number>, limit: number): void {
  console.log(`\n${title}`);
  for (const [key, bytes] of [...totals].sort((a, b) => b[1] - a[1]).slice(0, limit)) console.log(`  ${(bytes / rows).toFixed(0).padStart(6)} B/msg  ${key}`);
}

const prefix = `${runId()}_heap`;
const db = await openDb('postgresql', { prefix });
const broker = new BenchBroker(prefix);
const transport = broker.transport();
const bus = benchBus(db, transport);
const session = new Session();
try {
  await broker.declareSink();
  await seedBacklog(db, WARM_UP);
  await bus.start({ relay: true, consumers: false });
  await until(() => bus.health().counters.published >= WARM_UP, 600_000, 'the warm-up drain');
  session.connect();
  await session.post('HeapProfiler.enable');
  if (mode !== 'none') {
    await session.post('HeapProfiler.startSampling', { samplingInterval: 8_192, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: mode === 'all' });
  }
  const started = performance.now();
  await seedBacklog(db, rows, { from: WARM_UP + 1 });
  bus.wake();
  await until(() => bus.health().counters.published >= WARM_UP + rows, 600_000, `the drain of ${rows}`);
  const seconds = (performance.now() - started) / 1000;
  if (mode === 'none') {
    console.log(`none: ${rows} messages in ${seconds.toFixed(1)} s`);
  } else {
    const { profile } = (await session.post('HeapProfiler.stopSampling')) as { profile: { head: ProfileNode } };
    const { byPackage, bySite, byCourier, total } = attribute(profile.head);
    console.log(`${mode}: ${rows} messages in ${seconds.toFixed(1)} s; sampled ${(total / rows).toFixed(0)} B/msg (${(total / 1024 / 1024).toFixed(0)} MB)`);
    print('by package of the allocating script (a frame without one: its nearest caller with one)', byPackage, 15);
    print('by the first Courier frame on the stack', byCourier, 15);
    print('by allocation site (← the nearest scripted caller)', bySite, 30);
  }
} finally {
  session.disconnect();
  await bus.stop({ timeoutMs: 10_000 });
  await transport.close();
  await broker.close();
  await db.close();
}
