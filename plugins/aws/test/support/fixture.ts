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
import { connect as tcpConnect } from 'node:net';
import { DeleteQueueCommand, ListQueuesCommand, SQSClient } from '@aws-sdk/client-sqs';
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

let reachable: Promise<void> | undefined;

/** Fails loudly, saying how to start one, when no SQS server answers (never a silent skip). */
export function assertSqsAnswers(): Promise<void> {
  if (onRealAws) return Promise.resolve();
  reachable ??= new Promise<void>((resolve, reject) => {
    const socket = tcpConnect({ host, port }, () => {
      socket.destroy();
      resolve();
    });
    socket.setTimeout(3_000, () => socket.destroy(new Error('timed out')));
    socket.on('error', (error) =>
      reject(new Error(`no SQS server answers on ${sqsEndpoint} (${error.message}): start ElasticMQ with \`bash scripts/elasticmq.sh start\` (Java 17 + Maven), or point COURIER_SQS_ENDPOINT at yours`)),
    );
  });
  return reachable;
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

export async function createSqsFixture({ testId }: FixtureContext, config: Partial<SqsTransportConfig> = {}): Promise<TransportFixture> {
  await assertSqsAnswers();
  const entries = new Map<Transport, { proxy: TcpProxy | undefined; killed: boolean }>();
  let down = false;
  let refuse: ((envelope: Envelope) => boolean) | undefined;
  let duplicating = false;

  const make = async (): Promise<SqsTransport> => {
    let proxy: TcpProxy | undefined;
    let client: SQSClient;
    if (onRealAws) {
      client = sqsClient();
    } else {
      proxy = await TcpProxy.create({ host, port });
      if (!down) await proxy.open();
      client = sqsClient(`${target.protocol}//127.0.0.1:${proxy.port}`);
    }
    refuseMatching(client, () => refuse, () => duplicating);
    const transport = new SqsTransport({ client, prefix: `${testId}-`, ...TEST_CONFIG, ...config });
    entries.set(transport, { proxy, killed: false });
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
      await entry.proxy.close();
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
      await Promise.all([...entries.values()].map((entry) => entry.proxy?.close() ?? Promise.resolve()));
      if (process.env['COURIER_CONFORMANCE_WORKER'] === undefined) await deleteTestQueues(testId);
    },
  };
  if (!onRealAws) {
    return {
      ...fixture,
      outage: {
        begin: async () => {
          down = true;
          await Promise.all([...entries.values()].map((entry) => entry.proxy?.close() ?? Promise.resolve()));
        },
        end: async () => {
          down = false;
          await Promise.all([...entries.values()].filter((entry) => !entry.killed).map((entry) => entry.proxy?.open() ?? Promise.resolve()));
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
