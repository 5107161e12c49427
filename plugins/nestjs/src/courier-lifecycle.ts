import { ConfigError, describeError, type Bus, type Handler, type MessageDefinition, type SubscribeOptions } from '@courier/core';
import type { OnApplicationBootstrap, OnApplicationShutdown, OnModuleDestroy, OnModuleInit } from '@nestjs/common';
import type { DiscoveryService, MetadataScanner } from '@nestjs/core';
import type { CourierModuleOptions, CourierStartOptions } from './courier-module-options.js';
import { onMessageMetadata, type OnMessageOptions } from './on-message.js';
import { DEFAULT_BUS_NAME, getBusToken } from './tokens.js';

/** The subscription options that apply to a whole consumer (`bus.subscribe` merges them per consumer). */
const CONSUMER_OPTIONS = ['ordered', 'concurrency', 'poison', 'retry', 'maxCrashes', 'crashWindowMs'] as const satisfies readonly (keyof SubscribeOptions)[];

/** One discovered `@OnMessage`: where it is, what it handles, for which consumer. */
interface DiscoveredHandler {
  /** `ClassName.method`, for messages. */
  readonly where: string;
  readonly consumer: string;
  readonly definition: MessageDefinition<unknown, unknown>;
  readonly options: OnMessageOptions;
  readonly handler: Handler<MessageDefinition<unknown, unknown>, unknown>;
}

/**
 * Runs one bus with the application: discovers and subscribes the `@OnMessage` methods
 * (`onModuleInit`), starts (`onApplicationBootstrap`), drains (`onModuleDestroy`) and
 * closes (`onApplicationShutdown`). Created by `CourierModule`, one per bus.
 */
export class CourierLifecycle implements OnModuleInit, OnApplicationBootstrap, OnModuleDestroy, OnApplicationShutdown {
  readonly #name: string;
  readonly #options: CourierModuleOptions;
  readonly #bus: Bus<unknown>;
  readonly #discovery: DiscoveryService;
  readonly #scanner: MetadataScanner;
  #consumers: readonly string[] = [];

  constructor(name: string, options: CourierModuleOptions, bus: Bus<unknown>, discovery: DiscoveryService, scanner: MetadataScanner) {
    this.#name = name;
    this.#options = options;
    this.#bus = bus;
    this.#discovery = discovery;
    this.#scanner = scanner;
  }

  /** The consumer names this process subscribed, in discovery order. */
  get consumers(): readonly string[] {
    return this.#consumers;
  }

  onModuleInit(): void {
    const { handlers, problems } = this.#discover();
    const start = this.#options.start === false ? { relay: false, consumers: false } : (this.#options.start ?? {});
    const selected = selectedConsumers(start, handlers, problems);
    const merged = mergedConsumerOptions(handlers, problems);
    if (problems.length > 0) throw withModuleContext(this.#name, problems);
    for (const found of handlers) {
      if (selected !== undefined && !selected.has(found.consumer)) continue;
      try {
        this.#bus.subscribe(found.consumer, found.definition, found.handler, merged.get(found.consumer));
      } catch (error) {
        const list = error instanceof ConfigError ? error.problems : [describeError(error)];
        problems.push(...list.map((problem) => `${found.where}: ${problem}`));
      }
    }
    if (problems.length > 0) throw withModuleContext(this.#name, problems);
    this.#consumers = [...new Set(handlers.filter((found) => selected === undefined || selected.has(found.consumer)).map((found) => found.consumer))];
  }

  async onApplicationBootstrap(): Promise<void> {
    const start = this.#options.start;
    if (start === false) return;
    const consumers = start?.consumers ?? true;
    await this.#bus.start({
      relay: start?.relay ?? true,
      consumers: Array.isArray(consumers) ? consumers.length > 0 : consumers !== false,
      failFast: start?.failFast ?? false,
    });
  }

  async onModuleDestroy(): Promise<void> {
    await this.#bus.stop(this.#options.stop);
  }

  async onApplicationShutdown(): Promise<void> {
    // After every module's destroy hooks: nothing of this bus runs any more.
    await this.#bus.stop(this.#options.stop);
    await this.#options.close?.();
  }

  #discover(): { handlers: DiscoveredHandler[]; problems: string[] } {
    const handlers: DiscoveredHandler[] = [];
    const problems: string[] = [];
    const seen = new Set<object>();
    const buses = new Set<string>();
    const wrappers = this.#discovery.getProviders();
    for (const wrapper of wrappers) {
      if (typeof wrapper.token === 'string' && wrapper.token.startsWith('CourierBus:')) buses.add(wrapper.token);
    }
    for (const wrapper of wrappers) {
      const instance: unknown = wrapper.instance;
      const prototype = instance !== null && typeof instance === 'object' ? Object.getPrototypeOf(instance) : wrapper.metatype?.prototype;
      if (prototype === null || prototype === undefined || prototype === Object.prototype) continue;
      if (instance !== null && typeof instance === 'object' && seen.has(instance)) continue;
      if (instance !== null && typeof instance === 'object') seen.add(instance);
      for (const method of this.#scanner.getAllMethodNames(prototype)) {
        const marks = onMessageMetadata((prototype as Record<string, unknown>)[method]);
        if (marks.length === 0) continue;
        const className = (prototype as { constructor?: { name?: string } }).constructor?.name ?? String(wrapper.name);
        const where = `${className}.${method}`;
        for (const { definition, options } of marks) {
          const bus = options.bus ?? DEFAULT_BUS_NAME;
          if (!buses.has(getBusToken(bus))) {
            problems.push(`${where}: @OnMessage names bus '${bus}', which no CourierModule.forRoot({ name: '${bus}' }) registers`);
            continue;
          }
          if (bus !== this.#name) continue;
          if (!wrapper.isDependencyTreeStatic() || wrapper.isTransient) {
            problems.push(
              `${where}: handlers must be singleton providers, but ${className} is ${wrapper.isTransient ? 'transient' : 'request-scoped (or depends on a request-scoped provider)'}; a handler runs outside any request: make it (and what it injects) the default scope`,
            );
            continue;
          }
          const consumer = options.consumer ?? this.#options.defaultConsumer;
          if (consumer === undefined) {
            problems.push(
              `${where}: @OnMessage(${definition?.type ?? 'undefined'}) has no consumer name: pass { consumer: 'your-service' } to @OnMessage, or set 'defaultConsumer' in CourierModule.forRoot`,
            );
            continue;
          }
          if (!definition || typeof definition.type !== 'string') {
            problems.push(`${where}: @OnMessage needs a message definition from defineMessage(...), got ${String(definition)}`);
            continue;
          }
          const target = instance as Record<string, (...args: unknown[]) => unknown>;
          handlers.push({
            where,
            consumer,
            definition,
            options,
            // Called on the provider instance, so the method sees its injected dependencies.
            handler: async (message, context) => {
              await target[method]!.call(target, message, context);
            },
          });
        }
      }
    }
    const byKey = new Map<string, DiscoveredHandler>();
    for (const found of handlers) {
      const key = `${found.consumer}\u0000${found.definition.type}`;
      const first = byKey.get(key);
      if (first === undefined) byKey.set(key, found);
      else {
        problems.push(
          `consumer '${found.consumer}' handles '${found.definition.type}' twice (${first.where} and ${found.where}): one consumer runs one handler per message type; give one of them another consumer name (each consumer gets its own copy of every message)`,
        );
      }
    }
    return { handlers: handlers.filter((found) => byKey.get(`${found.consumer}\u0000${found.definition.type}`) === found), problems };
  }
}

/** The consumers `start.consumers` selects (undefined: all), pushing a problem for names no handler has. */
function selectedConsumers(start: CourierStartOptions, handlers: readonly DiscoveredHandler[], problems: string[]): Set<string> | undefined {
  const wanted = start.consumers;
  if (!Array.isArray(wanted)) return undefined;
  const known = new Set(handlers.map((found) => found.consumer));
  for (const name of wanted) {
    if (!known.has(name)) {
      const list = [...known].map((consumer) => `'${consumer}'`).join(', ') || 'none';
      problems.push(`start.consumers names '${String(name)}', but no @OnMessage handler has that consumer (handlers exist for ${list})`);
    }
  }
  return new Set(wanted);
}

/**
 * The options of each consumer, merged from its handlers. A consumer's options apply to all
 * its handlers, so two handlers that set one differently are a problem (the bus would keep
 * whichever it saw last).
 */
function mergedConsumerOptions(handlers: readonly DiscoveredHandler[], problems: string[]): Map<string, SubscribeOptions> {
  const merged = new Map<string, Record<string, unknown>>();
  const setBy = new Map<string, string>();
  for (const found of handlers) {
    const options = merged.get(found.consumer) ?? {};
    for (const key of CONSUMER_OPTIONS) {
      const value = found.options[key];
      if (value === undefined) continue;
      const at = `${found.consumer}\u0000${key}`;
      if (options[key] === undefined) {
        options[key] = value;
        setBy.set(at, found.where);
      } else if (JSON.stringify(options[key]) !== JSON.stringify(value)) {
        problems.push(
          `consumer '${found.consumer}': '${key}' is ${JSON.stringify(options[key])} on ${setBy.get(at)} but ${JSON.stringify(value)} on ${found.where}; it applies to the whole consumer: set it once, or give them the same value`,
        );
      }
    }
    merged.set(found.consumer, options);
  }
  return merged as Map<string, SubscribeOptions>;
}

/**
 * Problems with the module's own options (`createBus` checks the rest): named with the
 * option and what to pass, since a Nest user writes them in `forRoot` / `useFactory`.
 */
export function optionsProblems(options: CourierModuleOptions | undefined): string[] {
  if (!options || typeof options !== 'object') return [`the options are ${String(options)}: pass { outbox, inbox, transport } to forRoot, or return them from forRootAsync's useFactory`];
  const problems: string[] = [];
  if (!options.transport) problems.push(`'transport' is missing: pass a Transport (say new RabbitMqTransport({ connection })) as 'transport'`);
  if (!options.outbox) problems.push(`'outbox' is missing: pass an OutboxStore (say new MikroOrmOutboxStore({ orm })) as 'outbox'`);
  const start = options.start;
  if (start !== undefined && start !== false && (typeof start !== 'object' || start === null)) problems.push(`'start' must be false or { relay, consumers, failFast }`);
  else if (start) {
    if (start.relay !== undefined && typeof start.relay !== 'boolean') problems.push(`'start.relay' must be a boolean`);
    const consumers = start.consumers;
    if (consumers !== undefined && typeof consumers !== 'boolean' && !(Array.isArray(consumers) && consumers.every((name) => typeof name === 'string'))) {
      problems.push(`'start.consumers' must be a boolean or a list of consumer names`);
    }
  }
  if (options.defaultConsumer !== undefined && typeof options.defaultConsumer !== 'string') problems.push(`'defaultConsumer' must be a consumer name (a string)`);
  if (options.close !== undefined && typeof options.close !== 'function') problems.push(`'close' must be a function returning a promise`);
  const timeout = options.stop?.timeoutMs;
  if (timeout !== undefined && (!Number.isSafeInteger(timeout) || timeout < 0)) problems.push(`'stop.timeoutMs' must be a whole number of milliseconds, 0 or more`);
  return problems;
}

/** A `ConfigError` whose problems say which module (and bus) they belong to. */
export function withModuleContext(name: string, problems: readonly string[], cause?: unknown): ConfigError {
  const where = name === DEFAULT_BUS_NAME ? 'CourierModule' : `CourierModule '${name}'`;
  return new ConfigError(
    problems.map((problem) => `${where}: ${problem}`),
    cause === undefined ? {} : { cause },
  );
}
