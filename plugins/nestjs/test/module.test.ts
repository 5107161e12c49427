// CourierModule on the in-memory store and broker: registration (forRoot, forRootAsync with
// injected providers, named buses), handlers as providers, the terminus indicator, the CLI
// setup, and every configuration mistake failing the bootstrap with a message naming the fix.
import { eventually } from '@courier/conformance';
import {
  ConfigError,
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  InMemoryTransaction,
  defineMessage,
  type Bus,
  type HandlerContext,
  type ReceivedMessage,
} from '@courier/core';
import { Inject, Injectable, Module, Scope, type INestApplication, type ModuleMetadata } from '@nestjs/common';
import { HealthCheckService, TerminusModule } from '@nestjs/terminus';
import { Test, type TestingModule } from '@nestjs/testing';
import { afterEach, describe, expect, it } from 'vitest';
import { CourierModule, InjectBus, OnMessage, courierCliSetup, getBusToken, type CourierModuleOptions, type CourierOptionsFactory } from '../src/index.js';
import { CourierHealthIndicator } from '../src/terminus.js';

const Greeted = defineMessage('greetings.Greeted', { version: 1 });
const Billed = defineMessage('billing.Billed', { version: 1 });

function memory(overrides: Partial<CourierModuleOptions<InMemoryTransaction>> = {}): CourierModuleOptions<InMemoryTransaction> & { database: InMemoryDatabase } {
  const database = new InMemoryDatabase();
  return {
    database,
    outbox: new InMemoryOutboxStore({ database }),
    inbox: new InMemoryInboxStore({ database }),
    transport: new InMemoryBroker().connect(),
    relay: { pollIntervalMs: 20 },
    ...overrides,
  };
}

async function publish(bus: Bus<InMemoryTransaction>, database: InMemoryDatabase, definition: typeof Greeted, payload: unknown): Promise<void> {
  await database.transaction(async (tx) => {
    bus.outbox(tx).publish(definition, payload);
  });
}

const apps: INestApplication[] = [];
afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
});

async function boot(metadata: ModuleMetadata): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule(metadata).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  apps.push(app);
  await app.init();
  return app;
}

/** The bootstrap's failure (compile or init), as a ConfigError, and the testing module when it compiled. */
async function bootFailure(metadata: ModuleMetadata): Promise<{ error: ConfigError; moduleRef: TestingModule | undefined }> {
  let moduleRef: TestingModule | undefined;
  try {
    moduleRef = await Test.createTestingModule(metadata).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.init();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return { error: error as ConfigError, moduleRef };
  }
  throw new Error('the application bootstrapped, but a configuration mistake should have stopped it');
}

@Injectable()
class Greetings {
  readonly heard: string[] = [];
}

@Injectable()
class GreetingHandler {
  constructor(private readonly greetings: Greetings) {}
  @OnMessage(Greeted, { consumer: 'greeter' })
  async onGreeted(message: ReceivedMessage<unknown>, ctx: HandlerContext<InMemoryTransaction>): Promise<void> {
    this.greetings.heard.push(`${ctx.consumer}:${JSON.stringify(message.payload)}`);
  }
}

describe('registration and handlers', () => {
  it('forRootAsync builds the bus from injected providers; handlers run on their provider with its dependencies', async () => {
    const settings = memory();
    @Module({ providers: [{ provide: 'SETTINGS', useValue: settings }], exports: ['SETTINGS'] })
    class SettingsModule {}

    const app = await boot({
      imports: [CourierModule.forRootAsync({ imports: [SettingsModule], inject: ['SETTINGS'], useFactory: async (options: CourierModuleOptions) => options })],
      providers: [Greetings, GreetingHandler],
    });
    const bus = app.get<Bus<InMemoryTransaction>>(getBusToken());
    expect(bus.health().consumers.map((consumer) => consumer.consumer)).toEqual(['greeter']);
    await publish(bus, settings.database, Greeted, { to: 'nest' });
    await eventually(() => expect(app.get(Greetings).heard).toEqual(['greeter:{"to":"nest"}']));
  });

  it('forRootAsync with useClass and useExisting: a CourierOptionsFactory provider builds the options', async () => {
    const shared = memory();
    @Injectable()
    class Settings {
      readonly options = shared;
    }
    @Injectable()
    class CourierConfig implements CourierOptionsFactory<InMemoryTransaction> {
      constructor(@Inject(Settings) private readonly settings: Settings) {}
      createCourierOptions(): CourierModuleOptions<InMemoryTransaction> {
        return this.settings.options;
      }
    }
    @Module({ providers: [Settings, CourierConfig], exports: [Settings, CourierConfig] })
    class ConfigModule {}

    const byClass = await boot({ imports: [CourierModule.forRootAsync({ imports: [ConfigModule], useClass: CourierConfig })], providers: [Greetings, GreetingHandler] });
    await publish(byClass.get(getBusToken()), shared.database, Greeted, { via: 'class' });
    await eventually(() => expect(byClass.get(Greetings).heard).toEqual(['greeter:{"via":"class"}']));

    await byClass.close();
    apps.splice(apps.indexOf(byClass), 1);

    const byExisting = await boot({
      imports: [CourierModule.forRootAsync({ imports: [ConfigModule], useExisting: CourierConfig })],
      providers: [Greetings, GreetingHandler],
    });
    await publish(byExisting.get(getBusToken()), shared.database, Greeted, { via: 'existing' });
    await eventually(() => expect(byExisting.get(Greetings).heard).toEqual(['greeter:{"via":"existing"}']));
  });

  it('a handler without a consumer name takes the module\'s defaultConsumer', async () => {
    @Injectable()
    class Anonymous {
      readonly seen: string[] = [];
      @OnMessage(Greeted)
      async handle(_message: ReceivedMessage<unknown>, ctx: HandlerContext<InMemoryTransaction>): Promise<void> {
        this.seen.push(ctx.consumer);
      }
    }
    const options = memory({ defaultConsumer: 'my-service' });
    const app = await boot({ imports: [CourierModule.forRoot(options)], providers: [Anonymous] });
    await publish(app.get(getBusToken()), options.database, Greeted, {});
    await eventually(() => expect(app.get(Anonymous).seen).toEqual(['my-service']));
  });

  it('named buses: @InjectBus(name) and @OnMessage(…, { bus }) pick one; each handler hears its own bus only', async () => {
    @Injectable()
    class Billing {
      readonly seen: string[] = [];
      constructor(@InjectBus('billing') readonly bus: Bus<InMemoryTransaction>) {}
      @OnMessage(Billed, { consumer: 'ledger', bus: 'billing' })
      async onBilled(message: ReceivedMessage<unknown>): Promise<void> {
        this.seen.push(message.type);
      }
    }
    const main = memory();
    const billing = memory();
    const app = await boot({ imports: [CourierModule.forRoot(main), CourierModule.forRoot({ ...billing, name: 'billing' })], providers: [Greetings, GreetingHandler, Billing] });
    const billingBus = app.get(Billing).bus;
    expect(billingBus).toBe(app.get(getBusToken('billing')));
    expect(billingBus).not.toBe(app.get(getBusToken()));
    expect(billingBus.health().consumers.map((consumer) => consumer.consumer)).toEqual(['ledger']);
    expect(app.get<Bus<unknown>>(getBusToken()).health().consumers.map((consumer) => consumer.consumer)).toEqual(['greeter']);
    await publish(billingBus, billing.database, Billed, {});
    await publish(app.get(getBusToken()), main.database, Greeted, {});
    await eventually(() => expect(app.get(Billing).seen).toEqual(['billing.Billed']));
    await eventually(() => expect(app.get(Greetings).heard).toEqual(['greeter:{}']));
  });

  it('start.consumers runs only the listed consumers; start: false starts nothing; close runs once the bus stopped', async () => {
    @Injectable()
    class Audit {
      @OnMessage(Greeted, { consumer: 'audit' })
      async onGreeted(): Promise<void> {}
    }
    const app = await boot({ imports: [CourierModule.forRoot(memory({ start: { consumers: ['audit'], relay: false } }))], providers: [Greetings, GreetingHandler, Audit] });
    const bus = app.get<Bus<unknown>>(getBusToken());
    expect(bus.health()).toMatchObject({ status: 'running', relay: { running: false }, consumers: [{ consumer: 'audit' }] });

    const closed: string[] = [];
    const idleBus: { bus?: Bus<unknown> } = {};
    const idle = await boot({
      imports: [CourierModule.forRoot(memory({ start: false, close: async () => void closed.push(idleBus.bus?.health().status ?? 'no bus') }))],
      providers: [Greetings, GreetingHandler],
    });
    idleBus.bus = idle.get<Bus<unknown>>(getBusToken());
    expect(idleBus.bus.health()).toMatchObject({ status: 'stopped', consumers: [] });
    await idle.close();
    apps.splice(apps.indexOf(idle), 1);
    expect(closed).toEqual(['stopped']);
  });

  it('shutdown gives handlers in flight stop.timeoutMs, then goes on without them', async () => {
    const entered: string[] = [];
    const never = new Promise<void>(() => undefined);
    @Injectable()
    class Stuck {
      @OnMessage(Greeted, { consumer: 'stuck' })
      async handle(message: ReceivedMessage<unknown>): Promise<void> {
        entered.push(message.messageId);
        await never;
      }
    }
    const options = memory({ stop: { timeoutMs: 300 } });
    const app = await boot({ imports: [CourierModule.forRoot(options)], providers: [Stuck] });
    const bus = app.get<Bus<InMemoryTransaction>>(getBusToken());
    await publish(bus, options.database, Greeted, {});
    await eventually(() => expect(entered).toHaveLength(1));
    apps.splice(apps.indexOf(app), 1);
    const started = Date.now();
    await app.close();
    // Abandoned after the configured 300 ms (the message stays unacknowledged, for redelivery):
    // waited for, but not for the default 10 s, nor forever.
    const took = Date.now() - started;
    expect(took).toBeGreaterThanOrEqual(250);
    expect(took).toBeLessThan(8_000);
    expect(bus.health()).toMatchObject({ status: 'stopped', counters: { processed: 0 } });
  });

  it('the terminus indicator is up while the bus is ready and down, with the reason, when it is not', async () => {
    @Module({ imports: [TerminusModule], providers: [CourierHealthIndicator], exports: [CourierHealthIndicator] })
    class HealthModule {}
    const app = await boot({ imports: [CourierModule.forRoot(memory()), CourierModule.forRoot({ ...memory({ start: false }), name: 'idle' }), HealthModule] });
    const indicator = app.get(CourierHealthIndicator);
    expect(indicator.isHealthy()).toMatchObject({ courier: { status: 'up', state: 'running', relay: { ready: true } } });
    expect(indicator.isHealthy('idle-bus', 'idle')).toMatchObject({ 'idle-bus': { status: 'down', state: 'stopped' } });
    const health = app.get(HealthCheckService);
    await expect(health.check([() => indicator.isHealthy()])).resolves.toMatchObject({ status: 'ok' });
    await expect(health.check([() => indicator.isHealthy('idle-bus', 'idle')])).rejects.toMatchObject({ status: 503 });
  });

  it('courierCliSetup gives the CLI the same stores, transport and relay settings as the module', async () => {
    const options = memory({ relay: { pollIntervalMs: 50, batchSize: 10 }, close: async () => undefined });
    const setup = courierCliSetup(options, { consumers: ['greeter'] });
    expect(setup).toMatchObject({ outbox: options.outbox, inbox: options.inbox, transport: options.transport, consumers: ['greeter'], close: options.close });
    expect(await setup.relay?.(console as never)).toEqual({ outbox: options.outbox, transport: options.transport, relay: { pollIntervalMs: 50, batchSize: 10 } });
  });
});

describe('a bad configuration fails the bootstrap with a message naming the fix', () => {
  it('forRoot without a transport or an outbox', async () => {
    const { outbox: _outbox, transport: _transport, ...rest } = memory();
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(rest as unknown as CourierModuleOptions)] });
    expect(error.problems).toEqual([
      `CourierModule: 'transport' is missing: pass a Transport (say new RabbitMqTransport({ connection })) as 'transport'`,
      `CourierModule: 'outbox' is missing: pass an OutboxStore (say new MikroOrmOutboxStore({ orm })) as 'outbox'`,
    ]);
  });

  it('what createBus refuses, named with the bus', async () => {
    const { error } = await bootFailure({ imports: [CourierModule.forRoot({ ...memory(), name: 'orders', relay: { leaseMs: -1 } })] });
    expect(error.message).toMatch(/^CourierModule 'orders': .*leaseMs/);
  });

  it('forRootAsync without an options source, or with two', () => {
    expect(() => CourierModule.forRootAsync({} as never)).toThrow(/CourierModule: forRootAsync needs 'useFactory' .*'useClass' or 'useExisting'/);
    expect(() => CourierModule.forRootAsync({ name: 'two', useFactory: () => memory(), useExisting: 'X' })).toThrow(
      `CourierModule 'two': forRootAsync takes one of 'useFactory', 'useClass' and 'useExisting', got 'useFactory' and 'useExisting'`,
    );
  });

  it('a handler with no consumer name, and nothing started', async () => {
    @Injectable()
    class Nameless {
      @OnMessage(Greeted)
      async handle(): Promise<void> {}
    }
    const { error, moduleRef } = await bootFailure({ imports: [CourierModule.forRoot(memory())], providers: [Nameless] });
    expect(error.problems).toEqual([
      `CourierModule: Nameless.handle: @OnMessage(greetings.Greeted) has no consumer name: pass { consumer: 'your-service' } to @OnMessage, or set 'defaultConsumer' in CourierModule.forRoot`,
    ]);
    expect(moduleRef?.get<Bus<unknown>>(getBusToken()).health().status).toBe('stopped');
  });

  it('two handlers of one consumer for one type', async () => {
    @Injectable()
    class Second {
      @OnMessage(Greeted, { consumer: 'greeter' })
      async again(): Promise<void> {}
    }
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(memory())], providers: [Greetings, GreetingHandler, Second] });
    expect(error.problems).toEqual([
      `CourierModule: consumer 'greeter' handles 'greetings.Greeted' twice (GreetingHandler.onGreeted and Second.again): one consumer runs one handler per message type; give one of them another consumer name (each consumer gets its own copy of every message)`,
    ]);
  });

  it('handlers of one consumer that set its options differently', async () => {
    @Injectable()
    class Fast {
      @OnMessage(Greeted, { consumer: 'mixed', concurrency: 4 })
      async one(): Promise<void> {}
      @OnMessage(Billed, { consumer: 'mixed', concurrency: 8 })
      async two(): Promise<void> {}
    }
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(memory())], providers: [Fast] });
    expect(error.problems).toEqual([
      `CourierModule: consumer 'mixed': 'concurrency' is 4 on Fast.one but 8 on Fast.two; it applies to the whole consumer: set it once, or give them the same value`,
    ]);
  });

  it('a request-scoped handler provider', async () => {
    @Injectable({ scope: Scope.REQUEST })
    class PerRequest {
      @OnMessage(Greeted, { consumer: 'scoped' })
      async handle(): Promise<void> {}
    }
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(memory())], providers: [PerRequest] });
    expect(error.message).toMatch(/PerRequest\.handle: handlers must be singleton providers, but PerRequest is request-scoped/);
  });

  it('a handler on a bus no module registers, and start.consumers naming no handler', async () => {
    @Injectable()
    class Elsewhere {
      @OnMessage(Billed, { consumer: 'ledger', bus: 'billing' })
      async handle(): Promise<void> {}
    }
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(memory({ start: { consumers: ['greeter', 'nope'] } }))], providers: [Greetings, GreetingHandler, Elsewhere] });
    expect(error.problems).toEqual([
      `CourierModule: Elsewhere.handle: @OnMessage names bus 'billing', which no CourierModule.forRoot({ name: 'billing' }) registers`,
      `CourierModule: start.consumers names 'nope', but no @OnMessage handler has that consumer (handlers exist for 'greeter')`,
    ]);
  });

  it('what bus.subscribe refuses, with the handler it came from', async () => {
    @Injectable()
    class Halting {
      @OnMessage(Greeted, { consumer: 'halting', poison: 'halt' })
      async handle(): Promise<void> {}
    }
    const { error } = await bootFailure({ imports: [CourierModule.forRoot(memory())], providers: [Halting] });
    expect(error.problems).toEqual([`CourierModule: Halting.handle: consumer 'halting': poison 'halt' is for ordered subscriptions only (set 'ordered: true', or use 'park')`]);
  });

  it('a handler that injects its dependencies with explicit @Inject tokens (for compilers without decorator metadata)', async () => {
    @Injectable()
    class Explicit {
      constructor(@Inject(Greetings) readonly greetings: Greetings) {}
      @OnMessage(Greeted, { consumer: 'explicit' })
      async handle(): Promise<void> {
        this.greetings.heard.push('explicit');
      }
    }
    const options = memory();
    const app = await boot({ imports: [CourierModule.forRoot(options)], providers: [Greetings, Explicit] });
    await publish(app.get(getBusToken()), options.database, Greeted, {});
    await eventually(() => expect(app.get(Greetings).heard).toEqual(['explicit']));
  });
});
