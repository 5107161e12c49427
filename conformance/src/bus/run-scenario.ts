import { describeError, newMessageId, type AppendResult, type Bus, type Envelope, type FaultHook, type Transport } from '@courier/core';
import type { FixtureContext, StoreFixture, StoreFixtureFactory, TransportFixture, TransportFixtureFactory } from '../fixtures.js';
import { checkInvariants, type Ledger, type InvariantReport, type Observed } from './invariants.js';
import { InjectedFault, type ScenarioSpec } from './scenarios.js';
import { uniqueId } from '../support/unique-id.js';
import { settleCutNote, StepTimeout, WaitBudget, within } from './wait-budget.js';
import { commitScenarioTraffic, crashWindowWatch, createWorkerBus, DEFAULT_TUNING, envLogger, parkedAlready, type ScenarioTuning, type TrafficPlan, type World } from './world.js';

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
  /**
   * The time (`Date.now()`) by which the run must have given its verdict. Every wait of the
   * run (setting up the fixtures, a worker's start, its way to the fault point, the settle)
   * is cut to what is left of it, so a caller that sets it below its test runner's timeout
   * gets the run's own diagnosis (which step hung, where the unsettled messages are) instead
   * of the runner's bare "timed out". Default: no deadline (each wait has its own bound).
   */
  readonly deadline?: number;
}

/** Reads the end state of a world. */
export async function observe<Tx>(world: World, store: StoreFixture<Tx>, transport: Transport): Promise<Observed> {
  return observeNamed(world, store, transport).observed;
}

/**
 * {@link observe}, with the names of its reads not finished yet: a read that hangs is
 * named in settle's error (CI once reported only that "reading the end state" hung, and
 * which of the four reads it was took a reproduction to find).
 */
function observeNamed<Tx>(world: World, store: StoreFixture<Tx>, transport: Transport): { observed: Promise<Observed>; running(): string[] } {
  const running = new Set<string>();
  const named = <T>(name: string, read: () => Promise<T>): Promise<T> => {
    running.add(name);
    return Promise.resolve()
      .then(read)
      .finally(() => running.delete(name));
  };
  const observed = Promise.all([
    named('store.readEffects()', () => store.readEffects()),
    transport.deadLetters ? named(`transport.deadLetters.list('${world.consumer}')`, () => transport.deadLetters!.list(world.consumer, { limit: 10_000 })) : Promise.resolve([]),
    named('store.outbox.listDead()', () => store.outbox.listDead({ limit: 10_000 })),
    named('store.outbox.listHalted()', () => store.outbox.listHalted({ limit: 10_000 })),
  ]).then(([effects, consumerDead, outboxDead, halted]) => ({ effects, consumerDead, outboxDead, halted }));
  return { observed, running: () => [...running] };
}

/** Options of {@link settle}. */
export interface SettleOptions {
  /** Gives up when it aborts (within one poll) and rejects with its reason. */
  readonly signal?: AbortSignal;
  /**
   * Gives up at the latest this long after the start even while messages still settle.
   * Default `timeoutMs` (then the wait is bounded by `timeoutMs` alone, progress or not).
   */
  readonly maxMs?: number;
  /** The transport fixture, whose optional `locate` says where an unsettled message is. */
  readonly transport?: Pick<TransportFixture, 'locate'>;
  /**
   * How long one read of the end state may take before settle stops waiting for it and
   * reads again (a read stuck on a connection that died silently). Default 15 s.
   */
  readonly readTimeoutMs?: number;
}

/**
 * Waits until every committed message is in an end state, then checks the invariants.
 * Gives up once `timeoutMs` passed without one more message reaching an end state (each
 * one that does restarts that clock, so a loaded machine that is slow but moving is
 * waited for), or `options.maxMs` after the start. A run that gives up rejects naming
 * every message still without an end state and, through the fixtures' optional `locate`,
 * where each one is (an outbox row still pending, a queued or leased delivery, a retry due
 * later): one found nowhere is lost; one found somewhere had not settled yet.
 */
export async function settle<Tx>(
  world: World,
  ledger: Ledger,
  store: StoreFixture<Tx>,
  transport: Transport,
  ordered: boolean,
  timeoutMs: number,
  options: SettleOptions = {},
): Promise<{ report: InvariantReport; observed: Observed }> {
  const { signal } = options;
  const startedAt = Date.now();
  const giveUpAt = startedAt + (options.maxMs ?? timeoutMs);
  let lastProgressAt = startedAt;
  let fewest = Number.POSITIVE_INFINITY;
  let unsettled: string[] = [];
  let lastError: unknown;
  // When the last read that succeeded happened: after it, `unsettled` is that read's picture.
  let lastReadAt: number | undefined;
  // Reads given up on that have not finished since: a read that hangs for good leaves one
  // behind at each attempt, and a count that grows says the hang is not passing.
  let abandoned = 0;
  for (;;) {
    if (signal?.aborted) throw signal.reason;
    const reading = observeNamed(world, store, transport);
    try {
      // The database or broker may be away (an outage scenario): observe throws, or hangs on
      // a connection that died without a word, and we look again.
      const observed = await within(reading.observed, { ms: Math.min(options.readTimeoutMs ?? READ_TIMEOUT_MS, Math.max(1_000, giveUpAt - Date.now())), cut: false }, 'reading the end state (effects, dead letters, halted keys)').catch((error: unknown) => {
        if (!(error instanceof StepTimeout)) throw error;
        const earlier = abandoned === 0 ? '' : `; ${abandoned} earlier read(s) of it never finished either`;
        abandoned += 1;
        void reading.observed.then(
          () => (abandoned -= 1),
          () => (abandoned -= 1),
        );
        throw new StepTimeout(`${error.message} (still running: ${reading.running().join(', ')}${earlier})`, { cause: error });
      });
      const report = checkInvariants(ledger, observed, { ordered });
      unsettled = unsettledIds(ledger, observed);
      lastReadAt = Date.now();
      if (unsettled.length === 0) return { report, observed };
      if (unsettled.length < fewest) {
        fewest = unsettled.length;
        lastProgressAt = Date.now();
      }
      lastError = undefined;
    } catch (error) {
      lastError = error;
    }
    const now = Date.now();
    if (now >= giveUpAt || now - lastProgressAt >= timeoutMs) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const waited = `${Math.round((Date.now() - startedAt) / 1000)} s, the last ${Math.round((Date.now() - lastProgressAt) / 1000)} s without a message settling`;
  if (unsettled.length === 0) throw new Error(`scenario could not be observed for ${waited}: ${describeError(lastError)}`, { cause: lastError });
  // A failing read leaves the picture of the last one that succeeded: say so, and why, or
  // messages applied since then read as stuck (they are not: the end state is unreadable).
  const stale =
    lastError === undefined || lastReadAt === undefined
      ? ''
      : `\nthe end state has not been readable for the last ${Math.round((Date.now() - lastReadAt) / 1000)} s (this list is from the last read that succeeded): ${describeError(lastError)}`;
  const where = await whereAre(unsettled, store, options.transport);
  throw new Error(`scenario did not settle in ${waited}: ${unsettled.length} of ${ledger.committed.size} committed messages have no end state${stale}\n${where}`);
}

/** Default of {@link SettleOptions.readTimeoutMs}. */
const READ_TIMEOUT_MS = 15_000;

/** Committed messages in no end state (not applied, not dead-lettered, not on a halted key), in commit order. */
function unsettledIds(ledger: Ledger, observed: Observed): string[] {
  const ended = new Set<string>(observed.effects);
  for (const letter of observed.consumerDead) ended.add(letter.envelope.messageId);
  for (const row of observed.outboxDead) if (row.state === 'dead') ended.add(row.envelope.messageId);
  for (const key of observed.halted) ended.add(key.head.envelope.messageId);
  return [...ledger.committed.keys()].filter((id) => !ended.has(id));
}

/** How long the diagnosis of an unsettled run may take (the database may be the reason it did not settle). */
const LOCATE_TIMEOUT_MS = 15_000;

/**
 * One line per unsettled message: where the fixtures found it, or that they found it
 * nowhere (lost). Without a `locate` on either fixture, says so: the messages are then
 * only known to be unsettled.
 */
async function whereAre<Tx>(ids: readonly string[], store: StoreFixture<Tx>, transport: Pick<TransportFixture, 'locate'> | undefined): Promise<string> {
  if (!store.locate && !transport?.locate) {
    return ids.map((id) => `  message ${id} has no end state (the fixtures have no locate() to say where it is)`).join('\n');
  }
  const ask = async (what: string, locate: ((ids: readonly string[]) => Promise<ReadonlyMap<string, string>>) | undefined) => {
    if (!locate) return new Map<string, string>();
    try {
      return await within(locate(ids), { ms: LOCATE_TIMEOUT_MS, cut: false }, 'locate()');
    } catch (error) {
      return new Map(ids.map((id) => [id, `${what}: locate failed (${describeError(error)})`] as const));
    }
  };
  const [inStore, inTransport] = await Promise.all([ask('store', store.locate?.bind(store)), ask('transport', transport?.locate?.bind(transport))]);
  const lines = ids.map((id) => {
    const places = [inStore.get(id), inTransport.get(id)].filter((place): place is string => place !== undefined);
    if (places.length === 0) return `  message ${id} has no end state: LOST, found nowhere (not applied, not dead-lettered, not halted, in neither store nor transport)`;
    const absent = [store.locate && !inStore.has(id) ? 'store: not found' : undefined, transport?.locate && !inTransport.has(id) ? 'transport: not found' : undefined];
    return `  message ${id} has no end state: ${[...places, ...absent.filter((place) => place !== undefined)].join('; ')}`;
  });
  return `where the ${ids.length} unsettled message(s) are:\n${lines.join('\n')}`;
}

/**
 * What an in-process run keeps back from its deadline for what follows its last wait: the
 * diagnosis of an unsettled run (each fixture's `locate` may take up to 15 s) and the
 * cleanup ({@link CLEANUP_MS}).
 */
const IN_PROCESS_RESERVE_MS = 30_000;

/** The bound of each step before the settle (a fixture's setup, committing the traffic, the first workers' start). */
const SETUP_STEP_MS = 60_000;

/**
 * How long the cleanup after a run may take in all: ending an outage, stopping the workers,
 * closing their connections and the fixtures. A step still running then is named in the
 * run's error (a `close()` that never resolves is a defect a user meets at shutdown).
 */
const CLEANUP_MS = 20_000;

interface Worker<Tx> {
  readonly bus: Bus<Tx, AppendResult>;
  readonly connection: Transport;
}

/** How long a simulated outage lasts once it has begun. */
const OUTAGE_MS = 300;

/**
 * A fixture broke its promise (an outage that would not begin or end): the scenario
 * cannot judge the product, and says so instead of reporting the messages as lost.
 */
class FixtureFault extends Error {
  override readonly name = 'FixtureFault';
}

/**
 * One simulated outage of a fixture. Once `begin` has been called the outage always
 * ends: `OUTAGE_MS` later, or at once when the run finishes first, even when `begin`
 * threw part-way (it may already have cut connections). A failing `begin` or `end` is
 * reported through `onFault` as the fixture's fault.
 */
class OutageWindow {
  readonly #what: string;
  readonly #outage: { begin(): Promise<void>; end(): Promise<void> };
  readonly #onFault: (fault: FixtureFault) => void;
  #timer: NodeJS.Timeout | undefined;
  #beginning: Promise<void> | undefined;
  #ending: Promise<void> | undefined;

  constructor(what: string, outage: { begin(): Promise<void>; end(): Promise<void> }, onFault: (fault: FixtureFault) => void) {
    this.#what = what;
    this.#outage = outage;
    this.#onFault = onFault;
  }

  /** Begins the outage and resolves once `begin` returned or threw (never rejects). */
  begin(): Promise<void> {
    this.#beginning ??= this.#begin();
    return this.#beginning;
  }

  async #begin(): Promise<void> {
    try {
      await this.#outage.begin();
    } catch (error) {
      this.#onFault(new FixtureFault(`the ${this.#what} fixture's outage.begin() failed: ${describeError(error)}`, { cause: error }));
    } finally {
      if (!this.#ending) this.#timer = setTimeout(() => void this.end(), OUTAGE_MS);
    }
  }

  /**
   * Ends the outage if it began, once, after `begin` has settled (ending it half-way
   * through its beginning would leave it begun); resolves when `end` returned. Never rejects.
   */
  end(): Promise<void> {
    clearTimeout(this.#timer);
    const beginning = this.#beginning;
    if (!beginning) return Promise.resolve();
    this.#ending ??= beginning
      .then(() => this.#outage.end())
      .catch((error: unknown) => {
        this.#onFault(new FixtureFault(`the ${this.#what} fixture's outage.end() failed: ${describeError(error)}`, { cause: error }));
      });
    return this.#ending;
  }
}

/**
 * Runs one scenario in-process: commits traffic, runs workers with the fault armed,
 * replaces crashed workers, waits until every message reached an end state and
 * checks the invariants. Throws if a fixture lacks what the scenario needs (callers
 * gate on that first), and throws a `FixtureFault` at once when a fixture's outage
 * fails to begin or end. An outage that began always ends before the run returns.
 * Every wait is bounded (and cut to `options.deadline` when given): a step that hangs —
 * a fixture's setup, a worker's start, a read of the end state, a `close()` in the
 * cleanup — fails the run with its name instead of holding it until the test runner's
 * timeout.
 */
export async function runInProcessScenario<Tx>(
  factories: BusFactories<Tx>,
  spec: ScenarioSpec,
  mode: InProcessCrashMode,
  options: ScenarioRunOptions,
): Promise<ScenarioResult> {
  const testId = uniqueId();
  const context: FixtureContext = { testId };
  const budget = new WaitBudget(options.deadline, IN_PROCESS_RESERVE_MS);
  const store = await within(factories.store(context), budget.wait(SETUP_STEP_MS), 'the store fixture\'s setup');
  let transport: TransportFixture | undefined;
  const workers = new Set<Worker<Tx>>();
  const outages: OutageWindow[] = [];
  // Aborted with the first FixtureFault: the run stops waiting and reports it.
  const fixtureFaults = new AbortController();
  const openOutage = (what: string, outage: { begin(): Promise<void>; end(): Promise<void> }): Promise<void> => {
    const window = new OutageWindow(what, outage, (fault) => {
      if (!fixtureFaults.signal.aborted) fixtureFaults.abort(fault);
    });
    outages.push(window);
    return window.begin();
  };
  const run = async (): Promise<ScenarioResult> => {
    transport = await within(factories.transport(context), budget.wait(SETUP_STEP_MS), 'the transport fixture\'s setup');
    const fixture = transport;
    const tuning: ScenarioTuning = { ...DEFAULT_TUNING, ...options.tuning };
    const { world, ledger, plan, target: chosen } = await within(
      commitScenarioTraffic(testId, spec.action, store, fixture.transport, options.seed, options.plan),
      budget.wait(SETUP_STEP_MS),
      'committing the scenario\'s traffic',
    );
    let target = chosen;

    let armed = true;
    let crashLoops = 0;
    let lateKills = 0;
    let appliedKills = 0;
    // Shared by every worker: a frozen worker's window timer may still speak after its crash.
    const windows = crashWindowWatch(envLogger());
    let started = 0;
    let pauses = 0;
    /** Completions that touched rows their worker never had confirmed (see createWorkerBus). */
    const violations: string[] = [];
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
            if (await parkedAlready(store.inbox, world.consumer, target!)) return;
            crashLoops += 1;
            return crash();
          case 'late-kills': {
            if (!at.messageIds.includes(target!)) return;
            if (lateKills > tuning.maxCrashes) return;
            lateKills += 1;
            // The first delivery is no suspect and has no window: it is killed at once.
            // Later ones run alone; each is killed once the consumer says the run outlived
            // its window (or, from a consumer that never says so, a while after it).
            if (lateKills > 1) await windows.passed(target!, windows.seen(target!), tuning.crashWindowMs + 10_000);
            return crash();
          }
          case 'applied-kills':
            if (!at.messageIds.includes(target!)) return;
            if (appliedKills >= tuning.maxCrashes) return;
            appliedKills += 1;
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
            return openOutage('transport', fixture.outage);
          case 'database-outage':
            if (!armed || !store.outage) return;
            armed = false;
            return openOutage('store', store.outage);
        }
      };
      const onViolation = (problem: string) => void violations.push(problem);
      const self: Worker<Tx> = { bus: createWorkerBus(world, store, connection, tuning, { faults, logger: windows.logger, onViolation }), connection };
      const { bus } = self;
      workers.add(self);
      started += 1;
      await bus.start();
    };

    await within(startWorker(), budget.wait(SETUP_STEP_MS), 'the first worker\'s start (connect, bus.start())');
    if (spec.action === 'stall') await within(startWorker(), budget.wait(SETUP_STEP_MS), 'the second worker\'s start (connect, bus.start())');
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
      const results = await fixture.transport.publish([envelope]);
      if (!results.every((result) => result.ok)) throw new Error('could not publish the duplicated message');
      // The contract lets a broker drop a re-published messageId (JetStream, Service Bus
      // duplicate detection): such a fixture injects the copy where the consumer sees it.
      if (fixture.injectDuplicate) await fixture.injectDuplicate(envelope);
      else {
        const again = await fixture.transport.publish([envelope]);
        if (!again.every((result) => result.ok)) throw new Error('could not publish the second copy of the duplicated message');
      }
    }

    if (spec.action === 'duplicate' && target !== undefined) {
      // Both copies must reach a handler before the run is judged. A broker that hands out
      // one message of a session (or key) at a time delivers the second copy only after the
      // first settled, and a settle that saw the first copy's effect would end the run first.
      const deadline = Date.now() + budget.wait(options.timeoutMs ?? 45_000).ms;
      while ((duplicateArrivals.get(target) ?? 0) < 2 && Date.now() < deadline && !fixtureFaults.signal.aborted) await new Promise((resolve) => setTimeout(resolve, 20));
    }

    // A fixture that broke its outage fails the run at once, under its own name: waiting
    // for the messages would only report them lost.
    const most = budget.wait(options.timeoutMs ?? 45_000);
    const { report, observed } = await settle(world, ledger, store, fixture.transport, tuning.ordered, most.ms, { signal: fixtureFaults.signal, transport: fixture }).catch((error: unknown) => {
      if (!most.cut || error instanceof FixtureFault) throw error;
      throw new Error(`${describeError(error)}${settleCutNote('the run was', most)}`, { cause: error });
    });
    for (const worker of workers) pauses += worker.bus.health().counters.relayPauses;
    const faultFired =
      spec.action === 'crash-loop' ? crashLoops > 0 : spec.action === 'late-kills' ? lateKills > tuning.maxCrashes : spec.action === 'applied-kills' ? appliedKills > 0 : spec.action === 'duplicate' ? (duplicateArrivals.get(target!) ?? 0) >= 2 : !armed;
    const problems = [...report.problems, ...violations];
    return { ...report, problems, seed: options.seed, testId, observed, target, workersStarted: started, relayPauses: pauses, faultFired };
  };
  const outcome = await run().then(
    (result) => ({ ok: true as const, result }),
    (error: unknown) => ({ ok: false as const, error }),
  );
  // Steps still running when the cleanup gave up on them.
  const stuck: string[] = [];
  {
    const cleanupEndsAt = Date.now() + CLEANUP_MS;
    const step = async (what: string, promise: Promise<unknown>): Promise<void> => {
      try {
        await within(promise, { ms: Math.max(1_000, cleanupEndsAt - Date.now()), cut: false }, what);
      } catch (error) {
        // Only a hang is the cleanup's finding; a close that failed has still finished.
        if (error instanceof StepTimeout) stuck.push(error.message);
      }
    };
    // Before anything stops: the next scenario, and the fixture's close, need the broker and database back.
    await step('ending the outage', Promise.all(outages.map((window) => window.end())));
    await step('stopping the workers (bus.stop with a 2 s timeout)', Promise.all([...workers].map((worker) => worker.bus.stop({ timeoutMs: 2_000 }).catch(() => undefined))));
    await step('closing the workers\' transports', Promise.all([...workers].map((worker) => worker.connection.close().catch(() => undefined))));
    if (transport) await step('closing the transport fixture', transport.close().catch(() => undefined));
    await step('closing the store fixture', store.close().catch(() => undefined));
  }
  // A run that failed already reports its own reason; one that passed must not hide a hang.
  if (!outcome.ok) {
    if (stuck.length > 0) console.warn(`[conformance] ${testId}: the cleanup after the failed run hung: ${stuck.join('; ')}`);
    throw outcome.error;
  }
  if (stuck.length > 0) throw new Error(`the scenario ran to its verdict, but its cleanup hung: ${stuck.join('; ')}`);
  return outcome.result;
}
