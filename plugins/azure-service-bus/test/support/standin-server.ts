// The stand-in every test of this package talks to: one per test process, started on first
// use on a free port. SIGKILLed workers of the bus suite reach the parent's through
// COURIER_ASB_STANDIN_PORT, which the parent sets before it starts them.
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

let started: Promise<{ host: string; port: number; server?: ServiceBusStandIn }> | undefined;

/** Address of the stand-in: the parent's (from the environment; no `server` then) or one started here. */
export function standIn(): Promise<{ host: string; port: number; server?: ServiceBusStandIn }> {
  started ??= (async () => {
    const inherited = Number(process.env['COURIER_ASB_STANDIN_PORT']);
    if (Number.isSafeInteger(inherited) && inherited > 0) return { host: '127.0.0.1', port: inherited };
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
    return { host: '127.0.0.1', port: server.port, server };
  })();
  return started;
}

/** A connection string for the SDK to reach `port` (the stand-in, or a proxy in front of it). */
export const standInConnectionString = (port: number): string =>
  `Endpoint=sb://127.0.0.1:${port};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=standin;UseDevelopmentEmulator=true`;
