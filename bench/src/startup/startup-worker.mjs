// A relay-only or consumer-only Courier process as a user writes one (MikroORM on
// PostgreSQL + RabbitMQ), or the bare-driver ceiling, for scenario 9 ("time to ready");
// with `serve: true` also a producer, and scenario 12's separate processes (see serve()).
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
import { createInterface } from 'node:readline';
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
      customerId: { type: 'string', length: 64, fieldName: 'customer_id' },
      totalCents: { type: 'integer', fieldName: 'total_cents' },
      createdAt: { type: 'datetime', fieldName: 'created_at' },
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
  // COURIER_BENCH_RELAY_BATCH (bench/README.md): another relay batch, for before/after pairs of the default.
  const batch = process.env.COURIER_BENCH_RELAY_BATCH ? { batchSize: Number(process.env.COURIER_BENCH_RELAY_BATCH) } : {};
  const bus = core.createBus({ outbox, inbox, transport, relay: { pollIntervalMs: 1_000, ...batch } });
  const OrderPlaced = core.defineMessage(config.type, { version: 1, topic: config.topic });
  const handled = { count: 0 };
  if (config.role === 'consumer') {
    bus.subscribe(
      config.consumer,
      OrderPlaced,
      () => {
        handled.count += 1;
        return Promise.resolve();
      },
      { concurrency: 8 },
    );
  }
  mark('bus created');
  if (config.serve) {
    await serve({ bus, orm, Order, OrderPlaced, handled });
  } else {
    await startAndDrain(bus);
  }
  mark('ready');
  await bus.stop({ timeoutMs: 5_000 });
  await transport.close();
  await Promise.all([outbox.close(), inbox.close()]);
  await orm.close();
}

/** Scenario 9 (and 2's relay-only drain): start the role, wait until it did its first job (and the drain). */
async function startAndDrain(bus) {
  await bus.start({ relay: config.role === 'relay', consumers: config.role === 'consumer' });
  mark('bus.start');
  if (config.role === 'relay') {
    // Ready = the pending row seeded before the spawn was claimed, published, confirmed and completed.
    while (bus.health().relay.sinceLastClaimMs < 0) await sleep(1);
    mark('first claim');
    while (bus.health().counters.published < 1) await sleep(1);
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
      while (bus.health().counters.published < config.drain) await sleep(5);
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
}

/**
 * Scenario 12's separate processes: a producer, relay or consumer that stays up and takes one
 * JSON command per stdin line, answering each (in order) with one `{"reply": {…}}` line that
 * carries this process's clock (`at`, epoch ms), its CPU seconds so far and its peak RSS (MB):
 *
 *   {"cmd":"stats"}               the figures alone (the first answer also means "serving")
 *   {"cmd":"start"}               starts the relay or the consumer; `before`: figures just before bus.start()
 *   {"cmd":"await","count":n}     once the relay published / the consumer handled n messages in all
 *   {"cmd":"produce","seconds":s} `config.writers` closed loops of one order transaction for s seconds:
 *                                 `count` committed, `before`: figures before the first began
 *   {"cmd":"stop"}                ends serving (then the bus stops and the process exits)
 *
 * The end of stdin ends serving too, and ends a wait in progress: a parent that dies (its pipe
 * closes) leaves no worker behind.
 */
async function serve({ bus, orm, Order, OrderPlaced, handled }) {
  let parentGone = false;
  process.stdin.once('end', () => {
    parentGone = true;
  });
  const figures = () => {
    const cpu = process.cpuUsage();
    return { at: at(), cpuSeconds: (cpu.user + cpu.system) / 1e6, maxRssMb: process.resourceUsage().maxRSS / 1024 };
  };
  const reply = (fields) => process.stdout.write(`${JSON.stringify({ reply: { ...fields, ...figures() } })}\n`);
  const counter = () => (config.role === 'relay' ? bus.health().counters.published : handled.count);
  let serial = 0;
  // The bench's producer transaction (setup.ts produceOrder): an order row and its message, same payload.
  const produceOrder = () =>
    orm.em.fork().transactional((em) => {
      const id = `${config.idPrefix}-${(serial += 1)}`;
      em.persist(em.create(Order, { id, customerId: 'c-1', totalCents: 12_345, createdAt: new Date() }));
      bus.outbox(em).publish(OrderPlaced, { orderId: id, customerId: `c-${id.slice(-6)}`, totalCents: 12_345, currency: 'EUR' }, { key: id });
      return Promise.resolve();
    });
  // Closed loops as setup.ts closedLoopProducers runs them: the first failure stops them all.
  const produce = async (seconds) => {
    let running = true;
    let commits = 0;
    let failure;
    const loops = Array.from({ length: config.writers }, async () => {
      while (running && !parentGone) {
        try {
          await produceOrder();
          commits += 1;
        } catch (error) {
          failure ??= { error };
          running = false;
        }
      }
    });
    await sleep(seconds * 1000);
    running = false;
    await Promise.all(loops);
    if (failure) throw failure.error;
    return commits;
  };
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    const command = JSON.parse(line);
    if (command.cmd === 'stop') break;
    if (command.cmd === 'stats') {
      reply({});
    } else if (command.cmd === 'start') {
      const before = figures();
      await bus.start({ relay: config.role === 'relay', consumers: config.role === 'consumer' });
      reply({ before });
    } else if (command.cmd === 'await') {
      while (counter() < command.count) {
        if (parentGone) throw new Error(`stdin closed while waiting for ${command.count} (at ${counter()})`);
        await sleep(5);
      }
      reply({ count: counter() });
    } else if (command.cmd === 'produce') {
      const before = figures();
      reply({ count: await produce(command.seconds), before });
    } else {
      throw new Error(`unknown command: ${line}`);
    }
  }
  lines.close();
  process.stdin.destroy();
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

try {
  await (config.role === 'bare' ? bare() : courier());
  process.stdout.write(`${JSON.stringify({ done: true })}\n`);
} catch (error) {
  process.stderr.write(`startup worker failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  // Now, not when the event loop empties: a bus that started keeps it busy (its relay or
  // consumer would run on with nobody to stop it). Writes to a pipe are synchronous on Linux.
  process.exit(1);
}
