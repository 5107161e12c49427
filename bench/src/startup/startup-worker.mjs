// A relay-only or consumer-only Courier process as a user writes one (MikroORM on
// PostgreSQL + RabbitMQ), or the bare-driver ceiling, for scenario 9 ("time to ready").
// Plain JavaScript so it runs on plain `node` against the built packages (dist/), the way
// users run them; the bench may also start it with tsx and the source condition.
//
//   node startup-worker.mjs '<json config>'
//
// Prints one JSON line per phase on stdout: {"mark": name, "at": epoch ms (high resolution)},
// then {"done": true} once it stopped. A relay given `drain: n` first publishes n messages
// and prints {"drain": {seconds, cpuSeconds, maxRssMb}}. The parent measures from its spawn() call.
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';
import v8 from 'node:v8';

const at = () => performance.timeOrigin + performance.now();
const mark = (name) => process.stdout.write(`${JSON.stringify({ mark: name, at: at() })}\n`);
const config = JSON.parse(process.argv[2] ?? '{}');

// Node's own start-up, relative to this process's time origin.
const timing = performance.nodeTiming;
process.stdout.write(`${JSON.stringify({ mark: 'node bootstrapped', at: performance.timeOrigin + timing.bootstrapComplete })}\n`);
mark('main');

async function bare() {
  const { default: pg } = await import('pg');
  const { connect } = await import('amqplib');
  mark('imported');
  const client = new pg.Client({ connectionString: config.pgUrl });
  const [, connection] = await Promise.all([client.connect(), connect(config.rabbitMqUrl)]);
  await client.query('SELECT 1');
  const channel = await connection.createConfirmChannel();
  mark('ready');
  await channel.close();
  await connection.close();
  await client.end();
}

async function courier() {
  const core = await import('@courier/core');
  mark('imported @courier/core');
  // MikroORM is CommonJS: `import` makes Node 20 lex every module it re-exports (the
  // whole package tree) before running it; `require` from ESM does not.
  const { MikroORM, EntitySchema } = config.ormLoader === 'require' ? createRequire(import.meta.url)('@mikro-orm/postgresql') : await import('@mikro-orm/postgresql');
  mark('imported @mikro-orm/postgresql');
  // `plugin` lets the bench load another build of the plugin (before/after comparisons).
  const { MikroOrmOutboxStore, MikroOrmInboxStore } = await import(config.plugin ?? '@courier/mikro-orm');
  mark('imported @courier/mikro-orm');
  const { RabbitMqTransport } = await import('@courier/rabbitmq');
  mark('imported @courier/rabbitmq');

  // The application's own entity, declared as users of EntitySchema do.
  class Order {}
  const OrderEntity = new EntitySchema({
    class: Order,
    tableName: config.ordersTable,
    properties: {
      id: { type: 'string', length: 64, primary: true },
      totalCents: { type: 'integer', fieldName: 'total_cents' },
    },
  });
  const orm = await MikroORM.init({ clientUrl: config.pgUrl, entities: [OrderEntity], debug: false, pool: { min: 0, max: 8 }, ...(config.ormOptions ?? {}) });
  mark('MikroORM.init');
  const tables = { orm, tablePrefix: config.tablePrefix };
  const outbox = new MikroOrmOutboxStore(tables);
  const inbox = new MikroOrmInboxStore(tables);
  if (config.ensureSchema) {
    await outbox.ensureSchema();
    mark('ensureSchema');
  }
  const transport = new RabbitMqTransport({ connection: config.rabbitMqUrl, prefix: config.prefix });
  const bus = core.createBus({ outbox, inbox, transport, relay: { pollIntervalMs: 1_000 } });
  const OrderPlaced = core.defineMessage(config.type, { version: 1, topic: config.topic });
  if (config.role === 'consumer') bus.subscribe(config.consumer, OrderPlaced, async () => {}, { concurrency: 8 });
  mark('bus created');
  await bus.start({ relay: config.role === 'relay', consumers: config.role === 'consumer' });
  mark('bus.start');
  if (config.role === 'relay') {
    // Ready = the pending row seeded before the spawn was claimed, published, confirmed and completed.
    while (bus.health().relay.sinceLastClaimMs < 0) await new Promise((resolve) => setTimeout(resolve, 1));
    mark('first claim');
    while (bus.health().counters.published < 1) await new Promise((resolve) => setTimeout(resolve, 1));
    mark('first message published');
    if (config.drain) {
      // Scenario 2's relay-only process: drain the seeded backlog, then report this process's
      // CPU over the drain and its peak RSS (start-up included, as `ps` would show it).
      // Where the RSS goes, at the drain's start and at the peaks during it: V8's heap (its
      // young generation, new space, sized by the allocation rate; old space, where what
      // survives two scavenges waits for a full GC), buffers outside it, and the rest (code,
      // native libraries, allocator slack).
      const mb = (bytes) => bytes / 1024 / 1024;
      const spaces = () => Object.fromEntries(v8.getHeapSpaceStatistics().map((space) => [space.space_name, space.space_size]));
      const memory = () => {
        const now = spaces();
        return { ...process.memoryUsage(), newSpace: now.new_space ?? 0, oldSpace: now.old_space ?? 0 };
      };
      const atStart = memory();
      const peak = { ...atStart };
      const sampler = setInterval(() => {
        const now = memory();
        for (const key of Object.keys(peak)) peak[key] = Math.max(peak[key], now[key]);
      }, 100);
      const cpu = process.cpuUsage();
      const started = performance.now();
      while (bus.health().counters.published < config.drain) await new Promise((resolve) => setTimeout(resolve, 5));
      const used = process.cpuUsage(cpu);
      clearInterval(sampler);
      const drain = {
        seconds: (performance.now() - started) / 1000,
        cpuSeconds: (used.user + used.system) / 1e6,
        maxRssMb: process.resourceUsage().maxRSS / 1024,
        startRssMb: mb(atStart.rss),
        startHeapTotalMb: mb(atStart.heapTotal),
        startHeapUsedMb: mb(atStart.heapUsed),
        peakHeapTotalMb: mb(peak.heapTotal),
        peakHeapUsedMb: mb(peak.heapUsed),
        peakExternalMb: mb(peak.external),
        peakArrayBuffersMb: mb(peak.arrayBuffers),
        startNewSpaceMb: mb(atStart.newSpace),
        peakNewSpaceMb: mb(peak.newSpace),
        startOldSpaceMb: mb(atStart.oldSpace),
        peakOldSpaceMb: mb(peak.oldSpace),
      };
      // What is still live once the drain is over (after full GCs): flat in the backlog size
      // unless something retains per-message state. Taken after the figures above.
      v8.setFlagsFromString('--expose-gc');
      const gc = (await import('node:vm')).runInNewContext('gc');
      gc();
      gc();
      drain.liveHeapAfterGcMb = mb(process.memoryUsage().heapUsed);
      process.stdout.write(`${JSON.stringify({ drain })}\n`);
    }
  }
  mark('ready');
  await bus.stop({ timeoutMs: 5_000 });
  await transport.close();
  await Promise.all([outbox.close(), inbox.close()]);
  await orm.close();
}

try {
  await (config.role === 'bare' ? bare() : courier());
  process.stdout.write(`${JSON.stringify({ done: true })}\n`);
} catch (error) {
  process.stderr.write(`startup worker failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exitCode = 1;
}
