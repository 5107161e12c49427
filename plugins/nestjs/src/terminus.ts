import type { Bus, BusHealth } from '@courier/core';
import { Inject, Injectable } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { getBusToken } from './tokens.js';

/** What the indicator reports besides up / down: the bus's health, minus its counters. */
export interface CourierHealthDetails {
  /** `BusHealth.status` (`running`, `degraded`, `stopped`, …); `status` itself is terminus's. */
  readonly state: BusHealth['status'];
  readonly relay: BusHealth['relay'];
  readonly consumers: BusHealth['consumers'];
}

/**
 * `bus.health()` as a `@nestjs/terminus` health indicator (terminus 11's
 * `HealthIndicatorService` API): up when the bus is `ready` (every part this process runs
 * works), down otherwise, with the part at fault and its last error in the details.
 *
 * Wire it to a **readiness** check, not a liveness one: a bus waiting for its broker or
 * database is healthy and recovers by itself. Synchronous and free of I/O, so a probe may
 * call it as often as it likes. Add it to the providers of the module with your
 * `HealthController` (which imports `TerminusModule`).
 */
export class CourierHealthIndicator {
  readonly #health: HealthIndicatorService;
  readonly #moduleRef: ModuleRef;

  constructor(health: HealthIndicatorService, moduleRef: ModuleRef) {
    this.#health = health;
    this.#moduleRef = moduleRef;
  }

  /** Checks the bus named `bus` (default `'default'`) under `key` in the health report. */
  isHealthy<const Key extends string = 'courier'>(key: Key = 'courier' as Key, bus?: string): HealthIndicatorResult<Key> {
    const indicator = this.#health.check(key);
    const health = this.#moduleRef.get<Bus<unknown>>(getBusToken(bus), { strict: false }).health();
    const details = { state: health.status, relay: health.relay, consumers: health.consumers } satisfies CourierHealthDetails;
    return health.ready ? indicator.up(details) : indicator.down(details);
  }
}
Injectable()(CourierHealthIndicator);
Inject(HealthIndicatorService)(CourierHealthIndicator, undefined, 0);
Inject(ModuleRef)(CourierHealthIndicator, undefined, 1);
