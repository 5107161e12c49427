// `courier relay` through a database outage (issue 35): with the config the CLI README showed
// before (MikroORM's defaults, `connect: true`), the relay exited 1 when PostgreSQL was down at
// start, so its container crash-looped. It must wait, answer /health 503, start when the
// database returns and drain the backlog — and ride out an outage after it started.
// PostgreSQL is shared: the outage is a TCP proxy in front of it that this test stops and
// starts, never the server itself.
import { randomBytes } from 'node:crypto';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import type { ChildProcess } from 'node:child_process';
import { eventually } from '@courier/conformance';
import { createBus, defineMessage } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, describe, expect, it } from 'vitest';
import { startCli } from './support/run-cli.js';
import { deleteBrokerObjects, openStores, openTransport, PG_URL } from './support/setup.js';

/** A TCP proxy to `target` that can be stopped (refusing connections, cutting open ones) and started again on the same port. */
class OutageProxy {
  #server: Server | undefined;
  readonly #sockets = new Set<Socket>();
  constructor(
    readonly port: number,
    private readonly target: { host: string; port: number },
  ) {}

  static async onFreePort(target: { host: string; port: number }): Promise<OutageProxy> {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const { port } = probe.address() as { port: number };
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    return new OutageProxy(port, target);
  }

  async start(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.target.port, this.target.host);
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on('close', () => this.#sockets.delete(socket));
        socket.on('error', () => undefined);
      }
      client.pipe(upstream).pipe(client);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', resolve);
    });
    this.#server = server;
  }

  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    for (const socket of this.#sockets) socket.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe('courier relay through a database outage (postgresql behind a proxy + rabbitmq)', () => {
  const prefix = `cliout${randomBytes(4).toString('hex')}_`;
  const token = randomBytes(16).toString('hex');
  const cleanup: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close().catch(() => undefined);
    await deleteBrokerObjects(prefix, [`${prefix}sink`]);
  });

  it('waits for the database at start (/health 503), starts when it returns, drains the backlog, and rides out a later outage', { timeout: 300_000 }, async () => {
    const stores = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Work = defineMessage('cli.OutageWork', { version: 1, topic: `${prefix}work` });
    const copies = new Map<string, number>();
    const subscription = await transport.subscribe({ consumer: `${prefix}sink`, topics: [Work.topic], ordered: false, concurrency: 16 }, async (delivery) => {
      copies.set(delivery.envelope.messageId, (copies.get(delivery.envelope.messageId) ?? 0) + 1);
      await delivery.ack();
    });
    cleanup.push(() => subscription.close());
    const producer = createBus({ outbox: stores.outbox, transport });
    const publish = async (from: number, count: number): Promise<void> => {
      await stores.orm.em.fork().transactional(async (em: EntityManager) => {
        for (let index = from; index < from + count; index += 1) producer.outbox(em).publish(Work, { n: index }, index % 2 === 0 ? {} : { key: `k-${index % 8}` });
      });
    };
    await publish(0, 300);

    const pg = new URL(PG_URL);
    const proxy = await OutageProxy.onFreePort({ host: pg.hostname, port: Number(pg.port || 5432) });
    cleanup.push(() => proxy.stop());
    const viaProxy = new URL(PG_URL);
    viaProxy.port = String(proxy.port);

    // The proxy is down: the config's MikroORM.init (connect: true) cannot reach the database.
    const child: ChildProcess = startCli(['relay', '--port', '0', '--stop-timeout', '20s'], {
      CLI_TEST_DIALECT: 'postgresql',
      CLI_TEST_PREFIX: prefix,
      CLI_TEST_BROKER_PREFIX: prefix,
      CLI_TEST_DB_URL: viaProxy.href,
      COURIER_RELAY_TOKEN: token,
    });
    cleanup.push(async () => child.kill('SIGKILL'));
    // The relay's log lines are JSON on both streams (info on stdout, warn and error on
    // stderr). knex (under the config's MikroORM) writes plain "Connection Error: …" lines of
    // its own to stdout when a pooled connection is cut: not the relay's to format.
    const logs: Record<string, unknown>[] = [];
    for (const [stream, name] of [[child.stdout!, 'stdout'], [child.stderr!, 'stderr']] as const) {
      createInterface({ input: stream }).on('line', (line) => {
        try {
          logs.push(JSON.parse(line) as Record<string, unknown>);
        } catch {
          logs.push({ message: 'not json', stream: name, line });
        }
      });
    }
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    let exitCode: number | null | undefined;
    void exited.then((code) => (exitCode = code));
    const seen = () => `relay logs: ${JSON.stringify(logs)}`;
    await eventually(() => expect(logs.find((entry) => entry['message'] === 'relay http listening'), seen()).toBeDefined(), { timeoutMs: 60_000 });
    const port = Number(logs.find((entry) => entry['message'] === 'relay http listening')!['port']);
    const health = async (): Promise<number> => (await fetch(`http://127.0.0.1:${port}/health`, { headers: { authorization: `Bearer ${token}` } })).status;

    // Waiting, not exiting: it says so, and /health answers 503.
    await eventually(() => expect(logs.filter((entry) => String(entry['message']).startsWith('relay cannot start yet')).length, seen()).toBeGreaterThanOrEqual(2), { timeoutMs: 60_000 });
    expect(exitCode, seen()).toBeUndefined();
    expect(await health()).toBe(503);
    expect(copies.size).toBe(0);

    // The database returns: the relay starts, /health turns 200, the backlog drains.
    await proxy.start();
    await eventually(async () => expect(await health(), seen()).toBe(200), { timeoutMs: 90_000 });
    await eventually(() => expect(copies.size).toBe(300), { timeoutMs: 90_000 });
    expect(logs.map((entry) => entry['message'])).toContain('relay started');

    // An outage after the start: the relay pauses (503), does not exit, and resumes.
    await proxy.stop();
    await publish(300, 200);
    await eventually(async () => expect(await health(), seen()).toBe(503), { timeoutMs: 60_000 });
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    expect(exitCode, seen()).toBeUndefined();
    await proxy.start();
    await eventually(async () => expect(await health(), seen()).toBe(200), { timeoutMs: 90_000 });
    await eventually(() => expect(copies.size).toBe(500), { timeoutMs: 90_000 });

    child.kill('SIGTERM');
    expect(await exited, seen()).toBe(0);
    expect(await stores.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 });
    expect(logs.filter((entry) => entry['message'] === 'not json' && !String(entry['line']).startsWith('Connection Error: ')), seen()).toEqual([]);
    expect(logs.filter((entry) => entry['message'] === 'relay failed'), seen()).toEqual([]);
  });
});
