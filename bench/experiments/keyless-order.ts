// The relay drain with and without keys, alternated in one process (bench/README.md, "Full run,
// quiet machine": on MariaDB the keyless drain of 100k ran slower than the keyed one, 0.30 × raw).
// Each drain starts from an emptied outbox; the order is given, so an order effect (purge of the
// previous drain's changes, a warmer buffer pool) shows as a difference between the two orders.
//
//   node --conditions=@courier/source --import tsx experiments/keyless-order.ts [mariadb|postgresql] [rows] [keyless,keyed,…]
import { loadavg } from 'node:os';
import { relayDrain, truncate } from '../src/scenarios/drain.js';
import { BenchBroker, openDb, type Dialect } from '../src/setup.js';
const dialect: Dialect = process.argv[2] === 'postgresql' ? 'postgresql' : 'mariadb';
const count = Number(process.argv[3] ?? 100_000);
const order = (process.argv[4] ?? 'keyless,keyed,keyless,keyed').split(',');
const prefix = `kord${Date.now().toString(36)}`;
const db = await openDb(dialect, { prefix, wakeups: false });
const broker = new BenchBroker(prefix);
try {
  await broker.declareSink();
  for (const kind of order) {
    await truncate(db);
    const run = await relayDrain(db, broker, count, { keyless: kind === 'keyless' });
    const load = loadavg()[0]!.toFixed(1);
    console.log(`${kind}: ${Math.round(run.rate)} msg/s, cpu ${((run.cpuSeconds * 1e6) / count).toFixed(1)} µs/msg, load ${load}`);
  }
} finally {
  await broker.close();
  await db.close();
}
