// Scenario 1's adapter pairs (node-postgres, Kysely, Knex; issue 31) run alone, for quick
// before/after pairs without the ~150 s of the whole scenario: the same transactions
// (`adapter-producers.ts`), 8 writers in closed loops, rounds interleaving every mode.
// First, one writer runs each mode's transaction `probe` times while every statement the
// pg driver sends is counted (wrapping `pg.Client.prototype.query`, which Kysely's and Knex's
// pg drivers call too), so the statements and round trips per transaction are printed.
//
// With `--cost <transactions>` it measures instead what one transaction costs, one writer per
// library (so waiting hides no CPU): this process's CPU, the serving PostgreSQL backend's CPU
// (its /proc/<pid>/schedstat: run it on the database's machine) and the wall time, per
// transaction, medians over the rounds; rounds alternate the modes' order (A, B, B, A…). CPU
// time is what a loaded machine distorts least.
//
//   node --conditions=@courier/source --import tsx src/adapter-producer-lines.ts [seconds] [rounds] [libraries] [--cost transactions]
//   (libraries: comma list of pg,kysely,knex; default all; add --cpu-prof before --import to profile)
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { ADAPTER_PAIRS, adapterProducers, type AdapterMode } from './adapter-producers.js';
import { closedLoop } from './ceilings.js';
import { interleaved, median } from './scenarios/context.js';
import { WRITERS } from './scenarios/producer.js';
import { openDb, runId, statementShape } from './setup.js';

const costAt = process.argv.indexOf('--cost');
const cost = costAt < 0 ? undefined : Number(process.argv[costAt + 1]);
const args = costAt < 0 ? process.argv.slice(2) : [...process.argv.slice(2, costAt), ...process.argv.slice(costAt + 2)];
const seconds = Number(args[0] ?? 4);
const rounds = Number(args[1] ?? 3);
const wanted = (args[2] ?? 'pg,kysely,knex').split(',');
const probe = 200;
const LIBRARY: Record<string, (typeof ADAPTER_PAIRS)[number]['library']> = { pg: 'node-postgres', kysely: 'Kysely', knex: 'Knex' };
const unknown = wanted.filter((name) => LIBRARY[name] === undefined);
if (unknown.length > 0 || !(seconds > 0) || !(rounds > 0) || (cost !== undefined && !(cost > 0))) {
  console.error(`usage: adapter-producer-lines.ts [seconds > 0] [rounds > 0] [pg,kysely,knex] [--cost transactions > 0]${unknown.length > 0 ? ` (unknown: ${unknown.join(', ')})` : ''}`);
  process.exit(2);
}
const pairs = ADAPTER_PAIRS.filter((pair) => wanted.some((name) => LIBRARY[name] === pair.library));
const modes: AdapterMode[] = pairs.flatMap((pair) => [pair.hand, pair.courier]);

const statements = new Map<string, number>();
let counting = false;
const query = pg.Client.prototype.query as (...args: unknown[]) => unknown;
pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]): unknown {
  if (counting) {
    const shape = statementShape(args[0], 90);
    statements.set(shape, (statements.get(shape) ?? 0) + 1);
  }
  return query.apply(this, args);
} as typeof pg.Client.prototype.query;

const prefix = `bench_${runId()}_adp`;
const db = await openDb('postgresql', { prefix, poolMax: 2, wakeups: false });
const adapters = adapterProducers(db, prefix, cost === undefined ? WRITERS : 1);
let serial = 0;
try {
  for (const mode of modes) {
    for (let i = 0; i < 50; i += 1) await adapters.run[mode](`w-${(serial += 1)}`);
    statements.clear();
    counting = true;
    for (let i = 0; i < probe; i += 1) await adapters.run[mode](`p-${(serial += 1)}`);
    counting = false;
    const total = [...statements.values()].reduce((sum, n) => sum + n, 0);
    console.log(`${mode}: ${(total / probe).toFixed(2)} statements per transaction`);
    for (const [shape, n] of statements) console.log(`    ${(n / probe).toFixed(2)} × ${shape}`);
  }
  if (cost !== undefined) {
    await measureCost(cost);
  } else {
    await measureRates();
  }
} finally {
  await adapters.close();
  await db.close();
}

/** CPU time a backend has run, µs (schedstat's first field: nanoseconds on a CPU). */
function backendCpu(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1000;
}

async function measureCost(transactions: number): Promise<void> {
  const samples = new Map<AdapterMode, { client: number[]; server: number[]; wall: number[] }>(modes.map((mode) => [mode, { client: [], server: [], wall: [] }]));
  for (let round = 0; round < rounds; round += 1) {
    for (const mode of round % 2 === 0 ? modes : [...modes].reverse()) {
      const library = pairs.find((pair) => pair.hand === mode || pair.courier === mode)!.library;
      const pid = await adapters.backendPid[library]();
      const serverBefore = backendCpu(pid);
      const clientBefore = process.cpuUsage();
      const started = performance.now();
      for (let i = 0; i < transactions; i += 1) await adapters.run[mode](`c-${(serial += 1)}`);
      const wall = ((performance.now() - started) * 1000) / transactions;
      const client = process.cpuUsage(clientBefore);
      const server = (backendCpu(pid) - serverBefore) / transactions;
      // A pool that replaced its connection mid-round would leave the server's count short.
      if ((await adapters.backendPid[library]()) !== pid) console.log(`${mode}: the backend changed in round ${round}; not counted`);
      else samples.get(mode)!.server.push(server);
      samples.get(mode)!.client.push((client.user + client.system) / transactions);
      samples.get(mode)!.wall.push(wall);
    }
  }
  for (const mode of modes) {
    const s = samples.get(mode)!;
    console.log(`${mode}: client CPU ${median(s.client).toFixed(0)} µs, backend CPU ${median(s.server).toFixed(0)} µs, wall ${median(s.wall).toFixed(0)} µs per transaction (1 writer, median of ${rounds} rounds of ${transactions})`);
  }
}

async function measureRates(): Promise<void> {
  const rates = await interleaved(modes, rounds, (mode) => closedLoop(WRITERS, seconds, () => adapters.run[mode](`o-${(serial += 1)}`)));
  for (const pair of pairs) {
    const hand = rates[pair.hand];
    const courier = rates[pair.courier];
    console.log(`${pair.library}: hand-written ${hand.toFixed(0)} commits/s, Courier ${courier.toFixed(0)} commits/s, ratio ${(courier / hand).toFixed(3)} (${WRITERS} writers, median of ${rounds} rounds of ${seconds} s)`);
  }
}
