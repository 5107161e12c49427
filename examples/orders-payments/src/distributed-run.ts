import { randomBytes, randomInt } from 'node:crypto';
import { describeError } from '@courier/core';
import type { RabbitMqTransport } from '@courier/rabbitmq';
import type { MikroORM } from '@mikro-orm/core';
import { connect, type Channel, type ChannelModel } from 'amqplib';
import { ConciseLogger } from './concise-logger.js';
import { courierTables, dropSchema, openPostgresOrm, prepareDatabase, redact } from './databases.js';
import { rabbitMqTransport } from './distributed-config.js';
import { sqlInspector } from './inspectors.js';
import { OrderPlaced, PaymentCaptured } from './messages.js';
import { MikroOrmShop } from './mikro-orm-shop.js';
import type { ExampleOptions, WorkerRole } from './options.js';
import { ORDERS_CONSUMER } from './orders-service.js';
import { PAYMENTS_CONSUMER } from './payments-service.js';
import { progressLine } from './progress.js';
import { formatReport, reconcile } from './reconciliation.js';
import { sleep, type RunResult } from './run-result.js';
import { isSettled, type Snapshot } from './snapshot.js';
import { WorkerPool } from './worker-pool.js';

/** Each consumer, the topic it reads: declared up front so nothing published early is unroutable. */
const ENDPOINTS = [
  { consumer: PAYMENTS_CONSUMER, topics: [OrderPlaced.topic], ordered: false },
  { consumer: ORDERS_CONSUMER, topics: [PaymentCaptured.topic], ordered: false },
] as const;

/** Chaos: at least this many kills, of both roles, before it may stop. */
const MIN_KILLS = 4;

/**
 * Runs the postgres-rabbitmq setup: a PostgreSQL schema and RabbitMQ names private to
 * the run, the orders and payments services as separate worker processes, optionally the
 * chaos monkey, then waits for the counts to settle and reconciles them from the database
 * and the broker. Drops the schema and deletes the queues at the end unless `keep`.
 */
export async function runDistributed(options: ExampleOptions, write: (line: string) => void): Promise<RunResult> {
  const started = Date.now();
  const runId = randomBytes(4).toString('hex');
  const schema = `example_${runId}`;
  const prefix = `courier-example-${runId}`;
  const logger = new ConciseLogger('  [runner]', write, options.verbose);
  write(
    `setup postgres-rabbitmq: PostgreSQL ${redact(options.pgUrl)} (schema ${schema}), RabbitMQ ${redact(options.rabbitMqUrl)} (prefix ${prefix}); ` +
      `${options.orders} orders; orders and payments run as separate processes${options.chaos ? '; chaos: workers are SIGKILLed and restarted at random' : ''}`,
  );
  const orm = await openPostgresOrm(options.pgUrl, schema, 4);
  const transport = rabbitMqTransport(options.rabbitMqUrl, prefix, logger);
  let broker: ChannelModel | undefined;
  let workers: WorkerPool | undefined;
  try {
    await prepareDatabase(orm, schema);
    try {
      for (const endpoint of ENDPOINTS) await transport.provision(endpoint);
      broker = await connect(options.rabbitMqUrl);
      broker.on('error', () => undefined);
    } catch (error) {
      throw new Error(
        `RabbitMQ is not usable at ${redact(options.rabbitMqUrl)}: ${describeError(error)}. Start it (\`rabbitmq-server -detached && rabbitmqctl await_startup\`) ` +
          `or point COURIER_RABBITMQ_URL at one.`,
        { cause: error },
      );
    }
    const queues = queueDepth(broker, transport);
    const inspector = sqlInspector({ orm, shop: new MikroOrmShop(orm), tables: courierTables(schema), deadLetters: transport.deadLetters, queued: queues });
    workers = new WorkerPool(
      {
        runId,
        orders: options.orders,
        pgUrl: options.pgUrl,
        schema,
        rabbitMqUrl: options.rabbitMqUrl,
        prefix,
        // Chaos SIGKILLs handlers mid-flight; allow a few more unfinished runs before a
        // message counts as a crash loop, so only the deliberate poison is dead-lettered.
        maxCrashes: options.chaos ? 6 : 3,
        verbose: options.verbose,
      },
      write,
    );
    const pool = workers;
    pool.start('payments');
    pool.start('orders');

    let snapshot: Snapshot = await inspector.snapshot();
    const chaos = { kills: 0, killedRoles: new Set<WorkerRole>(), done: !options.chaos, stop: false };
    const chaosDeadline = started + options.timeoutMs * 0.5;
    const monkey = options.chaos
      ? (async () => {
          for (;;) {
            const enough = chaos.kills >= MIN_KILLS && chaos.killedRoles.size === 2 && snapshot.orders.length >= options.orders;
            if (enough || chaos.stop || Date.now() > chaosDeadline) break;
            // Both roles early on, then at random.
            const role: WorkerRole = chaos.kills === 0 ? 'payments' : chaos.kills === 1 ? 'orders' : randomInt(2) === 0 ? 'orders' : 'payments';
            // A process killed while it still boots proves nothing: strike while it works,
            // a random while after it reported ready.
            const delay = randomInt(300, 1_500);
            while ((pool.readyFor(role) ?? -1) < delay && !chaos.stop && Date.now() <= chaosDeadline) await sleep(50);
            if (chaos.stop) break;
            const victim = await pool.kill(role);
            if (victim) {
              chaos.kills += 1;
              chaos.killedRoles.add(role);
              write(`chaos: SIGKILL ${victim}`);
            }
            await sleep(randomInt(100, 500));
            pool.start(role);
          }
          chaos.done = true;
          write(`chaos: done after ${chaos.kills} kills; waiting for the counts to settle`);
        })()
      : Promise.resolve();

    let lastPrint = Date.now();
    const deadline = started + options.timeoutMs;
    let settled = false;
    // Ctrl-C ends the wait: the workers (which ignore SIGINT) are stopped, the counts
    // reconciled as they are, and the schema and queues removed.
    let interrupted = false;
    const onInterrupt = (): void => {
      interrupted = true;
      chaos.stop = true;
      write('interrupted: stopping the workers and cleaning up (Ctrl-C again to abandon)');
      process.removeListener('SIGINT', onInterrupt);
    };
    process.on('SIGINT', onInterrupt);
    while (Date.now() < deadline && !interrupted) {
      snapshot = await inspector.snapshot();
      if (Date.now() - lastPrint >= 1_000) {
        write(progressLine(Date.now() - started, snapshot, options.orders, `workers ${pool.describe()}${options.chaos ? ` · kills ${chaos.kills}` : ''}`));
        lastPrint = Date.now();
      }
      if (chaos.done && isSettled(snapshot, options.orders)) {
        settled = true;
        break;
      }
      await sleep(500);
    }
    chaos.stop = true;
    await monkey;
    process.removeListener('SIGINT', onInterrupt);
    if (!settled && !interrupted) write(`the counts did not settle within ${options.timeoutMs / 1000}s; reconciling what there is`);
    await pool.stopAll();
    snapshot = await inspector.snapshot();
    write(progressLine(Date.now() - started, snapshot, options.orders, 'workers stopped'));
    const report = reconcile(snapshot, options.orders, { orders: pool.counters('orders'), payments: pool.counters('payments') });
    const checks = [...report.checks];
    if (pool.unexpectedExits > 0) checks.push({ ok: false, text: `${pool.unexpectedExits} worker process(es) exited without being killed or stopped` });
    const final = { ...report, checks, ok: report.ok && pool.unexpectedExits === 0 };
    const footnotes = [
      `retries: payments ${pool.counters('payments').retries} (flaky gateway), orders ${pool.counters('orders').retries}`,
      `every count is read from PostgreSQL and RabbitMQ; retries are the workers' counters as last reported (a SIGKILLed process's final second is lost)`,
      ...(options.chaos ? [`chaos: ${chaos.kills} SIGKILLs (${[...chaos.killedRoles].join(', ')})`] : []),
      ...logger.summary(),
    ];
    write(formatReport(final, `reconciliation — setup postgres-rabbitmq, ${options.orders} orders, run ${runId}, ${((Date.now() - started) / 1000).toFixed(1)}s`, footnotes));
    return { ok: final.ok, report: final, snapshot };
  } finally {
    await workers?.stopAll(5_000);
    await cleanUp(options, { orm, transport, broker, schema, write });
  }
}

/** Ready messages in both consumers' queues and retry-tier queues (not the dead-letter queues). */
function queueDepth(broker: ChannelModel, transport: RabbitMqTransport): () => Promise<number> {
  let channel: Channel | undefined;
  const names = ENDPOINTS.flatMap(({ consumer }) => {
    const n = transport.names(consumer);
    return [n.queue, ...n.retryQueues.map((tier) => tier.name)];
  });
  return async () => {
    if (!channel) {
      channel = await broker.createChannel();
      channel.on('error', () => undefined);
      channel.on('close', () => {
        channel = undefined;
      });
    }
    let total = 0;
    for (const name of names) total += (await channel.checkQueue(name)).messageCount;
    return total;
  };
}

async function cleanUp(
  options: ExampleOptions,
  resources: { orm: MikroORM; transport: RabbitMqTransport; broker: ChannelModel | undefined; schema: string; write: (line: string) => void },
): Promise<void> {
  const { orm, transport, broker, schema, write } = resources;
  if (options.keep) {
    write(`kept PostgreSQL schema ${schema} and the RabbitMQ queues '${transport.names(PAYMENTS_CONSUMER).exchange.replace(/\.topics$/, '')}.*'`);
  } else {
    try {
      if (broker) {
        const channel = await broker.createChannel();
        channel.on('error', () => undefined);
        for (const { consumer } of ENDPOINTS) {
          const n = transport.names(consumer);
          for (const queue of [n.queue, n.deadLetterQueue, ...n.retryQueues.map((tier) => tier.name)]) await channel.deleteQueue(queue);
        }
        await channel.deleteExchange(transport.names(PAYMENTS_CONSUMER).exchange);
        await channel.close();
      }
    } catch (error) {
      write(`could not delete the run's RabbitMQ queues: ${describeError(error)}`);
    }
    await dropSchema(orm, schema).catch((error: unknown) => write(`could not drop schema ${schema}: ${describeError(error)}`));
  }
  await transport.close();
  await broker?.close().catch(() => undefined);
  await orm.close();
}
