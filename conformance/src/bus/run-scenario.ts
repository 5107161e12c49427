import { newMessageId, type Bus, type Envelope, type FaultHook, type Transport } from '@courier/core';
import type { FixtureContext, StoreFixture, StoreFixtureFactory, TransportFixture, TransportFixtureFactory } from '../fixtures.js';
import { checkInvariants, type Ledger, type InvariantReport, type Observed } from './invariants.js';
import { InjectedFault, type ScenarioSpec } from './scenarios.js';
import { eventually } from '../support/eventually.js';
import { uniqueId } from '../support/unique-id.js';
import { commitScenarioTraffic, createWorkerBus, DEFAULT_TUNING, type ScenarioTuning, type TrafficPlan, type World } from './world.js';

/** How a worker "crashes" in-process. `freeze` needs a store whose open transactions hold no locks. */
export type InProcessCrashMode = 'freeze' | 'throw';

/** The factories a bus scenario runs on. */
export interface BusFactories<Tx> {
  readonly store: StoreFixtureFactory<Tx>;
  readonly transport: TransportFixtureFactory;
}

/** Everything a scenario run reports. */
export interface ScenarioResult extends InvariantReport {
  readonly seed: number;
  readonly testId: string;
  readonly observed: Observed;
  /** Messages the scenario singled out (poison, crash-loop target, duplicated). */
  readonly target: string | undefined;
  /** Workers started in all (replacements included). */
  readonly workersStarted: number;
  readonly relayPauses: number;
  /** Whether the fault actually happened at its point (a scenario whose point is never reached proves nothing). */
  readonly faultFired: boolean;
}

/** Per-run options. */
export interface ScenarioRunOptions {
  readonly seed: number;
  readonly tuning?: Partial<ScenarioTuning>;
  readonly plan?: Partial<TrafficPlan>;
  readonly timeoutMs?: number;
}

/** Reads the end state of a world. */
export async function observe<Tx>(world: World, store: StoreFixture<Tx>, transport: Transport): Promise<Observed> {
  const [effects, consumerDead, outboxDead, halted] = await Promise.all([
    store.readEffects(),
    transport.deadLetters ? transport.deadLetters.list(world.consumer, { limit: 10_000 }) : Promise.resolve([]),
    store.outbox.listDead({ limit: 10_000 }),
    store.outbox.listHalted({ limit: 10_000 }),
  ]);
  return { effects, consumerDead, outboxDead, halted };
}

/** Waits until every committed message is in an end state, then checks the invariants. */
export async function settle<Tx>(
  world: World,
  ledger: Ledger,
  store: StoreFixture<Tx>,
  transport: Transport,
  ordered: boolean,
  timeoutMs: number,
): Promise<{ report: InvariantReport; observed: Observed }> {
  return eventually(
    async () => {
      // The database or broker may be away (an outage scenario): observe throws, and we look again.
      const observed = await observe(world, store, transport);
      const report = checkInvariants(ledger, observed, { ordered });
      const lost = report.problems.filter((problem) => problem.includes('was lost'));
      if (lost.length > 0) throw new Error(`scenario did not settle: ${lost.slice(0, 5).join('; ')}`);
      return { report, observed };
    },
    { timeoutMs, intervalMs: 50 },
  );
}

interface Worker<Tx> {
  readonly bus: Bus<Tx>;
  readonly connection: Transport;
}

/**
 * Runs one scenario in-process: commits traffic, runs workers with the fault armed,
 * replaces crashed workers, waits until every message reached an end state and
 * checks the invariants. Throws if a fixture lacks what the scenario needs (callers
 * gate on that first).
 */
export async function runInProcessScenario<Tx>(
  factories: BusFactories<Tx>,
  spec: ScenarioSpec,
  mode: InProcessCrashMode,
  options: ScenarioRunOptions,
): Promise<ScenarioResult> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const store = await factories.store(context);
  let transport: TransportFixture | undefined;
  const workers = new Set<Worker<Tx>>();
  try {
    transport = await factories.transport(context);
    const fixture = transport;
    const tuning: ScenarioTuning = { ...DEFAULT_TUNING, ...options.tuning };
    const { world, ledger, plan, target: chosen } = await commitScenarioTraffic(testId, spec.action, store, fixture.transport, options.seed, options.plan);
    let target = chosen;

    let armed = true;
    let crashLoops = 0;
    let started = 0;
    let pauses = 0;
    const duplicateArrivals = new Map<string, number>();

    const startWorker = async (): Promise<void> => {
      const connection = await fixture.connect();
      const crash = (): Promise<never> => {
        if (workers.has(self)) {
          workers.delete(self);
          pauses += self.bus.health().counters.relayPauses;
          void fixture.kill(self.connection).catch(() => undefined);
          void self.bus.stop({ timeoutMs: 0 }).catch(() => undefined);
        }
        setTimeout(() => void startWorker().catch(() => undefined), 10);
        return new Promise<never>(() => {});
      };
      const faults: FaultHook = async (point, at) => {
        if (point !== spec.point) return;
        switch (spec.action) {
          case 'crash':
          case 'poison':
            if (!armed) return;
            if (spec.action === 'poison' && !at.messageIds.includes(target!)) return;
            armed = false;
            if (mode === 'throw') throw new InjectedFault(point);
            return crash();
          case 'crash-loop':
            if (!at.messageIds.includes(target!)) return;
            crashLoops += 1;
            return crash();
          case 'stall':
            if (!armed) return;
            armed = false;
            await new Promise((resolve) => setTimeout(resolve, tuning.leaseMs * 1.6));
            return;
          case 'duplicate': {
            if (target === undefined || !at.messageIds.includes(target)) return;
            const arrivals = (duplicateArrivals.get(target) ?? 0) + 1;
            duplicateArrivals.set(target, arrivals);
            if (arrivals === 1) {
              // Hold the first copy until the second arrives, so both race into the inbox.
              const deadline = Date.now() + 5_000;
              while ((duplicateArrivals.get(target) ?? 0) < 2 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5));
            }
            return;
          }
          case 'broker-outage':
            if (!armed || !fixture.outage) return;
            armed = false;
            await fixture.outage.begin();
            setTimeout(() => void fixture.outage?.end(), 300);
            return;
          case 'database-outage':
            if (!armed || !store.outage) return;
            armed = false;
            await store.outage.begin();
            setTimeout(() => void store.outage?.end(), 300);
            return;
        }
      };
      const self: Worker<Tx> = { bus: createWorkerBus(world, store, connection, tuning, { faults }), connection };
      const { bus } = self;
      workers.add(self);
      started += 1;
      await bus.start();
    };

    await startWorker();
    if (spec.action === 'stall') await startWorker();
    if (spec.action === 'duplicate') {
      target = newMessageId();
      const seq = plan.messages;
      const envelope: Envelope = {
        messageId: target,
        type: world.work.type,
        version: 1,
        topic: world.work.topic,
        occurredAt: new Date().toISOString(),
        key: null,
        correlationId: target,
        causationId: null,
        traceparent: null,
        tracestate: null,
        headers: {},
        payload: JSON.stringify({ key: null, seq }),
      };
      ledger.commit(target, null, seq);
      const results = await fixture.transport.publish([envelope, envelope]);
      if (!results.every((result) => result.ok)) throw new Error('could not publish the duplicated message');
    }

    const { report, observed } = await settle(world, ledger, store, fixture.transport, tuning.ordered, options.timeoutMs ?? 45_000);
    for (const worker of workers) pauses += worker.bus.health().counters.relayPauses;
    const faultFired =
      spec.action === 'crash-loop' ? crashLoops > 0 : spec.action === 'duplicate' ? (duplicateArrivals.get(target!) ?? 0) >= 2 : !armed;
    return { ...report, seed: options.seed, testId, observed, target, workersStarted: started, relayPauses: pauses, faultFired };
  } finally {
    await Promise.all([...workers].map((worker) => worker.bus.stop({ timeoutMs: 2_000 }).catch(() => undefined)));
    await Promise.all([...workers].map((worker) => worker.connection.close().catch(() => undefined)));
    await transport?.close().catch(() => undefined);
    await store.close().catch(() => undefined);
  }
}
