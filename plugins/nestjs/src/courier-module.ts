import { createBus, type Bus } from '@courier/core';
import { Module, type DynamicModule, type Provider } from '@nestjs/common';
import { DiscoveryModule, DiscoveryService, MetadataScanner } from '@nestjs/core';
import type { CourierModuleAsyncOptions, CourierModuleOptions, CourierModuleRootOptions, CourierOptionsFactory } from './courier-module-options.js';
import { CourierLifecycle, optionsProblems, withModuleContext } from './courier-lifecycle.js';
import { nestLogger } from './nest-logger.js';
import { DEFAULT_BUS_NAME, getBusToken, getCourierOptionsToken } from './tokens.js';

/**
 * Courier as a Nest module: registers a bus built from the options (`createBus`), makes it
 * injectable (`@InjectBus()`), subscribes the `@OnMessage` methods of every provider when
 * the application bootstraps, starts what the options ask for (`start`), and stops the bus
 * when the application shuts down.
 *
 * Guarantees: a bad configuration fails the application's bootstrap with a `ConfigError`
 * naming what to fix, before anything starts (options, handler declarations, and every
 * problem `createBus` / `bus.subscribe` find); the bus starts in `onApplicationBootstrap`,
 * after every module's `onModuleInit`, and drains in the first shutdown phase
 * (`onModuleDestroy`, given `stop.timeoutMs`) — before `beforeApplicationShutdown` and
 * `onApplicationShutdown`, where MikroORM's and TypeORM's Nest modules close their
 * connections — so handlers in flight can still commit. Call `app.enableShutdownHooks()`
 * so SIGTERM takes that path. The module is global: import it once, in the root module.
 * Several buses: one `forRoot` / `forRootAsync` per `name`.
 */
export class CourierModule {
  /** Registers the bus built from `options` (see {@link CourierModuleOptions}). */
  static forRoot<Tx>(options: CourierModuleRootOptions<Tx>): DynamicModule {
    const { name = DEFAULT_BUS_NAME, ...rest } = options ?? ({} as CourierModuleRootOptions<Tx>);
    return CourierModule.#module(name, [{ provide: getCourierOptionsToken(name), useValue: rest }], []);
  }

  /**
   * Registers the bus built from the options `useFactory` returns, given the providers in
   * `inject` from the modules in `imports` (a `ConfigService`, an ORM module's `MikroORM`), or
   * that a `CourierOptionsFactory` (`useClass`, `useExisting`) creates.
   */
  static forRootAsync<Tx>(options: CourierModuleAsyncOptions<Tx>): DynamicModule {
    const name = options?.name ?? DEFAULT_BUS_NAME;
    const token = getCourierOptionsToken(name);
    const sources = (['useFactory', 'useClass', 'useExisting'] as const).filter((key) => options?.[key] !== undefined);
    if (sources.length !== 1) {
      throw withModuleContext(name, [
        sources.length === 0
          ? `forRootAsync needs 'useFactory' (a function returning the options: { outbox, inbox, transport, … }), 'useClass' or 'useExisting' (a CourierOptionsFactory)`
          : `forRootAsync takes one of 'useFactory', 'useClass' and 'useExisting', got ${sources.map((key) => `'${key}'`).join(' and ')}`,
      ]);
    }
    const fromFactory = (factory: CourierOptionsFactory<Tx>) => factory.createCourierOptions();
    const providers: Provider[] = options.useFactory
      ? [{ provide: token, useFactory: options.useFactory as (...args: unknown[]) => unknown, inject: options.inject ?? [] }]
      : options.useClass
        ? [{ provide: options.useClass, useClass: options.useClass }, { provide: token, useFactory: fromFactory, inject: [options.useClass] }]
        : [{ provide: token, useFactory: fromFactory, inject: [options.useExisting!] }];
    return CourierModule.#module(name, providers, options.imports ?? []);
  }

  static #module(name: string, optionsProviders: readonly Provider[], imports: NonNullable<DynamicModule['imports']>): DynamicModule {
    const busProvider: Provider = {
      provide: getBusToken(name),
      useFactory: (options: CourierModuleOptions) => buildBus(name, options),
      inject: [getCourierOptionsToken(name)],
    };
    const lifecycleProvider: Provider = {
      provide: `CourierLifecycle:${name}`,
      useFactory: (options: CourierModuleOptions, bus: Bus<unknown>, discovery: DiscoveryService, scanner: MetadataScanner) =>
        new CourierLifecycle(name, options, bus, discovery, scanner),
      inject: [getCourierOptionsToken(name), getBusToken(name), DiscoveryService, MetadataScanner],
    };
    return {
      module: CourierModule,
      global: true,
      imports: [DiscoveryModule, ...imports],
      providers: [...optionsProviders, busProvider, lifecycleProvider],
      exports: [getBusToken(name), getCourierOptionsToken(name)],
    };
  }
}
Module({})(CourierModule);

/** `createBus` with the module's checks first, and every problem named with the bus it belongs to. */
function buildBus(name: string, options: CourierModuleOptions): Bus<unknown> {
  const problems = optionsProblems(options);
  if (problems.length > 0) throw withModuleContext(name, problems);
  const { start: _start, stop: _stop, defaultConsumer: _defaultConsumer, close: _close, ...config } = options;
  try {
    return createBus({ ...config, logger: config.logger ?? nestLogger(name) });
  } catch (error) {
    throw withModuleContext(name, (error as { problems?: readonly string[] }).problems ?? [String(error)], error);
  }
}
