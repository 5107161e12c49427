import type { BusConfig, StopOptions } from '@courier/core';
import type { FactoryProvider, InjectionToken, ModuleMetadata, Type } from '@nestjs/common';

/**
 * Which parts of the bus this process runs, so one image serves as API, relay or worker:
 * an API that only publishes runs neither (`{ relay: false, consumers: false }`: its rows
 * wait for a relay elsewhere), a relay process `{ consumers: false }`, a worker
 * `{ relay: false }` or only some consumers (`{ consumers: ['payments'] }`).
 */
export interface CourierStartOptions {
  /** Run the relay (outbox → broker). Default true. */
  readonly relay?: boolean;
  /**
   * Run the `@OnMessage` handlers: all (true, the default), none (false), or only those
   * whose consumer is listed (bootstrap fails on a name no handler has).
   */
  readonly consumers?: boolean | readonly string[];
  /**
   * Fail bootstrap when the broker or the database cannot be reached yet (see `bus.start`'s
   * `failFast`). Default false: the application boots, `health()` says what is not ready,
   * and the bus keeps trying.
   */
  readonly failFast?: boolean;
}

/**
 * What `CourierModule.forRoot()` takes (and `forRootAsync`'s factory returns): the bus's
 * own configuration (`createBus`'s: any Courier outbox and inbox stores and transport,
 * relay and retry settings, logger) plus how the module runs it.
 */
export interface CourierModuleOptions<Tx = unknown> extends BusConfig<Tx> {
  /**
   * What runs once the application has bootstrapped. Default: the relay and every
   * consumer. `false`: nothing starts (a one-off script, a migration); the bus still
   * publishes into the outbox.
   */
  readonly start?: CourierStartOptions | false;
  /**
   * How shutdown drains: `timeoutMs` (default 10 s) is how long handlers in flight and
   * unconfirmed publishes get before they are abandoned to be redelivered / re-claimed.
   * Give it more than your slowest handler, and give the orchestrator's grace period more
   * than this.
   */
  readonly stop?: StopOptions;
  /**
   * The consumer name of `@OnMessage` handlers that give none, usually the service's name.
   */
  readonly defaultConsumer?: string;
  /**
   * Closes what the options' factory opened (the transport, the stores' connections, an
   * ORM of its own), after the bus has stopped, in the application's last shutdown phase
   * (`onApplicationShutdown`). Courier never closes the stores or transport it was given.
   */
  readonly close?: () => Promise<void>;
}

/** `CourierModule.forRoot()`'s argument: the options, and the bus's name when there are several. */
export interface CourierModuleRootOptions<Tx = unknown> extends CourierModuleOptions<Tx> {
  /** The bus's name (`@InjectBus(name)`, `@OnMessage(…, { bus: name })`). Default `'default'`. */
  readonly name?: string;
}

/**
 * A provider that builds the options (`forRootAsync({ useClass })` or `{ useExisting }`),
 * the way `TypeOrmOptionsFactory` / `MikroOrmOptionsFactory` do for their modules.
 */
export interface CourierOptionsFactory<Tx = unknown> {
  createCourierOptions(): CourierModuleOptions<Tx> | Promise<CourierModuleOptions<Tx>>;
}

/**
 * `CourierModule.forRootAsync()`'s argument: where the options come from — exactly one of
 * `useFactory` (with `inject`), `useClass` (a {@link CourierOptionsFactory} the module
 * instantiates) or `useExisting` (one already provided) — with the modules it needs, as for
 * any Nest dynamic module.
 */
export interface CourierModuleAsyncOptions<Tx = unknown> extends Pick<ModuleMetadata, 'imports'> {
  /** The bus's name. Default `'default'`. */
  readonly name?: string;
  /** Builds the options; may be async (open a connection, read `ConfigService`). */
  readonly useFactory?: (...args: never[]) => CourierModuleOptions<Tx> | Promise<CourierModuleOptions<Tx>>;
  /** Providers handed to `useFactory`, in order. */
  readonly inject?: FactoryProvider['inject'];
  /** A class implementing {@link CourierOptionsFactory}, instantiated by the module with its own dependencies. */
  readonly useClass?: Type<CourierOptionsFactory<Tx>>;
  /** A provider implementing {@link CourierOptionsFactory}, already registered (in `imports`, or global). */
  readonly useExisting?: InjectionToken<CourierOptionsFactory<Tx>>;
}
