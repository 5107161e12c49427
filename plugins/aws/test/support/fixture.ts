// The SQS transport fixture: every transport reaches the SQS endpoint through a TCP proxy of
// its own, so a test can cut one transport (kill) or all of this fixture's transports
// (outage) without touching the shared server.
//
// Environment (tests only; library code reads none):
//   COURIER_SQS_ENDPOINT   the SQS endpoint (default http://127.0.0.1:9324, ElasticMQ from
//                          scripts/elasticmq.sh). For real AWS set COURIER_SQS_REAL=1 and the
//                          usual AWS_REGION / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a
//                          profile): the endpoint is then the region's, reached directly
//                          (kill and outage cases are skipped: no proxy in front of AWS).
//   COURIER_SNS_ENDPOINT   SNS → SQS tests: an SNS endpoint (LocalStack, say). Unset (and not
//                          on real AWS, where the region's SNS is used), the tests start the
//                          SNS stand-in (support/sns-standin.ts) in the test process, delivering
//                          into the SQS server above; SIGKILLed workers reach the parent's
//                          through COURIER_SNS_STANDIN_PORT.
import { setTimeout as sleep } from 'node:timers/promises';
import { DeleteQueueCommand, ListQueuesCommand, SQSClient } from '@aws-sdk/client-sqs';
import { DeleteTopicCommand, ListTopicsCommand, SNSClient } from '@aws-sdk/client-sns';
import { SnsStandIn } from './sns-standin.js';
import type { Envelope, Transport } from '@courier/core';
import { TcpProxy, type FixtureContext, type TransportFixture } from '@courier/conformance';
import { SqsTransport, type SqsTransportConfig } from '../../src/index.js';

export const sqsEndpoint = process.env['COURIER_SQS_ENDPOINT'] ?? 'http://127.0.0.1:9324';
export const onRealAws = process.env['COURIER_SQS_REAL'] === '1';
const target = new URL(sqsEndpoint);
const host = target.hostname;
const port = Number(target.port || 80);

/** Test tuning: a crashed consumer's messages come back after 5 s; receives wait 1 s so closing is quick. */
export const TEST_CONFIG = { visibilityTimeoutSeconds: 5, waitTimeSeconds: 1 } satisfies Partial<SqsTransportConfig>;

/** An SQS client for `endpoint` (ElasticMQ takes any region and credentials). */
export function sqsClient(endpoint: string = sqsEndpoint): SQSClient {
  if (onRealAws) return new SQSClient({ maxAttempts: 3 });
  return new SQSClient({
    endpoint,
    region: 'us-east-1',
    credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' },
    maxAttempts: 2,
    requestHandler: { connectionTimeout: 2_000, requestTimeout: 30_000 },
  });
}

/** An SNS client for `endpoint` (the stand-in takes any region and credentials). */
export function snsClient(endpoint: string): SNSClient {
  if (onRealAws) return new SNSClient({ maxAttempts: 3 });
  return new SNSClient({
    endpoint,
    region: 'us-east-1',
    credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' },
    maxAttempts: 2,
    requestHandler: { connectionTimeout: 2_000, requestTimeout: 30_000 },
  });
}

let standIn: Promise<URL> | undefined;

/**
 * The SNS endpoint of the tests: COURIER_SNS_ENDPOINT, else the parent's stand-in
 * (COURIER_SNS_STANDIN_PORT), else a stand-in started here on a free port.
 */
export function snsEndpoint(): Promise<URL> {
  standIn ??= (async () => {
    const named = process.env['COURIER_SNS_ENDPOINT'];
    if (named !== undefined && named !== '') return new URL(named);
    const inherited = Number(process.env['COURIER_SNS_STANDIN_PORT']);
    if (Number.isSafeInteger(inherited) && inherited > 0) return new URL(`http://127.0.0.1:${inherited}`);
    await assertSqsAnswers();
    const server = await SnsStandIn.start({ sqs: sqsClient() });
    process.env['COURIER_SNS_STANDIN_PORT'] = String(server.port);
    return new URL(server.endpoint);
  })();
  return standIn;
}

let reachable: Promise<void> | undefined;

/** How long a test process waits for the SQS server to answer before it fails (a loaded 2-core machine can take a while). */
export const SQS_PATIENCE_MS = 60_000;

/**
 * Fails loudly, saying how to start one, when no SQS server answers (never a silent skip).
 * It waits for the server rather than checking once: a SIGKILLed-worker case starts a fresh
 * process on a loaded machine, where one connection attempt can time out or be refused while
 * the server is busy; that must not fail the case. A failure is not remembered, so a later
 * call asks again.
 */
export function assertSqsAnswers(): Promise<void> {
  if (onRealAws) return Promise.resolve();
  reachable ??= waitForSqs(sqsEndpoint).catch((error: unknown) => {
    reachable = undefined;
    throw error;
  });
  return reachable;
}

/**
 * Resolves once the SQS server at `endpoint` answers a `ListQueues` request, asking again every
 * half second for up to `patienceMs`; then rejects naming the endpoint, the last error and how
 * to start ElasticMQ.
 */
export async function waitForSqs(endpoint: string, patienceMs: number = SQS_PATIENCE_MS): Promise<void> {
  const deadline = Date.now() + patienceMs;
  const client = new SQSClient({
    endpoint,
    region: 'us-east-1',
    credentials: { accessKeyId: 'courier', secretAccessKey: 'courier' },
    maxAttempts: 1,
    requestHandler: { connectionTimeout: 5_000, requestTimeout: 15_000 },
  });
  try {
    for (;;) {
      try {
        await client.send(new ListQueuesCommand({ QueueNamePrefix: 'courier-probe-' }));
        return;
      } catch (error) {
        if (Date.now() + 500 >= deadline) {
          throw new Error(
            `no SQS server answers on ${endpoint} within ${Math.round(patienceMs / 1000)}s (${(error as Error).message}): start ElasticMQ with \`bash scripts/elasticmq.sh start\` (Java 17 + Maven), or point COURIER_SQS_ENDPOINT at yours`,
            { cause: error },
          );
        }
        await sleep(500);
      }
    }
  } finally {
    client.destroy();
  }
}

/**
 * Makes SQS itself refuse entries: a client middleware sets an out-of-range DelaySeconds on
 * every SendMessageBatch entry whose envelope `predicate` selects, and SQS answers that
 * entry alone with `InvalidParameterValue` while its neighbours are sent.
 */
function refuseMatching(client: SQSClient, predicate: () => ((envelope: Envelope) => boolean) | undefined, duplicating: () => boolean): void {
  client.middlewareStack.add(
    (next) => async (args) => {
      const test = predicate();
      const input = args.input as { Entries?: { MessageAttributes?: Record<string, { StringValue?: string }>; MessageBody?: string; DelaySeconds?: number; MessageDeduplicationId?: string }[] };
      // injectDuplicate: FIFO queues drop a second copy with the same MessageDeduplicationId (the messageId) for 5 minutes.
      if (duplicating() && Array.isArray(input.Entries)) {
        for (const entry of input.Entries) if (entry.MessageDeduplicationId !== undefined) entry.MessageDeduplicationId = `${entry.MessageDeduplicationId}-duplicate`;
      }
      if (test && Array.isArray(input.Entries)) {
        for (const entry of input.Entries) {
          const metadata = entry.MessageAttributes?.['courier-envelope']?.StringValue;
          if (metadata !== undefined && test({ ...(JSON.parse(metadata) as Envelope), payload: entry.MessageBody ?? '' })) entry.DelaySeconds = 901;
        }
      }
      return next(args);
    },
    { step: 'initialize', name: 'courierRefuseMatching' },
  );
}

/**
 * The SNS side of {@link refuseMatching}: a PublishBatch entry whose envelope `predicate`
 * selects gets a `Number` attribute that is no number, and SNS refuses that entry alone
 * (InvalidParameterValue, a sender fault) — on AWS as on the stand-in.
 */
function refuseMatchingOnSns(client: SNSClient, predicate: () => ((envelope: Envelope) => boolean) | undefined, duplicating: () => boolean): void {
  client.middlewareStack.add(
    (next) => async (args) => {
      const test = predicate();
      const input = args.input as { PublishBatchRequestEntries?: { MessageAttributes?: Record<string, { DataType?: string; StringValue?: string }>; Message?: string; MessageDeduplicationId?: string }[] };
      const entries = input.PublishBatchRequestEntries;
      if (duplicating() && Array.isArray(entries)) {
        for (const entry of entries) if (entry.MessageDeduplicationId !== undefined) entry.MessageDeduplicationId = `${entry.MessageDeduplicationId}-duplicate`;
      }
      if (test && Array.isArray(entries)) {
        for (const entry of entries) {
          const metadata = entry.MessageAttributes?.['courier-envelope']?.StringValue;
          if (metadata !== undefined && test({ ...(JSON.parse(metadata) as Envelope), payload: entry.Message ?? '' })) {
            entry.MessageAttributes = { ...entry.MessageAttributes, 'courier-refuse': { DataType: 'Number', StringValue: 'refused by the test' } };
          }
        }
      }
      return next(args);
    },
    { step: 'initialize', name: 'courierRefuseMatchingSns' },
  );
}

/** The SNS → SQS transport fixture: {@link createSqsFixture} with an SNS client through a proxy of its own per transport. */
export function createSnsSqsFixture(context: FixtureContext, config: Partial<SqsTransportConfig> = {}): Promise<TransportFixture> {
  return createSqsFixture(context, config, true);
}

export async function createSqsFixture({ testId }: FixtureContext, config: Partial<SqsTransportConfig> = {}, withSns = false): Promise<TransportFixture> {
  await assertSqsAnswers();
  const sns = withSns && !onRealAws ? await snsEndpoint() : undefined;
  const entries = new Map<Transport, { proxy: TcpProxy | undefined; snsProxy: TcpProxy | undefined; killed: boolean }>();
  let down = false;
  let refuse: ((envelope: Envelope) => boolean) | undefined;
  let duplicating = false;

  const make = async (): Promise<SqsTransport> => {
    let proxy: TcpProxy | undefined;
    let snsProxy: TcpProxy | undefined;
    let client: SQSClient;
    let topics: SNSClient | undefined;
    if (onRealAws) {
      client = sqsClient();
      if (withSns) topics = snsClient('');
    } else {
      proxy = await TcpProxy.create({ host, port });
      if (!down) await proxy.open();
      client = sqsClient(`${target.protocol}//127.0.0.1:${proxy.port}`);
      if (sns !== undefined) {
        snsProxy = await TcpProxy.create({ host: sns.hostname, port: Number(sns.port || 80) });
        if (!down) await snsProxy.open();
        topics = snsClient(`${sns.protocol}//127.0.0.1:${snsProxy.port}`);
      }
    }
    if (topics !== undefined) refuseMatchingOnSns(topics, () => refuse, () => duplicating);
    else refuseMatching(client, () => refuse, () => duplicating);
    const transport = new SqsTransport({ client, ...(topics ? { sns: topics } : {}), prefix: `${testId}-`, ...TEST_CONFIG, ...config });
    entries.set(transport, { proxy, snsProxy, killed: false });
    return transport;
  };

  const transport = await make();
  const fixture: TransportFixture = {
    transport,
    connect: () => make(),
    kill: async (victim) => {
      const entry = entries.get(victim);
      if (!entry) throw new Error('kill: not a transport of this fixture');
      if (!entry.proxy) throw new Error('kill needs the proxy, absent on real AWS');
      // A crash: connections cut, nothing settled; its messages come back after their visibility timeout.
      entry.killed = true;
      await Promise.all([entry.proxy.close(), entry.snsProxy?.close() ?? Promise.resolve()]);
    },
    rejectPublish: async (predicate) => {
      refuse = predicate;
    },
    injectDuplicate: async (envelope) => {
      duplicating = true;
      try {
        const [result] = await transport.publish([envelope]);
        if (!result?.ok) throw new Error(`injectDuplicate failed: ${result && !result.ok ? result.error.message : 'no result'}`);
      } finally {
        duplicating = false;
      }
    },
    close: async () => {
      await Promise.all([...entries].filter(([, entry]) => !entry.killed).map(([t]) => t.close().catch(() => undefined)));
      await Promise.all([...entries.values()].flatMap((entry) => [entry.proxy?.close() ?? Promise.resolve(), entry.snsProxy?.close() ?? Promise.resolve()]));
      if (process.env['COURIER_CONFORMANCE_WORKER'] === undefined) await Promise.all([deleteTestQueues(testId), withSns ? deleteTestTopics(testId) : Promise.resolve()]);
    },
  };
  if (!onRealAws) {
    return {
      ...fixture,
      ...(sns !== undefined && process.env['COURIER_SNS_STANDIN_PORT'] ? { workerEnv: () => ({ COURIER_SNS_STANDIN_PORT: process.env['COURIER_SNS_STANDIN_PORT']! }) } : {}),
      outage: {
        begin: async () => {
          down = true;
          await Promise.all([...entries.values()].flatMap((entry) => [entry.proxy?.close() ?? Promise.resolve(), entry.snsProxy?.close() ?? Promise.resolve()]));
        },
        end: async () => {
          down = false;
          await Promise.all([...entries.values()].filter((entry) => !entry.killed).flatMap((entry) => [entry.proxy?.open() ?? Promise.resolve(), entry.snsProxy?.open() ?? Promise.resolve()]));
        },
      },
    };
  }
  return fixture;
}

/** Deletes the queues whose names start with `<testId>-` (best effort). */
export async function deleteTestQueues(testId: string): Promise<void> {
  const client = sqsClient();
  try {
    const { QueueUrls = [] } = await client.send(new ListQueuesCommand({ QueueNamePrefix: `${testId}-` }));
    await Promise.all(QueueUrls.map((url) => client.send(new DeleteQueueCommand({ QueueUrl: url })).catch(() => undefined)));
  } catch {
    // Clean-up is best effort.
  } finally {
    client.destroy();
  }
}

/** Deletes the SNS topics whose names start with `<testId>-` (best effort; their subscriptions go with them). */
export async function deleteTestTopics(testId: string): Promise<void> {
  const client = snsClient(onRealAws ? '' : (await snsEndpoint()).href);
  try {
    let token: string | undefined;
    const arns: string[] = [];
    do {
      const page = await client.send(new ListTopicsCommand(token === undefined ? {} : { NextToken: token }));
      for (const topic of page.Topics ?? []) if (topic.TopicArn?.split(':').at(-1)?.startsWith(`${testId}-`)) arns.push(topic.TopicArn);
      token = page.NextToken;
    } while (token !== undefined);
    await Promise.all(arns.map((arn) => client.send(new DeleteTopicCommand({ TopicArn: arn })).catch(() => undefined)));
  } catch {
    // Clean-up is best effort.
  } finally {
    client.destroy();
  }
}

/**
 * The SIGKILL (process) scenarios of the bus suite through SNS, or why they are skipped.
 * They run with COURIER_AWS_FULL=1, or whenever a real SNS is named (COURIER_SNS_ENDPOINT,
 * COURIER_SQS_REAL=1). In the default run (CI) they are skipped: the same scenarios run on
 * SQS standard and FIFO (bus.test.ts, bus-fifo.test.ts), where the relay and the consumer
 * they kill are the same code and only the publish call differs (PublishBatch instead of
 * SendMessageBatch, which the in-process scenarios here still exercise at every fault
 * point). On the 2-core CI machine at load ~25 the two SNS files took ~5 and ~9 minutes
 * with them; all passed when last run in full (2026-12-05: 38 passed, 9 capability skips each).
 */
export function snsProcessScenarios(module: string): { process: { module: string; execArgv: string[] } } | { processSkipReason: string } {
  const full = process.env['COURIER_AWS_FULL'] === '1' || onRealAws || process.env['COURIER_SNS_ENDPOINT'] !== undefined;
  return full
    ? { process: { module, execArgv: ['--conditions=@courier/source'] } }
    : { processSkipReason: 'SIGKILL scenarios through SNS run with COURIER_AWS_FULL=1 (CI runs them on SQS standard and FIFO: same relay and consumer, only the publish call differs)' };
}
