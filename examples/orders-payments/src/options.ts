import { parseArgs } from 'node:util';

/** The setups the demo runs on. */
export const SETUPS = ['sqlite-sql', 'in-memory', 'sqlite', 'postgres-rabbitmq', 'postgres-kafka', 'postgres-rabbitmq-nest', 'postgres-sqs'] as const;
export type SetupName = (typeof SETUPS)[number];

/** The setup used when neither `--setup` nor COURIER_EXAMPLE_SETUP chooses one. */
export const DEFAULT_SETUP: SetupName = 'sqlite-sql';

/** The setups whose services run as separate worker processes (and so support `--chaos`). */
export const DISTRIBUTED_SETUPS: readonly SetupName[] = ['sqlite-sql', 'postgres-rabbitmq', 'postgres-kafka', 'postgres-rabbitmq-nest', 'postgres-sqs'];

/** The data layers a service of the postgres-rabbitmq setup can write its business rows and Courier's tables with. */
export const DATA_LAYERS = ['mikro-orm', 'prisma'] as const;
export type DataLayer = (typeof DATA_LAYERS)[number];

/** How messages name a data layer. */
export const LAYER_NAMES: Readonly<Record<DataLayer, string>> = Object.freeze({ 'mikro-orm': 'MikroORM', prisma: 'Prisma' });

/** Each service's data layer when `--data-layer` does not choose: MikroORM, as every SQL setup. */
export const DEFAULT_DATA_LAYERS: Readonly<Record<WorkerRole, DataLayer>> = Object.freeze({ orders: 'mikro-orm', payments: 'mikro-orm' });
/** How the workers' relays find rows to publish: `polling` (the outbox store's own claim) or `log` (PostgreSQL's write-ahead log, `@courier/pg-logical`). */
export const RELAY_MODES = ['polling', 'log'] as const;
export type RelayMode = (typeof RELAY_MODES)[number];

/** The setups whose worker relays can tail the log: a PostgreSQL outbox and a long-running relay in each worker (the NestJS orders service builds its own outbox). */
export const LOG_RELAY_SETUPS: readonly SetupName[] = ['postgres-rabbitmq', 'postgres-kafka', 'postgres-sqs'];

/** What one run of the demo does. */
export interface ExampleOptions {
  readonly setup: SetupName;
  /** Orders to place. */
  readonly orders: number;
  /** Kill and restart the worker processes at random while it runs (sqlite-sql, postgres-rabbitmq, postgres-kafka). */
  readonly chaos: boolean;
  /** The longest the run may take before reconciling anyway; it waits while the counts keep moving. */
  readonly timeoutMs: number;
  /** Reconcile anyway once the counts have not moved for this long (a stuck run ends soon). */
  readonly stallMs: number;
  /** Keep the run's database schema / SQLite file and broker queues for inspection. */
  readonly keep: boolean;
  /** Print Courier's info and debug logs and every repeated warning. */
  readonly verbose: boolean;
  readonly pgUrl: string;
  readonly rabbitMqUrl: string;
  /** Kafka bootstrap brokers (`host:port`, comma-separated) of the postgres-kafka setup. */
  readonly kafkaBrokers: string;
  /** postgres-sqs: the SQS endpoint (ElasticMQ by default). */
  readonly sqsEndpoint: string;
  /** postgres-sqs: an SNS endpoint; undefined starts the SNS stand-in of @courier/aws's tests in the runner. */
  readonly snsEndpoint: string | undefined;
  /**
   * postgres-sqs: no long-running relay; the runner drains each service's outbox by calling
   * `relayOnce` (the Lambda entry point) every second, as an EventBridge schedule would.
   */
  readonly relayOnce: boolean;
  /**
   * postgres-rabbitmq: the data layer of each service (`--data-layer`): its business rows and
   * its outbox and inbox through MikroORM or through Prisma, chosen per service.
   */
  readonly dataLayers: Readonly<Record<WorkerRole, DataLayer>>;
  /**
   * `log`: each worker's relay reads its outbox's inserts from a logical replication slot of
   * its own (`PgLogicalOutboxStore` over the MikroORM store) instead of polling; the run drops
   * the slots at its end, `--keep` or not (a slot nobody reads holds WAL).
   */
  readonly relay: RelayMode;
  /**
   * `--metrics-port`: the worker processes serve Prometheus `/metrics` and `/health`
   * (`serveCourierMetrics` of @courier/cli) on 127.0.0.1 — orders on this port, payments on
   * the next; 0 picks free ports (each worker prints its address when ready). Undefined: none.
   */
  readonly metricsPort: number | undefined;
}

/** A worker process's role in the distributed setups (internal `--worker` flag). */
export type WorkerRole = 'orders' | 'payments';

export const USAGE = `usage: pnpm --filter @courier/example-orders-payments start [setup] [options]

  setup             sqlite-sql | in-memory | sqlite | postgres-rabbitmq | postgres-kafka | postgres-rabbitmq-nest
                    (postgres-rabbitmq-nest: postgres-rabbitmq with the orders service as a NestJS application)
                    (postgres-sqs: PostgreSQL outbox → SNS topics → SQS queues; SQS on ElasticMQ, SNS on the
                    stand-in of @courier/aws's tests unless COURIER_SNS_ENDPOINT names one)
                    (or --setup <name>, or COURIER_EXAMPLE_SETUP;
                    default ${DEFAULT_SETUP}: orders and payments as separate processes over one SQLite file
                    and the SQL transport, no server needed)
  --orders <n>      orders to place (default 200)
  --chaos           the setups with worker processes: SIGKILL and restart them at random while it runs
  --data-layer <l>  postgres-rabbitmq: the services' data layer, mikro-orm (default) or prisma for both, or
                    per service: orders=prisma,payments=mikro-orm (Prisma Client generated at run time)
  --relay-once      postgres-sqs: no relay in the workers; the outboxes are drained by calling relayOnce
                    (the Lambda entry point) every second, as a scheduled function would
  --relay <mode>    polling (default) | log: postgres-rabbitmq, postgres-kafka and postgres-sqs workers' relays
                    read their outbox's inserts from a logical replication slot (@courier/pg-logical; needs
                    wal_level = logical and a REPLICATION role) instead of polling; the slots are dropped at the end
  --metrics-port <p>
                    the setups with worker processes: each worker serves Prometheus /metrics and /health on
                    127.0.0.1 (orders on <p>, payments on <p>+1; 0: free ports, printed when ready)
  --timeout <s>     seconds the whole run may take at most; it waits while the counts keep moving (default 600)
  --stall <s>       give up when the counts have not moved for this many seconds (default 60)
  --keep            keep the run's database schema / SQLite file and RabbitMQ queues / Kafka topics
  --verbose         print Courier's info logs and every repeated warning
  --help

environment: COURIER_PG_URL (default postgres://courier:courier@127.0.0.1:5432/courier_test),
             COURIER_RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672),
             COURIER_KAFKA_BROKERS (default 127.0.0.1:9092),
             COURIER_SQS_ENDPOINT (default http://127.0.0.1:9324, ElasticMQ from scripts/elasticmq.sh),
             COURIER_SNS_ENDPOINT (default: the SNS stand-in, started by the run)`;

/** Thrown for bad command-line input; the message is shown with the usage. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** The parsed command line: a run, a worker, or a request for help. */
export type Command =
  | { readonly kind: 'run'; readonly options: ExampleOptions }
  | { readonly kind: 'worker'; readonly role: WorkerRole; readonly config: string }
  | { readonly kind: 'help' };

/** Parses `argv` (without node and the script) and the environment. */
export function parseCommand(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): Command {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv.filter((arg) => arg !== '--'),
      allowPositionals: true,
      options: {
        setup: { type: 'string' },
        orders: { type: 'string' },
        chaos: { type: 'boolean', default: false },
        'relay-once': { type: 'boolean', default: false },
        'data-layer': { type: 'string' },
        relay: { type: 'string' },
        'metrics-port': { type: 'string' },
        timeout: { type: 'string' },
        stall: { type: 'string' },
        keep: { type: 'boolean', default: false },
        verbose: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
        worker: { type: 'string' },
        'worker-config': { type: 'string' },
      },
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (values.help) return { kind: 'help' };
  if (values.worker !== undefined) {
    if (values.worker !== 'orders' && values.worker !== 'payments') throw new UsageError(`--worker must be 'orders' or 'payments'`);
    return { kind: 'worker', role: values.worker, config: values['worker-config'] ?? '{}' };
  }
  if (positionals.length > 1) throw new UsageError(`unexpected arguments: ${positionals.slice(1).join(' ')}`);
  const problems: string[] = [];
  const setupText = values.setup ?? positionals[0] ?? env['COURIER_EXAMPLE_SETUP'] ?? DEFAULT_SETUP;
  const setup = setupText === 'memory' ? 'in-memory' : setupText;
  if (!(SETUPS as readonly string[]).includes(setup)) problems.push(`setup must be one of ${SETUPS.join(', ')}, got '${setupText}'`);
  const orders = Number(values.orders ?? 200);
  if (!Number.isSafeInteger(orders) || orders < 1 || orders > 100_000) problems.push(`--orders must be an integer from 1 to 100000`);
  const timeout = Number(values.timeout ?? 600);
  if (!(timeout > 0) || !Number.isFinite(timeout)) problems.push(`--timeout must be a positive number of seconds`);
  const stall = Number(values.stall ?? 60);
  if (!(stall > 0) || !Number.isFinite(stall)) problems.push(`--stall must be a positive number of seconds`);
  if (values.chaos && !(DISTRIBUTED_SETUPS as readonly string[]).includes(setup)) {
    problems.push(`--chaos needs a setup with worker processes (${DISTRIBUTED_SETUPS.join(', ')}); the ${setup} setup runs in one process`);
  }
  if (values['relay-once'] && setup !== 'postgres-sqs') problems.push(`--relay-once needs the postgres-sqs setup (the Lambda entry point of @courier/aws), got '${setupText}'`);
  const dataLayers = values['data-layer'] === undefined ? DEFAULT_DATA_LAYERS : parseDataLayers(values['data-layer'], problems);
  // The other setups' services are fixed: MikroORM (a NestJS module on it in -nest), or in memory.
  if (values['data-layer'] !== undefined && setup !== 'postgres-rabbitmq') problems.push(`--data-layer needs the postgres-rabbitmq setup, got '${setupText}'`);
  const relay = values.relay ?? 'polling';
  if (!(RELAY_MODES as readonly string[]).includes(relay)) problems.push(`--relay must be one of ${RELAY_MODES.join(', ')}, got '${relay}'`);
  else if (relay === 'log' && !LOG_RELAY_SETUPS.includes(setup as SetupName)) {
    problems.push(`--relay log needs a setup whose workers relay from a PostgreSQL outbox (${LOG_RELAY_SETUPS.join(', ')}), got '${setupText}'`);
  } else if (relay === 'log' && values['relay-once']) problems.push(`--relay log and --relay-once exclude each other: --relay-once runs no relay in the workers`);
  else if (relay === 'log' && (dataLayers.orders !== 'mikro-orm' || dataLayers.payments !== 'mikro-orm')) {
    // The log-tailing store wraps a PostgreSQL store of the engine; the example builds it over the MikroORM one only.
    problems.push(`--relay log needs both services on MikroORM in this example, got --data-layer ${values['data-layer']}`);
  }
  const metricsPortText = values['metrics-port'];
  const metricsPort = metricsPortText === undefined ? undefined : Number(metricsPortText);
  if (metricsPort !== undefined) {
    if (!Number.isSafeInteger(metricsPort) || metricsPort < 0 || metricsPort > 65_534) problems.push(`--metrics-port must be a port from 0 to 65534 (payments takes the next one), got '${metricsPortText}'`);
    else if (!(DISTRIBUTED_SETUPS as readonly string[]).includes(setup)) problems.push(`--metrics-port needs a setup with worker processes (${DISTRIBUTED_SETUPS.join(', ')}); the ${setup} setup runs in one process`);
  }
  if (problems.length > 0) throw new UsageError(problems.join('; '));
  return {
    kind: 'run',
    options: {
      setup: setup as SetupName,
      orders,
      chaos: values.chaos,
      timeoutMs: Math.round(timeout * 1000),
      stallMs: Math.round(stall * 1000),
      keep: values.keep,
      verbose: values.verbose,
      pgUrl: env['COURIER_PG_URL'] ?? 'postgres://courier:courier@127.0.0.1:5432/courier_test',
      rabbitMqUrl: env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672',
      kafkaBrokers: env['COURIER_KAFKA_BROKERS'] ?? '127.0.0.1:9092',
      sqsEndpoint: env['COURIER_SQS_ENDPOINT'] || 'http://127.0.0.1:9324',
      snsEndpoint: env['COURIER_SNS_ENDPOINT'] || undefined,
      relayOnce: values['relay-once'],
      dataLayers,
      relay: relay as RelayMode,
      metricsPort,
    },
  };
}

/**
 * Reads `--data-layer`: one layer for both services (`prisma`), or `service=layer` pairs separated
 * by commas (`orders=prisma`); a service not named keeps MikroORM. Adds what is wrong to `problems`.
 */
function parseDataLayers(text: string, problems: string[]): Readonly<Record<WorkerRole, DataLayer>> {
  const isLayer = (value: string): value is DataLayer => (DATA_LAYERS as readonly string[]).includes(value);
  if (isLayer(text)) return { orders: text, payments: text };
  const layers: Record<WorkerRole, DataLayer> = { ...DEFAULT_DATA_LAYERS };
  const seen = new Set<string>();
  for (const part of text.split(',')) {
    const [service = '', layer = '', ...rest] = part.split('=').map((piece) => piece.trim());
    if ((service !== 'orders' && service !== 'payments') || rest.length > 0 || !part.includes('=')) {
      problems.push(`--data-layer must be ${DATA_LAYERS.join(' or ')}, or service=layer pairs such as orders=prisma,payments=mikro-orm; got '${text}'`);
      return DEFAULT_DATA_LAYERS;
    }
    if (seen.has(service)) problems.push(`--data-layer names '${service}' twice`);
    seen.add(service);
    if (isLayer(layer)) layers[service] = layer;
    else problems.push(`--data-layer: '${service}' must be ${DATA_LAYERS.join(' or ')}, got '${layer}'`);
  }
  return layers;
}
