import {
  consoleLogger,
  createBus,
  defineMessage,
  type Bus,
  type BusConfig,
  type FaultHook,
  type InboxStore,
  type Logger,
  type MessageDefinition,
  type Transport,
} from '@courier/core';
import type { StoreFixture } from '../fixtures.js';
import { Ledger } from './invariants.js';
import type { ScenarioAction } from './scenarios.js';
import { seededRandom } from './seeded-random.js';

/** Payload of the suite's work message. */
export interface WorkPayload {
  readonly key: string | null;
  readonly seq: number;
  /** The handler always throws for this message (it must end dead-lettered). */
  readonly poison?: boolean;
}

/** Names private to one test, so scenarios run concurrently on one broker and database. */
export interface World {
  readonly testId: string;
  readonly consumer: string;
  readonly work: MessageDefinition<WorkPayload, WorkPayload>;
}

/** Builds the names of one test's world. */
export function createWorld(testId: string): World {
  return {
    testId,
    consumer: `${testId}.consumer`,
    work: defineMessage('conformance.Work', { version: 1, topic: `${testId}.work` }) as MessageDefinition<WorkPayload, WorkPayload>,
  };
}

/** Engine settings for scenarios: short leases and backoffs so crashes resolve in seconds. */
export interface ScenarioTuning {
  readonly leaseMs: number;
  readonly batchSize: number;
  readonly maxAttempts: number;
  readonly maxCrashes: number;
  /** The subscription's `crashWindowMs`. */
  readonly crashWindowMs: number;
  readonly concurrency: number;
  readonly ordered: boolean;
}

/** Defaults for {@link ScenarioTuning}. */
export const DEFAULT_TUNING: ScenarioTuning = {
  leaseMs: 1_500,
  batchSize: 10,
  maxAttempts: 3,
  maxCrashes: 2,
  crashWindowMs: 10_000,
  concurrency: 4,
  ordered: true,
};

/** The workers' logger: COURIER_CONFORMANCE_LOG=debug|info|warn shows their logs when a scenario needs explaining. */
export function envLogger(): Logger | undefined {
  const level = process.env['COURIER_CONFORMANCE_LOG'];
  return level === 'debug' || level === 'info' || level === 'warn' ? consoleLogger(level) : undefined;
}

/** How long the completion watch holds each confirm (see `completionWatch`). */
const CONFIRM_DELAY_MS = 15;

/**
 * Watches a worker's completions: every row a store reports at `complete-before-commit`
 * must be one this worker's transport confirmed. A completion that touches any other row
 * (a row of another lease, one not yet sent) would mark a message published that the
 * broker may never get — lost only if its holder then dies, which a scenario rarely
 * arranges, so it is checked where it happens. Returns the transport to use and the hook.
 */
function completionWatch(transport: Transport, faults: FaultHook, onViolation: (problem: string) => void): { transport: Transport; faults: FaultHook } {
  const confirmed = new Set<string>();
  const publish: Transport['publish'] = async (messages, options) => {
    const results = await transport.publish(messages, options);
    // A confirm that takes a moment, as a real broker's does: an in-memory broker answers at
    // once, so one loop's batch would always be confirmed before another loop completes,
    // and a completion that strays into rows still in flight could never be seen.
    await new Promise((resolve) => setTimeout(resolve, CONFIRM_DELAY_MS));
    results.forEach((result, index) => {
      if (result.ok && messages[index]) confirmed.add(messages[index].messageId);
    });
    return results;
  };
  // Members read from the transport itself (bound), so one with #private state still works.
  const watched = new Proxy(transport, {
    get(target, property) {
      if (property === 'publish') return publish;
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
  return {
    transport: watched,
    faults: (point, context) => {
      if (point === 'complete-before-commit') {
        const unconfirmed = context.messageIds.filter((id) => !confirmed.has(id));
        if (unconfirmed.length > 0) onViolation(`the store completed ${unconfirmed.length} row(s) this relay never had confirmed: ${unconfirmed.slice(0, 5).join(', ')}`);
      }
      return faults(point, context);
    },
  };
}

/**
 * Creates a worker bus (relay and consumer) over the given store and transport
 * connection, with the suite's handler registered: it records one effect per message
 * in the handler's unit of work and throws for poison messages. With `faults` and
 * `onViolation`, every completion is checked against what this worker's transport
 * confirmed (see `completionWatch`).
 */
export function createWorkerBus<Tx>(
  world: World,
  store: StoreFixture<Tx>,
  transport: Transport,
  tuning: ScenarioTuning,
  extra: { faults?: FaultHook; logger?: Logger; onViolation?: (problem: string) => void } = {},
): Bus<Tx> {
  const logger = extra.logger ?? envLogger();
  if (extra.faults && extra.onViolation) {
    const watched = completionWatch(transport, extra.faults, extra.onViolation);
    transport = watched.transport;
    extra = { ...extra, faults: watched.faults };
  }
  const config: BusConfig<Tx> = {
    outbox: store.outbox,
    inbox: store.inbox,
    transport,
    retry: { maxAttempts: tuning.maxAttempts, initialDelayMs: 20, maxDelayMs: 100, jitter: 0.5 },
    relay: {
      batchSize: tuning.batchSize,
      leaseMs: tuning.leaseMs,
      pollIntervalMs: 50,
      // One attempt: if an outage burned an attempt, the message would be dead-lettered
      // and the invariant check would catch it.
      retry: { maxAttempts: 1 },
      pause: { initialDelayMs: 20, maxDelayMs: 250 },
    },
    ...(extra.faults ? { faults: extra.faults } : {}),
    ...(logger ? { logger } : {}),
  };
  const bus = createBus(config);
  bus.subscribe(
    world.consumer,
    world.work,
    async (message, ctx) => {
      if (message.payload.poison) throw new Error(`poison message ${message.messageId} fails by design`);
      await store.recordEffect(ctx.tx, message.messageId);
    },
    { ordered: tuning.ordered, concurrency: tuning.concurrency, maxCrashes: tuning.maxCrashes, crashWindowMs: tuning.crashWindowMs },
  );
  return bus;
}

/** Shape of the traffic a scenario commits. */
export interface TrafficPlan {
  readonly messages: number;
  readonly keys: number;
  /** Largest number of messages per producer transaction. */
  readonly perTransaction: number;
  readonly rolledBackTransactions: number;
  /** Sequence numbers (0-based over all messages) that are poison. */
  readonly poison?: ReadonlySet<number>;
}

/**
 * Commits the planned traffic through the outbox, one producer transaction after
 * another, recording in the ledger what committed and what was rolled back. Every
 * fourth message is keyless. Returns the ids in commit order.
 */
export async function produce<Tx>(
  world: World,
  store: StoreFixture<Tx>,
  publisher: Pick<Bus<Tx>, 'outbox'>,
  ledger: Ledger,
  plan: TrafficPlan,
  random: () => number,
): Promise<string[]> {
  const ids: string[] = [];
  let seq = 0;
  let rollbacks = plan.rolledBackTransactions;
  while (seq < plan.messages) {
    const size = Math.min(plan.messages - seq, 1 + Math.floor(random() * plan.perTransaction));
    const staged: { id: string; key: string | null; seq: number }[] = [];
    await store.transaction(async (tx) => {
      for (let index = 0; index < size; index += 1) {
        const current = seq + index;
        const key = current % 4 === 3 ? null : `k${Math.floor(random() * plan.keys)}`;
        const payload: WorkPayload = { key, seq: current, ...(plan.poison?.has(current) ? { poison: true } : {}) };
        const id = await publisher.outbox(tx).publish(world.work, payload, key === null ? {} : { key });
        staged.push({ id, key, seq: current });
      }
    });
    for (const entry of staged) {
      ledger.commit(entry.id, entry.key, entry.seq);
      ids.push(entry.id);
    }
    seq += size;
    if (rollbacks > 0 && random() < 0.5) {
      rollbacks -= 1;
      const doomed: string[] = [];
      await store
        .transaction(async (tx) => {
          doomed.push(await publisher.outbox(tx).publish(world.work, { key: 'k0', seq: -1 }, { key: 'k0' }));
          throw new RolledBack();
        })
        .catch((error: unknown) => {
          if (!(error instanceof RolledBack)) throw error;
        });
      for (const id of doomed) ledger.rolledBack.add(id);
    }
  }
  return ids;
}

class RolledBack extends Error {
  override readonly name = 'RolledBack';
}

/** What {@link commitScenarioTraffic} committed. */
export interface CommittedTraffic {
  readonly world: World;
  readonly ledger: Ledger;
  readonly plan: TrafficPlan;
  /** Committed message ids in commit order. */
  readonly ids: readonly string[];
  /** The message the scenario singles out: the poison one, or the crash-loop victim. */
  readonly target: string | undefined;
}

/**
 * Commits a scenario's traffic (through a bus that is never started) and picks its
 * target, the same way in-process and process-level runs do.
 */
export async function commitScenarioTraffic<Tx>(
  testId: string,
  action: ScenarioAction,
  store: StoreFixture<Tx>,
  transport: Transport,
  seed: number,
  overrides: Partial<TrafficPlan> = {},
): Promise<CommittedTraffic> {
  const world = createWorld(testId);
  const ledger = new Ledger();
  const poisonSeq = action === 'poison' ? 5 : undefined;
  const plan: TrafficPlan = {
    messages: 24,
    keys: 4,
    perTransaction: 3,
    rolledBackTransactions: 2,
    ...overrides,
    ...(poisonSeq !== undefined ? { poison: new Set([poisonSeq]) } : {}),
  };
  const producer = createBus({ outbox: store.outbox, transport });
  const ids = await produce(world, store, producer, ledger, plan, seededRandom(seed));
  const target = poisonSeq !== undefined ? ids[poisonSeq] : action === 'crash-loop' || action === 'late-kills' || action === 'applied-kills' ? ids[Math.floor(ids.length / 2)] : undefined;
  return { world, ledger, plan, ids, target };
}

/** What the consumer logs once a suspect's run alone outlived its crash window (its count dropped). */
const WINDOW_PASSED = 'suspect outlived its crash window';

/**
 * Watches a worker's log for suspects whose run alone outlived the crash window, passing
 * every line on to `inner`. `passed(messageId, after)` resolves once more than `after`
 * such lines were seen for the message, or after `timeoutMs` (the scenario then fails on
 * its own assertions: a consumer that never says so counts the kill).
 */
export function crashWindowWatch(inner: Logger | undefined): {
  readonly logger: Logger;
  seen(messageId: string): number;
  passed(messageId: string, after: number, timeoutMs: number): Promise<void>;
} {
  const counts = new Map<string, number>();
  const waiters = new Set<() => void>();
  const note = (message: string, fields?: Record<string, unknown>): void => {
    if (!message.startsWith(WINDOW_PASSED) || typeof fields?.['messageId'] !== 'string') return;
    counts.set(fields['messageId'], (counts.get(fields['messageId']) ?? 0) + 1);
    for (const wake of [...waiters]) wake();
  };
  const logger: Logger = {
    debug: (message, fields) => inner?.debug(message, fields),
    info: (message, fields) => {
      note(message, fields);
      inner?.info(message, fields);
    },
    warn: (message, fields) => inner?.warn(message, fields),
    error: (message, fields) => inner?.error(message, fields),
  };
  return {
    logger,
    seen: (messageId) => counts.get(messageId) ?? 0,
    passed: (messageId, after, timeoutMs) =>
      new Promise<void>((resolve) => {
        const done = (): void => {
          waiters.delete(check);
          clearTimeout(timer);
          resolve();
        };
        const check = (): void => {
          if ((counts.get(messageId) ?? 0) > after) done();
        };
        const timer = setTimeout(done, timeoutMs);
        waiters.add(check);
        check();
      }),
  };
}

/**
 * Whether a crash-loop target is already recorded in the consumer's inbox (dead-lettering
 * records it, as a handled run does). The crash-loop fault point sits before the
 * consumer's inbox check, but a copy of a parked message that arrives later (the relay
 * publishes again what a killed relay never marked) is a duplicate the consumer
 * acknowledges without running the handler: it cannot kill the process that receives it.
 * So the scenario's hooks stop killing once this is true. Read-only: the probe's work
 * throws, so nothing is recorded.
 */
export async function parkedAlready<Tx>(inbox: InboxStore<Tx>, consumer: string, messageId: string): Promise<boolean> {
  const probe = new Error('read-only probe');
  try {
    return (await inbox.run(messageId, consumer, async () => {
      throw probe;
    })).duplicate;
  } catch {
    // The probe's own throw (not recorded), or the store is unavailable: keep killing.
    return false;
  }
}
