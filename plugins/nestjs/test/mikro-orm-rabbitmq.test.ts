// CourierModule in a Nest application on the MikroORM PostgreSQL store and RabbitMQ: the
// transaction idiom (published in a request's transaction → handled once; rolled back →
// never), handlers as providers with their dependencies, draining at shutdown, and the
// API / relay / worker modes of one image.
import { eventually } from '@courier/conformance';
import type { Bus } from '@courier/core';
import { fork } from 'node:child_process';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { runCli } from '@courier/cli';
import type { INestApplication } from '@nestjs/common';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { getBusToken } from '../src/index.js';
import { createShopApp, dropEnv, PG_URL, HandlerGate, OrdersService, PaymentsLedger, prepareSchema, query, readyInPaymentsQueue, shopEnv, ShutdownProbe, type ShopEnv } from './support/shop.js';

const WAIT = { timeoutMs: 30_000, intervalMs: 50 };
const HERE = dirname(fileURLToPath(import.meta.url));

let env: ShopEnv;
const apps: INestApplication[] = [];

beforeEach(async () => {
  env = shopEnv();
  await prepareSchema(env);
});

afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
  await dropEnv(env);
});

async function app(options: Parameters<typeof createShopApp>[1] = {}): Promise<INestApplication> {
  const created = await createShopApp(env, options);
  apps.push(created);
  return created;
}

function payments(): Promise<{ order_id: string; message_id: string }[]> {
  return query(env, 'SELECT order_id, message_id FROM $schema.nest_payments ORDER BY order_id');
}

function outboxStates(): Promise<{ key: string; state: string }[]> {
  return query(env, 'SELECT msg_key AS key, state FROM $schema.courier_outbox ORDER BY seq');
}

async function post(url: string, body: unknown, path = '/orders'): Promise<number> {
  const response = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  await response.arrayBuffer();
  return response.status;
}

describe('CourierModule on MikroORM (PostgreSQL) and RabbitMQ', () => {
  it('a message published in an HTTP request\'s transaction is handled once, by the handler provider with its injected dependencies', async () => {
    const shop = await app();
    await shop.listen(0, '127.0.0.1');
    const url = await shop.getUrl();

    // Three idioms: @Transactional() in the service, the request's EntityManager and a flush,
    // and em.transactional() outside any request.
    expect(await post(url, { orderId: 'o-1', total: 42 })).toBe(201);
    expect(await post(url, { orderId: 'o-2', total: 3 }, '/orders/by-flush')).toBe(201);
    await shop.get(OrdersService).placeExplicitly('o-3', 7);

    await eventually(async () => expect((await payments()).map((row) => row.order_id)).toEqual(['o-1', 'o-2', 'o-3']), WAIT);
    const bus = shop.get<Bus<unknown>>(getBusToken());
    await eventually(() => expect(bus.health().counters.processed).toBe(3), WAIT);
    // The handler ran on the Nest provider: its injected ledger saw each order once.
    expect([...shop.get(PaymentsLedger).runs].sort()).toEqual(['o-1', 'o-2', 'o-3']);
    expect((await outboxStates()).map((row) => row.state)).toEqual(['published', 'published', 'published']);
    expect(bus.health()).toMatchObject({ status: 'running', ready: true, counters: { duplicates: 0, deadLettered: 0 } });
  });

  it('a message whose transaction rolls back is never published nor handled', async () => {
    const shop = await app();
    await shop.listen(0, '127.0.0.1');
    const url = await shop.getUrl();

    expect(await post(url, { orderId: 'o-rolled-back', total: 1, fail: true })).toBe(500);
    // A later order goes through the same relay and consumer: once it is handled, the
    // rolled-back one had every chance to be, had anything of it been committed.
    expect(await post(url, { orderId: 'o-after', total: 2 })).toBe(201);
    await eventually(async () => expect((await payments()).map((row) => row.order_id)).toEqual(['o-after']), WAIT);

    expect(await outboxStates()).toEqual([{ key: 'o-after', state: 'published' }]);
    expect(await query(env, 'SELECT id FROM $schema.nest_orders')).toEqual([{ id: 'o-after' }]);
    expect(shop.get(PaymentsLedger).runs).toEqual(['o-after']);
  });

  it('shutdown drains a handler in flight: its effects commit and are acknowledged before the next shutdown phase', async () => {
    const shop = await app({ stopTimeoutMs: 20_000 });
    const held = shop.get(HandlerGate).hold('o-slow');
    await shop.get(OrdersService).place('o-slow', 5);
    await held.entered;

    const closing = shop.close();
    apps.splice(apps.indexOf(shop), 1);
    const bus = shop.get<Bus<unknown>>(getBusToken());
    const probe = shop.get(ShutdownProbe);
    await eventually(() => expect(bus.health().status).toBe('stopping'), WAIT);
    // The handler holds the first shutdown phase (onModuleDestroy) for as long as it runs:
    // watched for a while, the application gets no further.
    await sleep(500);
    expect(probe.seen).toBeUndefined();
    expect(await payments()).toEqual([]);

    held.release();
    await closing;
    // By the next phase (where ORM modules close their connections) the bus had stopped and
    // the handler's work was committed with its inbox record, and acknowledged: nothing is
    // left for the broker to deliver again.
    expect(probe.seen).toEqual({ status: 'stopped', payments: 1 });
    expect((await payments()).map((row) => row.order_id)).toEqual(['o-slow']);
    expect(await query(env, `SELECT consumer FROM $schema.courier_inbox`)).toEqual([{ consumer: 'payments' }]);
    expect(bus.health().counters.processed).toBe(1);
    expect(await readyInPaymentsQueue(env)).toBe(0);
  });

  it('one image runs as API, relay or worker, chosen by the start options', async () => {
    const api = await app({ start: { relay: false, consumers: false } });
    const apiBus = api.get<Bus<unknown>>(getBusToken());
    expect(apiBus.health()).toMatchObject({ relay: { running: false }, consumers: [] });
    await api.get(OrdersService).place('o-modes', 9);
    expect(await outboxStates()).toEqual([{ key: 'o-modes', state: 'pending' }]);

    // The worker first: its subscription declares the queue the relay publishes to.
    const worker = await app({ start: { relay: false } });
    const workerBus = worker.get<Bus<unknown>>(getBusToken());
    expect(workerBus.health()).toMatchObject({ relay: { running: false }, consumers: [{ consumer: 'payments', connected: true }] });
    // Nothing relays yet: the API and the worker run no relay.
    expect(await outboxStates()).toEqual([{ key: 'o-modes', state: 'pending' }]);

    const relay = await app({ start: { consumers: false } });
    const relayBus = relay.get<Bus<unknown>>(getBusToken());
    expect(relayBus.health().consumers).toEqual([]);
    await eventually(async () => expect((await payments()).map((row) => row.order_id)).toEqual(['o-modes']), WAIT);
    expect(relayBus.health().counters.published).toBe(1);
    expect(workerBus.health().counters.processed).toBe(1);
    expect(worker.get(PaymentsLedger).runs).toEqual(['o-modes']);
    expect(relay.get(PaymentsLedger).runs).toEqual([]);
    expect(api.get(PaymentsLedger).runs).toEqual([]);
  });

  // A child process through tsx: 3.4 s on a quiet machine, 18.6 s at load 30; its start may
  // take up to a minute on a busy CI machine, hence its own timeout.
  it('SIGTERM with app.enableShutdownHooks() lets the handler in flight finish, commit and acknowledge before the process exits', { timeout: 180_000 }, async () => {
    const worker = fork(join(HERE, 'support', 'sigterm-worker.ts'), [JSON.stringify({ schema: env.schema, prefix: env.prefix, pgUrl: PG_URL, handlerMs: 1_500 })], {
      cwd: join(HERE, '..'),
      execArgv: ['--conditions=@courier/source', '--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => worker.on('exit', (code, signal) => resolve({ code, signal })));
    try {
      const messages: { kind: string; orderId?: string }[] = [];
      worker.on('message', (message: { kind: string }) => messages.push(message));
      await eventually(() => expect(messages).toContainEqual({ kind: 'ready' }), { timeoutMs: 60_000, intervalMs: 50 });
      const api = await app({ start: false });
      await api.get(OrdersService).place('o-term', 6);
      await eventually(() => expect(messages).toContainEqual({ kind: 'entered', orderId: 'o-term' }), WAIT);

      worker.kill('SIGTERM');
      const { code, signal } = await exited;
      // Nest re-raises the signal once it has closed the application.
      expect(code === 0 || signal === 'SIGTERM', `exit code ${String(code)}, signal ${String(signal)}`).toBe(true);
      expect((await payments()).map((row) => row.order_id)).toEqual(['o-term']);
      expect(await query(env, `SELECT consumer FROM $schema.courier_inbox`)).toEqual([{ consumer: 'payments' }]);
      expect(await readyInPaymentsQueue(env)).toBe(0);
      expect(messages.filter((message) => message.kind === 'entered')).toHaveLength(1);
    } finally {
      if (worker.exitCode === null && worker.signalCode === null) worker.kill('SIGKILL');
      await exited;
    }
  });

  it('the courier CLI runs on the options the module uses (courier.config.ts through courierCliSetup)', async () => {
    // A worker has subscribed, as in a deployment: the CLI answers "no such dead-letter queue"
    // (exit 1) for a consumer the broker does not know, so that a mistyped prefix is not read as
    // "no dead letters" (issue 35).
    await app({ start: { relay: false } });
    const api = await app({ start: false });
    await api.get(OrdersService).place('o-cli', 4);
    const out: string[] = [];
    const err: string[] = [];
    const saved = { schema: process.env['NEST_TEST_SCHEMA'], prefix: process.env['NEST_TEST_PREFIX'] };
    process.env['NEST_TEST_SCHEMA'] = env.schema;
    process.env['NEST_TEST_PREFIX'] = env.prefix;
    try {
      const config = join(HERE, 'support', 'courier.config.ts');
      const code = await runCli(['stats', '--json', '--config', config], { out: (text) => out.push(text), err: (text) => err.push(text), interactive: false, cwd: process.cwd() });
      expect(code, `${err.join('\n')}\n${out.join('\n')}`).toBe(0);
    } finally {
      for (const [key, value] of [['NEST_TEST_SCHEMA', saved.schema], ['NEST_TEST_PREFIX', saved.prefix]] as const) {
        if (value === undefined) delete process.env[key];
        else process.env[key] = value;
      }
    }
    // The API runs no relay: the CLI sees the order's message pending in the module's outbox.
    expect(JSON.parse(out.join('\n'))).toMatchObject({ outbox: { pending: 1, dead: 0 }, transport: [{ consumer: 'payments', deadLetters: 0 }], unavailable: [] });
  });
});
