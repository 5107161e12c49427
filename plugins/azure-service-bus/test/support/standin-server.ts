// The stand-in every test of this package talks to: one per test process, started on first
// use on a free port. SIGKILLed workers of the bus suite reach the parent's through
// COURIER_ASB_STANDIN_PORT, which the parent sets before it starts them.
import { ServiceBusAdministrationClient } from '@azure/service-bus';
import { ServiceBusStandIn } from '../../standin/service-bus-standin.js';

/** Lock duration of the stand-in's entities: redelivery after a crash waits for it. */
export const STANDIN_LOCK_MS = 3_000;
/** Broker ids starting with this are refused by the stand-in (the fixture's `rejectPublish`). */
export const REFUSED_ID_PREFIX = 'standin-refuse:';

/**
 * Marks a queue-mode fixture's prefix (`<testId><mark>`): the stand-in makes a queue of a
 * path holding it (plain, or session-enabled for {@link SESSION_QUEUE_MARK}) where it takes
 * any other sent-to path for a topic. Lower case: the stand-in's entity names are.
 */
export const QUEUE_MARK = '.q_.';
export const SESSION_QUEUE_MARK = '.qs_.';
const isQueuePath = (path: string) => path.toLowerCase().includes(QUEUE_MARK) || path.toLowerCase().includes(SESSION_QUEUE_MARK);

/** Where a test reaches the stand-in: its AMQP port, its management (HTTP) port, and the server when this process runs it. */
export interface StandInAddress {
  readonly host: string;
  readonly port: number;
  readonly managementPort: number;
  readonly server?: ServiceBusStandIn;
}

let started: Promise<StandInAddress> | undefined;

/** Address of the stand-in: the parent's (from the environment; no `server` then) or one started here. */
export function standIn(): Promise<StandInAddress> {
  started ??= (async () => {
    const inherited = Number(process.env['COURIER_ASB_STANDIN_PORT']);
    const inheritedManagement = Number(process.env['COURIER_ASB_STANDIN_MANAGEMENT_PORT']);
    if (Number.isSafeInteger(inherited) && inherited > 0) return { host: '127.0.0.1', port: inherited, managementPort: inheritedManagement };
    const server = await ServiceBusStandIn.start({
      isTopic: (path) => !isQueuePath(path),
      entityDefaults: (path) => ({
        lockDurationMs: STANDIN_LOCK_MS,
        maxDeliveryCount: 100,
        duplicateDetection: true,
        // A queue's sessions are set when it is made (a subscription's by its first receiver).
        requiresSession: path.toLowerCase().includes(SESSION_QUEUE_MARK),
      }),
      refuse: (message) => (String(message.message_id ?? '').startsWith(REFUSED_ID_PREFIX) ? 'the test refuses this message' : undefined),
    });
    process.env['COURIER_ASB_STANDIN_PORT'] = String(server.port);
    process.env['COURIER_ASB_STANDIN_MANAGEMENT_PORT'] = String(server.managementPort);
    return { host: '127.0.0.1', port: server.port, managementPort: server.managementPort, server };
  })();
  return started;
}

/** A connection string for the SDK to reach `port` (the stand-in, or a proxy in front of it). */
export const standInConnectionString = (port: number): string =>
  `Endpoint=sb://127.0.0.1:${port};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=standin;UseDevelopmentEmulator=true`;

/**
 * An administration client of the stand-in whose management endpoint listens on
 * `managementPort` (the SDK's client speaks HTTPS to the connection string's host; a
 * pipeline policy sends its requests to the stand-in's plain HTTP port instead).
 */
export function standInAdministration(managementPort: number): ServiceBusAdministrationClient {
  const client = new ServiceBusAdministrationClient(standInConnectionString(1), { retryOptions: { maxRetries: 1, retryDelayInMs: 200 } });
  // Its constructor hands the SDK's ServiceClient a finished pipeline (`additionalPolicies` is ignored then): added after.
  client.pipeline.addPolicy(ServiceBusStandIn.managementPolicyFor(managementPort) as never);
  return client;
}
