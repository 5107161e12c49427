import type { FaultPoint } from '@courier/core';

/**
 * How a scenario's fault acts at its point:
 * - `crash`: the worker dies there (in-process: frozen and cut off, or the error thrown;
 *   process-level: SIGKILL); a fresh worker takes over.
 * - `stall`: the worker stops longer than its lease, then carries on (a stale relay).
 * - `duplicate`: two copies of one message reach the consumer at the same moment.
 * - `broker-outage` / `database-outage`: the broker or database goes away briefly.
 * - `crash-loop`: one message kills every worker that starts it.
 * - `poison`: a message whose handler always fails; the crash hits as it is parked.
 * - `late-kills`: one message's worker is killed from outside while the message is in hand,
 *   again and again, but each time (after the first) only once the message has run alone
 *   for longer than its crash window: not the message's fault, so it must be handled.
 * - `applied-kills`: one message's worker is killed each time just after the message's
 *   unit of work committed, its runs alone as a suspect included, `maxCrashes` times: the
 *   message is applied, so it must end applied once and never dead-lettered.
 */
export type ScenarioAction = 'crash' | 'stall' | 'duplicate' | 'broker-outage' | 'database-outage' | 'crash-loop' | 'poison' | 'late-kills' | 'applied-kills';

/** One scenario of the bus suite. */
export interface ScenarioSpec {
  readonly point: FaultPoint;
  readonly action: ScenarioAction;
  readonly description: string;
}

/**
 * A scenario for every fault point. The mapped type makes a missing name a compile
 * error, and the suite also checks it at run time.
 */
export const SCENARIOS: { readonly [P in FaultPoint]: ScenarioSpec & { readonly point: P } } = {
  'after-publish-before-complete': {
    point: 'after-publish-before-complete',
    action: 'crash',
    description: 'relay dies after the broker confirmed and before the rows were marked published',
  },
  'complete-before-commit': {
    point: 'complete-before-commit',
    action: 'crash',
    description: 'relay dies inside complete, before its transaction commits',
  },
  'confirm-lost': {
    point: 'confirm-lost',
    action: 'crash',
    description: 'the broker has the batch but the relay never learns it',
  },
  'mid-batch': {
    point: 'mid-batch',
    action: 'crash',
    description: 'relay dies with part of a batch recorded',
  },
  'stale-relay': {
    point: 'stale-relay',
    action: 'stall',
    description: 'a relay stalls past its lease while another takes its batch over',
  },
  'before-handler-commit': {
    point: 'before-handler-commit',
    action: 'crash',
    description: 'consumer dies after the handler ran, before its transaction committed',
  },
  'after-handler-commit-before-ack': {
    point: 'after-handler-commit-before-ack',
    action: 'crash',
    description: 'consumer dies after committing effects, before acknowledging',
  },
  'concurrent-duplicate-delivery': {
    point: 'concurrent-duplicate-delivery',
    action: 'duplicate',
    description: 'two copies of one message are handled at the same moment',
  },
  'poison-head': {
    point: 'poison-head',
    action: 'poison',
    description: 'a message that always fails is parked, and the worker dies as it parks it',
  },
  'crash-loop': {
    point: 'crash-loop',
    action: 'crash-loop',
    description: 'a message kills every worker that starts it',
  },
  'broker-restart': {
    point: 'broker-restart',
    action: 'broker-outage',
    description: 'the broker goes away and comes back while the relay publishes',
  },
  'database-restart': {
    point: 'database-restart',
    action: 'database-outage',
    description: 'the database goes away and comes back while the relay claims',
  },
};

/**
 * The counterpart of the `crash-loop` scenario: kills that are not the message's fault.
 * Its worker is killed at the `crash-loop` point (the message in hand, about to run) once
 * at once, then `maxCrashes` more times, each only after the consumer said the message's
 * run alone outlived `crashWindowMs`; then a worker is left to handle it. It must be
 * applied once and nothing dead-lettered.
 */
export const LATE_KILLS: ScenarioSpec = {
  point: 'crash-loop',
  action: 'late-kills',
  description: 'a message whose process is killed from outside, each time after its crash window, is handled, not parked',
};

/**
 * Kills that follow the commit: the target's worker dies after its handler's unit of work
 * committed and before the ack, once on its first delivery and again on its redeliveries
 * (which run alone as suspects and are counted), `maxCrashes` times in all; then a worker is
 * left to take it. The runs alone did die young, but the message was applied: a consumer
 * that parks it as a crash loop leaves it applied and dead-lettered at once (and a replay of
 * that dead letter would apply it twice). It must end applied once, nothing dead-lettered.
 * A broker that flags even a first delivery as redelivered (Kafka, when a member of its
 * group committed an in-hand mark past the record before it was handed over, or with offsets
 * of an earlier release: records below the log end when the member joined) reaches the park
 * with fewer kills.
 */
export const APPLIED_KILLS: ScenarioSpec = {
  point: 'after-handler-commit-before-ack',
  action: 'applied-kills',
  description: 'a message whose process is killed after each commit of its handler, its counted runs alone included, is applied once, not parked',
};

/** Error the in-process `throw` mode raises at a fault point. */
export class InjectedFault extends Error {
  override readonly name = 'InjectedFault';
  readonly retriable = true;

  constructor(point: FaultPoint) {
    super(`fault injected at '${point}'`);
  }
}
