import { SNSClient } from '@aws-sdk/client-sns';
import { SQSClient } from '@aws-sdk/client-sqs';
import { SqsTransport } from '@courier/aws';
import type { BusCounters, Logger, Transport, TransportDeadLetters } from '@courier/core';
import { KafkaTransport } from '@courier/kafka';
import { RabbitMqTransport } from '@courier/rabbitmq';
import { Kafka, logLevel } from 'kafkajs';
import { SqlTransport } from '@courier/sql-transport';
import type { MikroORM } from '@mikro-orm/core';
import { openPostgresOrm, openSqliteOrm } from './databases.js';
import type { DataLayer, RelayMode, WorkerRole } from './options.js';

/**
 * Retry delay tiers of the demo's RabbitMQ queues (one queue per tier per consumer):
 * short, so a flaky payment is retried within a second. Every process of a run must use
 * the same tiers, since the queue names derive from them.
 */
export const DELAY_TIERS_MS: readonly number[] = Object.freeze([250, 1_000, 5_000]);

/** What the runner hands a worker process (as JSON on its command line). */
export interface WorkerConfig {
  /** The distributed setup: which database and transport every process opens. */
  readonly setup: 'sqlite-sql' | 'postgres-rabbitmq' | 'postgres-kafka' | 'postgres-rabbitmq-nest' | 'postgres-sqs';
  /** sqlite-sql: the run's database file, shared by the runner and the workers. */
  readonly sqliteFile: string;
  readonly runId: string;
  /** Which start of this role it is (1, 2, … after chaos restarts), for log prefixes. */
  readonly incarnation: number;
  readonly orders: number;
  readonly pgUrl: string;
  readonly schema: string;
  readonly rabbitMqUrl: string;
  /** postgres-kafka: the bootstrap brokers (`host:port`, comma-separated). */
  readonly kafkaBrokers: string;
  /** postgres-sqs: the SQS endpoint. */
  readonly sqsEndpoint: string;
  /** postgres-sqs: the SNS endpoint (the runner's stand-in unless the user named one). */
  readonly snsEndpoint: string;
  /** postgres-sqs: the workers run no relay; the runner calls relayOnce on a schedule. */
  readonly relayOnce: boolean;
  /** postgres-rabbitmq: each service's data layer (MikroORM or Prisma), chosen per process. */
  readonly dataLayers: Readonly<Record<WorkerRole, DataLayer>>;
  /** `log`: each worker's relay tails its outbox through the slot {@link logSlotName} names (PostgreSQL setups). */
  readonly relay: RelayMode;
  /** RabbitMQ exchange and queue name prefix, Kafka topic and group prefix, or SNS topic and SQS queue prefix of the run. */
  readonly prefix: string;
  readonly maxCrashes: number;
  readonly verbose: boolean;
  /** `--metrics-port`: orders serves /metrics on it, payments on the next (0: free ports); null: no endpoint. */
  readonly metricsPort: number | null;
}

/** Messages a worker sends its runner over the IPC channel. */
export type WorkerMessage =
  /** `dataLayer`: what the process's service writes through, as the service itself built it. */
  | { readonly kind: 'ready'; readonly dataLayer: DataLayer; readonly metricsUrl?: string }
  | { readonly kind: 'progress'; readonly counters: BusCounters }
  | { readonly kind: 'placed'; readonly placed: number }
  | { readonly kind: 'stopped'; readonly counters: BusCounters; readonly logTail?: { readonly slot: string; readonly logged: number; readonly swept: number } };

/**
 * The replication slot of a service's outbox in a `--relay log` run: one per run and role
 * (the schema is the run's), shared by that role's successive processes so that a restarted
 * worker resumes where the killed one was acknowledged. Its publication is `<slot>_pub`.
 */
export function logSlotName(schema: string, role: WorkerRole): string {
  return `${schema}_${role}`;
}

/** Messages the runner sends a worker. */
export type RunnerMessage = { readonly kind: 'stop' };

/**
 * The run's RabbitMQ transport, as every process of the run configures it. Its publish
 * timeout fits the demo's 5 s relay lease: the bus wants a lease of at least twice the
 * 2.5 s the transport then declares (the timeout plus a quarter).
 */
export function rabbitMqTransport(url: string, prefix: string, logger: Logger): RabbitMqTransport {
  return new RabbitMqTransport({ connection: url, prefix, delayTiersMs: DELAY_TIERS_MS, connectTimeoutMs: 5_000, publishTimeoutMs: 2_000, logger });
}

/**
 * The run's Kafka transport, as every process of the run configures it. Its publish
 * timeout fits the demo's 5 s relay lease as RabbitMQ's does. A SIGKILLed worker's
 * partitions move to its restarted successor after the group session timeout: 6 s, the
 * smallest a broker allows by default (`group.min.session.timeout.ms`).
 */
export function kafkaTransport(brokers: string, prefix: string, clientId: string): KafkaTransport {
  process.env['KAFKAJS_NO_PARTITIONER_WARNING'] ??= '1';
  const client = new Kafka({ clientId, brokers: brokers.split(','), connectionTimeout: 3_000, logLevel: logLevel.NOTHING, retry: { retries: 3, initialRetryTime: 200, maxRetryTime: 2_000 } });
  return new KafkaTransport({ client, prefix: `${prefix}.`, partitions: 4, publishTimeoutMs: 2_000, connectTimeoutMs: 5_000, sessionTimeoutMs: 6_000, heartbeatIntervalMs: 1_000, rebalanceTimeoutMs: 10_000 });
}

/**
 * An AWS SDK client's settings in the demo: ElasticMQ and the SNS stand-in take any region and
 * credentials; with COURIER_SQS_REAL=1 the SDK's own region and credentials are used instead.
 */
function awsClientConfig(endpoint: string): { endpoint?: string; region?: string; credentials?: { accessKeyId: string; secretAccessKey: string }; maxAttempts: number } {
  if (process.env['COURIER_SQS_REAL'] === '1') return { maxAttempts: 3 };
  return { endpoint, region: 'us-east-1', credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' }, maxAttempts: 2 };
}

/** An SQS client for the run's endpoint. */
export function sqsClient(endpoint: string): SQSClient {
  return new SQSClient(awsClientConfig(endpoint));
}

/**
 * The run's SNS → SQS transport, as every process of the run configures it: a topic is an SNS
 * topic, each service's consumer group an SQS queue subscribed to it. A SIGKILLed worker's
 * messages come back after the 5 s visibility timeout; receives wait 2 s, so a stop is quick.
 */
export function snsSqsTransport(sqsEndpoint: string, snsEndpoint: string, prefix: string, logger: Logger): SqsTransport {
  return new SqsTransport({ client: sqsClient(sqsEndpoint), sns: new SNSClient(awsClientConfig(snsEndpoint)), prefix: `${prefix}-`, visibilityTimeoutSeconds: 5, waitTimeSeconds: 2, logger });
}

/** The SQL transport's lease in the demo: a SIGKILLed worker's deliveries come back after it (renewed while handled). */
export const SQL_LEASE_MS = 3_000;

/** One process's database and transport in a distributed run. */
export interface RunBackend {
  readonly orm: MikroORM;
  readonly transport: Transport & { readonly deadLetters: TransportDeadLetters };
  /** PostgreSQL schema of the run; undefined on SQLite. */
  readonly schema: string | undefined;
}

/**
 * Opens the database and the transport of `config.setup`, as every process of the run
 * does: PostgreSQL (the run's schema) and RabbitMQ, Kafka or SNS + SQS, or the run's SQLite file with the SQL
 * transport on the same ORM (one connection per process: libsql waits for the file lock
 * synchronously, so two connections of one process could wait on each other).
 * `waitForServer` opens PostgreSQL without connecting (see {@link openPostgresOrm}).
 */
export async function openBackend(
  config: Pick<WorkerConfig, 'setup' | 'sqliteFile' | 'pgUrl' | 'schema' | 'rabbitMqUrl' | 'kafkaBrokers' | 'sqsEndpoint' | 'snsEndpoint' | 'prefix'>,
  logger: Logger,
  poolMax: number,
  { waitForServer = false }: { readonly waitForServer?: boolean } = {},
): Promise<RunBackend> {
  if (config.setup === 'sqlite-sql') {
    const orm = await openSqliteOrm(config.sqliteFile);
    return { orm, transport: sqlTransport(orm, logger), schema: undefined };
  }
  const orm = await openPostgresOrm(config.pgUrl, config.schema, poolMax, { waitForServer });
  const transport =
    config.setup === 'postgres-kafka'
      ? kafkaTransport(config.kafkaBrokers, config.prefix, config.prefix)
      : config.setup === 'postgres-sqs'
        ? snsSqsTransport(config.sqsEndpoint, config.snsEndpoint, config.prefix, logger)
        : rabbitMqTransport(config.rabbitMqUrl, config.prefix, logger);
  return { orm, transport, schema: config.schema };
}

/** The run's SQL transport (queue tables `courier_queue*` in the run's SQLite file). */
export function sqlTransport(orm: MikroORM, logger: Logger): SqlTransport {
  return new SqlTransport({ orm, leaseMs: SQL_LEASE_MS, pollIntervalMs: 100, logger });
}
