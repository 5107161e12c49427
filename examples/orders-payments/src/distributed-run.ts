import { randomBytes, randomInt } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { DeleteTopicCommand, ListTopicsCommand, SNSClient } from '@aws-sdk/client-sns';
import { DeleteQueueCommand, GetQueueAttributesCommand, GetQueueUrlCommand, ListQueuesCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { relayOnce, SqsTransport } from '@courier/aws';
import { describeError, type Logger } from '@courier/core';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import { KafkaTransport } from '@courier/kafka';
import { dropReplicationSlot } from '@courier/pg-logical';
import { RabbitMqTransport } from '@courier/rabbitmq';
import { SqlTransport } from '@courier/sql-transport';
import type { MikroORM } from '@mikro-orm/core';
import { connect, type Channel, type ChannelModel } from 'amqplib';
import { Kafka, logLevel, type Admin } from 'kafkajs';
import pg from 'pg';
import { ConciseLogger } from './concise-logger.js';
import { courierTables, dropSchema, prepareDatabase, redact, TABLE_PREFIXES } from './databases.js';
import { logSlotName, openBackend, sqsClient, type RunBackend } from './distributed-config.js';
import { patientInspector, sqlInspector } from './inspectors.js';
import { OrderPlaced, PaymentCaptured } from './messages.js';
import { MikroOrmShop } from './mikro-orm-shop.js';
import { LAYER_NAMES, type ExampleOptions, type WorkerRole } from './options.js';
import { ORDERS_CONSUMER } from './orders-service.js';
import { PAYMENTS_CONSUMER } from './payments-service.js';
import { progressLine } from './progress.js';
import { formatReport, reconcile } from './reconciliation.js';
import { DEMO_RELAY, sleep, type RunResult } from './run-result.js';
import type { ServiceName } from './snapshot.js';
// The SNS stand-in of @courier/aws's tests (an SNS Query API server delivering into the SQS
// server): no SNS server installs on a machine without Docker; see plugins/aws/README.md.
import { SnsStandIn } from '../../../plugins/aws/test/support/sns-standin.js';
import { SettleWatch, type Snapshot } from './snapshot.js';
import { WorkerPool } from './worker-pool.js';

/** Each consumer, the topic it reads: declared up front so nothing published early is unroutable. */
const ENDPOINTS = [
  { consumer: PAYMENTS_CONSUMER, topics: [OrderPlaced.topic], ordered: false },
  { consumer: ORDERS_CONSUMER, topics: [PaymentCaptured.topic], ordered: false },
] as const;

/** Chaos: at least this many kills, of both roles, before it may stop. */
const MIN_KILLS = 4;

/**
 * Runs a distributed setup: the orders and payments services as separate worker
 * processes, optionally the chaos monkey, then waits for the counts to settle and
 * reconciles them from the database and the queues. `postgres-rabbitmq` /
 * `postgres-kafka`: a PostgreSQL schema and RabbitMQ queues / Kafka topics and consumer
 * groups private to the run (dropped and deleted at the end unless `keep`). `sqlite-sql`: a SQLite file private to the run holding the services' tables and
 * the SQL transport's queue (deleted at the end unless `keep`); no server at all.
 */
export async function runDistributed(options: ExampleOptions, write: (line: string) => void): Promise<RunResult> {
  const started = Date.now();
  const runId = randomBytes(4).toString('hex');
  const setup =
    options.setup === 'sqlite-sql' || options.setup === 'postgres-kafka' || options.setup === 'postgres-rabbitmq-nest' || options.setup === 'postgres-sqs' ? options.setup : 'postgres-rabbitmq';
  const schema = `example_${runId}`;
  const prefix = `courier-example-${runId}`;
  const sqliteFile = setup === 'sqlite-sql' ? join(mkdtempSync(join(tmpdir(), 'courier-example-')), 'shop.db') : '';
  const logger = new ConciseLogger('  [runner]', write, options.verbose);
  const where =
    setup === 'sqlite-sql'
      ? `SQLite file ${sqliteFile} (services' tables and the SQL transport's queue; no server)`
      : setup === 'postgres-kafka'
        ? `PostgreSQL ${redact(options.pgUrl)} (schema ${schema}), Kafka ${options.kafkaBrokers} (topics and groups ${prefix}.*)`
        : setup === 'postgres-sqs'
          ? `PostgreSQL ${redact(options.pgUrl)} (schema ${schema}), SNS ${options.snsEndpoint ?? 'stand-in (started by this run)'} → SQS ${options.sqsEndpoint} (topics and queues ${prefix}-*)` +
            `${options.relayOnce ? '; relay-once: the outboxes are drained by relayOnce every second, no relay in the workers' : ''}`
          : `PostgreSQL ${redact(options.pgUrl)} (schema ${schema}), RabbitMQ ${redact(options.rabbitMqUrl)} (prefix ${prefix})`;
  const layers = options.dataLayers;
  const onPrisma = layers.orders === 'prisma' || layers.payments === 'prisma';
  const dataLayer = onPrisma ? `; data layer: orders on ${LAYER_NAMES[layers.orders]}, payments on ${LAYER_NAMES[layers.payments]}` : '';
  const relay = options.relay === 'log' ? `; relays tail the log (replication slots ${logSlotName(schema, 'orders')}, ${logSlotName(schema, 'payments')}, dropped at the end)` : '';
  write(`setup ${setup}: ${where}${dataLayer}${relay}; ${options.orders} orders; orders and payments run as separate processes${options.chaos ? '; chaos: workers are SIGKILLed and restarted at random' : ''}`);
  // Generated once here, offline, before any worker imports it (see prisma-shop-client.ts).
  if (onPrisma) {
    const began = Date.now();
    const dir = (await import('./prisma-shop-client.js')).generateShopPrismaClient();
    write(`Prisma Client from prisma/schema.prisma: ${relative(process.cwd(), dir) || dir} (${Date.now() - began} ms)`);
  }
  // postgres-sqs: the SQS server must answer first; then SNS is the user's or a stand-in of the run's.
  const standIn = setup === 'postgres-sqs' ? await startSns(options) : undefined;
  const snsEndpoint = options.snsEndpoint ?? standIn?.endpoint ?? '';
  let backend: RunBackend;
  try {
    backend = await openBackend({ setup, sqliteFile, pgUrl: options.pgUrl, schema, rabbitMqUrl: options.rabbitMqUrl, kafkaBrokers: options.kafkaBrokers, sqsEndpoint: options.sqsEndpoint, snsEndpoint, prefix }, logger, 4);
  } catch (error) {
    await standIn?.close();
    throw error;
  }
  const { orm, transport } = backend;
  let broker: ChannelModel | undefined;
  let kafkaAdmin: Admin | undefined;
  let workers: WorkerPool | undefined;
  let scheduler: RelayOnceSchedule | undefined;
  try {
    await prepareDatabase(orm, backend.schema);
    let queues: () => Promise<number>;
    if (transport instanceof SqlTransport) {
      await transport.ensureSchema();
      // Groups registered up front, so nothing the orders worker publishes before the payments worker subscribed is unroutable.
      for (const endpoint of ENDPOINTS) await transport.provision(endpoint);
      queues = sqlQueueDepth(orm);
    } else if (transport instanceof RabbitMqTransport) {
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
      queues = queueDepth(broker, transport);
    } else if (transport instanceof SqsTransport) {
      // Each group's queue subscribed to its topic before anything is published: an SNS topic
      // delivers nothing to a queue subscribed later.
      await transport.provision({ subscriptions: Object.fromEntries(ENDPOINTS.map(({ consumer, topics }) => [consumer, topics])) });
      queues = sqsQueueDepth(sqsClient(options.sqsEndpoint), transport);
    } else if (transport instanceof KafkaTransport) {
      // Nothing to declare up front: a topic is created by the first publish or subscribe that
      // needs it, and a new consumer group starts at the beginning of its topics, so nothing the
      // orders worker publishes before the payments worker joined is missed.
      try {
        kafkaAdmin = new Kafka({ clientId: `${prefix}-runner`, brokers: options.kafkaBrokers.split(','), connectionTimeout: 3_000, logLevel: logLevel.NOTHING, retry: { retries: 3 } }).admin();
        await kafkaAdmin.connect();
        await kafkaAdmin.listTopics();
      } catch (error) {
        throw new Error(
          `Kafka is not usable at ${options.kafkaBrokers}: ${describeError(error)}. Start a broker (\`bash scripts/kafka.sh start\`: Java 17+ and Maven) ` +
            `or point COURIER_KAFKA_BROKERS at one.`,
          { cause: error },
        );
      }
      queues = consumerLag(kafkaAdmin, transport);
    } else {
      throw new Error(`no transport for setup ${setup}`);
    }
    const inspector = patientInspector(
      sqlInspector({ orm, shop: new MikroOrmShop(orm), tables: courierTables(backend.schema), deadLetters: transport.deadLetters, queued: queues }),
      write,
    );
    workers = new WorkerPool(
      {
        setup,
        sqliteFile,
        runId,
        orders: options.orders,
        pgUrl: options.pgUrl,
        schema,
        rabbitMqUrl: options.rabbitMqUrl,
        kafkaBrokers: options.kafkaBrokers,
        sqsEndpoint: options.sqsEndpoint,
        snsEndpoint,
        relayOnce: options.relayOnce,
        dataLayers: options.dataLayers,
        relay: options.relay,
        prefix,
        // Chaos SIGKILLs handlers mid-flight; allow a few more unfinished runs before a
        // message counts as a crash loop, so only the deliberate poison is dead-lettered.
        maxCrashes: options.chaos ? 6 : 3,
        verbose: options.verbose,
        metricsPort: options.metricsPort ?? null,
      },
      write,
    );
    const pool = workers;
    pool.start('payments');
    pool.start('orders');
    if (options.relayOnce) scheduler = scheduleRelayOnce(backend, logger, write, options.verbose);

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
    const watch = new SettleWatch({ started, stallMs: options.stallMs, maxMs: options.timeoutMs });
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
    while (!interrupted) {
      snapshot = await inspector.snapshot();
      if (Date.now() - lastPrint >= 1_000) {
        write(progressLine(Date.now() - started, snapshot, options.orders, `workers ${pool.describe()}${options.chaos ? ` · kills ${chaos.kills}` : ''}`));
        lastPrint = Date.now();
      }
      const verdict = watch.observe(snapshot, options.orders, chaos.done);
      if (verdict === 'settled') break;
      if (verdict !== 'moving') {
        write(watch.describe(verdict));
        break;
      }
      await sleep(500);
    }
    chaos.stop = true;
    await monkey;
    process.removeListener('SIGINT', onInterrupt);
    await scheduler?.stop();
    await pool.stopAll();
    snapshot = await inspector.snapshot();
    write(progressLine(Date.now() - started, snapshot, options.orders, 'workers stopped'));
    const report = reconcile(snapshot, options.orders, { orders: pool.counters('orders'), payments: pool.counters('payments') });
    const checks = [...report.checks];
    if (pool.unexpectedExits > 0) checks.push({ ok: false, text: `${pool.unexpectedExits} worker process(es) exited without being killed or stopped` });
    const final = { ...report, checks, ok: report.ok && pool.unexpectedExits === 0 };
    const footnotes = [
      `retries: payments ${pool.counters('payments').retries} (flaky gateway), orders ${pool.counters('orders').retries}`,
      ...(scheduler ? [scheduler.summary()] : []),
      `every count is read from ${setup === 'sqlite-sql' ? 'the SQLite file' : setup === 'postgres-kafka' ? 'PostgreSQL and Kafka' : setup === 'postgres-sqs' ? 'PostgreSQL and SQS' : 'PostgreSQL and RabbitMQ'}; retries are the workers' counters as last reported (a SIGKILLed process's final second is lost)`,
      ...(options.chaos ? [`chaos: ${chaos.kills} SIGKILLs (${[...chaos.killedRoles].join(', ')})`] : []),
      ...logger.summary(),
    ];
    write(formatReport(final, `reconciliation — setup ${setup}, ${options.orders} orders, run ${runId}, ${((Date.now() - started) / 1000).toFixed(1)}s`, footnotes));
    return { ok: final.ok, report: final, snapshot };
  } finally {
    await scheduler?.stop();
    await workers?.stopAll(5_000);
    if (options.relay === 'log') await dropLogSlots(options.pgUrl, schema, write);
    await cleanUp(options, { backend, broker, kafkaAdmin, prefix, schema, sqliteFile, write });
    await standIn?.close();
  }
}

/**
 * `--relay log`: drops the run's replication slots and their publications once the workers
 * are stopped, `--keep` or not — a slot nobody reads makes the server keep WAL without bound,
 * while the outbox rows it announced are kept in the schema anyway. A slot stays active for a
 * moment after its reader's connection ends, so each drop is tried for up to 10 s.
 */
async function dropLogSlots(pgUrl: string, schema: string, write: (line: string) => void): Promise<void> {
  const pool = new pg.Pool({ connectionString: pgUrl, max: 1 });
  pool.on('error', () => undefined);
  try {
    for (const role of ['orders', 'payments'] as const) {
      const slot = logSlotName(schema, role);
      for (let attempt = 0; ; attempt++) {
        try {
          if (await dropReplicationSlot(pool, slot, { publication: `${slot}_pub` })) write(`dropped replication slot ${slot}`);
          break;
        } catch (error) {
          if (attempt >= 50) {
            write(`could not drop replication slot ${slot} (drop it with dropReplicationSlot, see docs/operations.md): ${describeError(error)}`);
            break;
          }
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
      }
    }
  } finally {
    await pool.end().catch(() => undefined);
  }
}

/** Rows waiting in the SQL transport's queue (due, in flight or retrying; not the dead letters). */
function sqlQueueDepth(orm: MikroORM): () => Promise<number> {
  return async () => {
    const rows = (await orm.em.getConnection().execute(`SELECT COUNT(*) AS n FROM courier_queue WHERE state = 'pending'`, [], 'all')) as Record<string, unknown>[];
    return Number(rows[0]?.['n'] ?? 0);
  };
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

/**
 * Records in both consumer groups' topics and retry topics that their group has not
 * committed past (waiting, in hand, or retry copies not due yet); not the dead letters.
 * A partition the group never committed counts from its first record.
 */
function consumerLag(admin: Admin, transport: KafkaTransport): () => Promise<number> {
  return async () => {
    try {
      return await lag();
    } catch (error) {
      // A topic just created answers ListOffsets with NOT_LEADER_OR_FOLLOWER until the broker
      // has loaded its partitions, and kafkajs's admin keeps the metadata it read at that
      // moment. Reconnecting drops it, so the next read (the monitor's patientInspector reads
      // again, and alone decides how long to wait) asks for the partitions' leaders afresh.
      await admin.disconnect().catch(() => undefined);
      await admin.connect().catch(() => undefined);
      throw error;
    }
  };
  async function lag(): Promise<number> {
    let total = 0;
    for (const { consumer, topics } of ENDPOINTS) {
      const names = [...topics.map((topic) => transport.topicName(topic)), transport.retryTopic(consumer)];
      const existing = new Set(await admin.listTopics());
      const present = names.filter((name) => existing.has(name));
      if (present.length === 0) continue;
      const committed = await admin.fetchOffsets({ groupId: transport.groupId(consumer), topics: present });
      for (const topic of present) {
        const ends = await admin.fetchTopicOffsets(topic);
        const done = new Map((committed.find((entry) => entry.topic === topic)?.partitions ?? []).map((p) => [p.partition, Number(p.offset)]));
        for (const end of ends) {
          const from = Math.max(Number(end.low), done.get(end.partition) ?? -1);
          total += Math.max(0, Number(end.high) - from);
        }
      }
    }
    return total;
  }
}

/** Deletes the run's Kafka consumer groups and topics (every name under `<prefix>.`). */
async function deleteKafkaObjects(admin: Admin, prefix: string): Promise<void> {
  const groups = (await admin.listGroups()).groups.map((group) => group.groupId).filter((group) => group.startsWith(`${prefix}.`));
  if (groups.length > 0) await admin.deleteGroups(groups);
  const topics = (await admin.listTopics()).filter((topic) => topic.startsWith(`${prefix}.`));
  if (topics.length > 0) await admin.deleteTopics({ topics });
}

async function cleanUp(
  options: ExampleOptions,
  resources: {
    backend: RunBackend;
    broker: ChannelModel | undefined;
    kafkaAdmin: Admin | undefined;
    prefix: string;
    schema: string;
    sqliteFile: string;
    write: (line: string) => void;
  },
): Promise<void> {
  const { backend, broker, kafkaAdmin, prefix, schema, sqliteFile, write } = resources;
  const { orm, transport } = backend;
  if (transport instanceof SqsTransport) {
    await transport.close();
    if (options.keep) write(`kept PostgreSQL schema ${schema} and the SNS topics and SQS queues '${prefix}-*'`);
    else {
      await deleteAwsObjects(options, prefix).catch((error: unknown) => write(`could not delete the run's SNS topics and SQS queues: ${describeError(error)}`));
      await dropSchema(orm, schema).catch((error: unknown) => write(`could not drop schema ${schema}: ${describeError(error)}`));
    }
    await orm.close();
    return;
  }
  if (transport instanceof KafkaTransport) {
    // The runner's own transport first: its dead-letter reads may hold a group of the run's.
    await transport.close();
    if (options.keep) write(`kept PostgreSQL schema ${schema} and the Kafka topics and consumer groups '${prefix}.*'`);
    else {
      if (kafkaAdmin) await deleteKafkaObjects(kafkaAdmin, prefix).catch((error: unknown) => write(`could not delete the run's Kafka topics and groups: ${describeError(error)}`));
      await dropSchema(orm, schema).catch((error: unknown) => write(`could not drop schema ${schema}: ${describeError(error)}`));
    }
    await kafkaAdmin?.disconnect().catch(() => undefined);
    await orm.close();
    return;
  }
  if (!(transport instanceof RabbitMqTransport)) {
    await transport.close();
    await orm.close();
    if (options.keep) write(`kept the SQLite file ${sqliteFile}`);
    else rmSync(join(sqliteFile, '..'), { recursive: true, force: true });
    return;
  }
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

/**
 * postgres-sqs: waits for the SQS server (up to 30 s: a loaded machine may answer slowly), then
 * starts the SNS stand-in delivering into it unless the user named an SNS endpoint (or real AWS).
 */
async function startSns(options: ExampleOptions): Promise<{ readonly endpoint: string; close(): Promise<void> } | undefined> {
  const client = sqsClient(options.sqsEndpoint);
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      await client.send(new ListQueuesCommand({ QueueNamePrefix: 'courier-example-probe-' }));
      break;
    } catch (error) {
      if (Date.now() > deadline) {
        client.destroy();
        throw new Error(
          `SQS is not usable at ${options.sqsEndpoint}: ${describeError(error)}. Start ElasticMQ (\`bash scripts/elasticmq.sh start\`: Java 17+ and Maven) or point COURIER_SQS_ENDPOINT at an SQS server.`,
          { cause: error },
        );
      }
      await sleep(500);
    }
  }
  if (options.snsEndpoint !== undefined || process.env['COURIER_SQS_REAL'] === '1') {
    client.destroy();
    return undefined;
  }
  const standIn = await SnsStandIn.start({ sqs: client });
  return {
    endpoint: standIn.endpoint,
    close: async () => {
      await standIn.close();
      client.destroy();
    },
  };
}

/** Ready, in-flight and delayed (retry copies) messages in both groups' SQS queues; not the dead letters. */
function sqsQueueDepth(client: SQSClient, transport: SqsTransport): () => Promise<number> {
  const urls = new Map<string, string>();
  return async () => {
    let total = 0;
    for (const { consumer } of ENDPOINTS) {
      const name = transport.consumerQueueName(consumer);
      let url = urls.get(name);
      if (url === undefined) {
        url = (await client.send(new GetQueueUrlCommand({ QueueName: name }))).QueueUrl!;
        urls.set(name, url);
      }
      const { Attributes = {} } = await client.send(
        new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible', 'ApproximateNumberOfMessagesDelayed'] }),
      );
      total += Number(Attributes.ApproximateNumberOfMessages ?? 0) + Number(Attributes.ApproximateNumberOfMessagesNotVisible ?? 0) + Number(Attributes.ApproximateNumberOfMessagesDelayed ?? 0);
    }
    return total;
  };
}

/**
 * Deletes the run's SQS queues and, on a user's SNS endpoint or AWS, its SNS topics (every name
 * under `<prefix>-`; a topic's subscriptions go with it). The stand-in's topics end with it.
 */
async function deleteAwsObjects(options: ExampleOptions, prefix: string): Promise<void> {
  const sqs = sqsClient(options.sqsEndpoint);
  try {
    const { QueueUrls = [] } = await sqs.send(new ListQueuesCommand({ QueueNamePrefix: `${prefix}-` }));
    for (const url of QueueUrls) await sqs.send(new DeleteQueueCommand({ QueueUrl: url }));
  } finally {
    sqs.destroy();
  }
  if (options.snsEndpoint === undefined && process.env['COURIER_SQS_REAL'] !== '1') return;
  const sns = process.env['COURIER_SQS_REAL'] === '1' ? new SNSClient({}) : new SNSClient({ endpoint: options.snsEndpoint, region: 'us-east-1', credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' } });
  try {
    let token: string | undefined;
    do {
      const page = await sns.send(new ListTopicsCommand(token === undefined ? {} : { NextToken: token }));
      for (const topic of page.Topics ?? []) {
        if (topic.TopicArn?.split(':').at(-1)?.startsWith(`${prefix}-`)) await sns.send(new DeleteTopicCommand({ TopicArn: topic.TopicArn }));
      }
      token = page.NextToken;
    } while (token !== undefined);
  } finally {
    sns.destroy();
  }
}

/** The relay-once schedule of a postgres-sqs run: stop() ends it after the invocation in flight. */
interface RelayOnceSchedule {
  stop(): Promise<void>;
  /** One line: invocations, published, failed, the longest call. */
  summary(): string;
}

/**
 * Drains each service's outbox by calling `relayOnce` — the Lambda entry point of @courier/aws —
 * every second, as an EventBridge schedule invokes a function (whose shortest rate is a minute;
 * a second keeps the demo short). Each call is a separate relay run: it claims under the same
 * leases as any relay, publishes what is due and returns a summary; a call that finds nothing
 * ends at once.
 */
function scheduleRelayOnce(backend: RunBackend, logger: Logger, write: (line: string) => void, verbose: boolean): RelayOnceSchedule {
  const services: readonly ServiceName[] = ['orders', 'payments'];
  const outboxes = services.map((service) => new MikroOrmOutboxStore({ orm: backend.orm, tablePrefix: TABLE_PREFIXES[service], schema: backend.schema, logger }));
  const totals = { invocations: 0, published: 0, failed: 0, longestMs: 0 };
  let stopped = false;
  let wake: (() => void) | undefined;
  const loop = (async () => {
    while (!stopped) {
      const began = Date.now();
      const summaries = await Promise.all(outboxes.map((outbox) => relayOnce({ outbox, transport: backend.transport, relay: DEMO_RELAY, logger }, { maxMs: 10_000 })));
      summaries.forEach((summary, index) => {
        totals.invocations += 1;
        totals.published += summary.published;
        totals.failed += summary.failed;
        totals.longestMs = Math.max(totals.longestMs, summary.durationMs);
        if (verbose && summary.published + summary.failed > 0) write(`  [relay-once ${services[index]}] ${JSON.stringify(summary)}`);
      });
      const wait = Math.max(0, 1_000 - (Date.now() - began));
      if (!stopped) await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, wait);
      });
    }
  })();
  let stopping: Promise<void> | undefined;
  return {
    stop: () =>
      (stopping ??= (async () => {
        stopped = true;
        wake?.();
        await loop.catch((error: unknown) => write(`relay-once schedule failed: ${describeError(error)}`));
        await Promise.all(outboxes.map((outbox) => outbox.close().catch(() => undefined)));
      })()),
    summary: () =>
      `relay-once: ${totals.invocations} invocations (each service every second) published ${totals.published}, ${totals.failed} publish failures; longest call ${totals.longestMs} ms`,
  };
}
