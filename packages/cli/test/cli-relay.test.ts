// `courier relay` as a process of its own (PostgreSQL + RabbitMQ): it drains a backlog,
// serves /health and Prometheus /metrics (outbox, relay, transport and inbox gauges,
// the histograms) on loopback by default and behind COURIER_RELAY_TOKEN, and on SIGTERM stops cleanly — exit 0, nothing
// left leased — after which a second relay process finishes the backlog.
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import type { ChildProcess } from 'node:child_process';
import { eventually, makeEnvelope } from '@courier/conformance';
import { createBus, defineMessage } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli, startCli } from './support/run-cli.js';
import { deleteBrokerObjects, openStores, openTransport } from './support/setup.js';

/** A running relay process with its JSON log lines and the port it listens on. */
async function startRelay(env: Record<string, string>, args: readonly string[] = []): Promise<{ child: ChildProcess; logs: Record<string, unknown>[]; port: number; exited: Promise<number | null> }> {
  // No --host: the default must be loopback (issue 29: it was 0.0.0.0).
  const child = startCli(['relay', '--port', '0', '--stop-timeout', '20s', ...args], env);
  const logs: Record<string, unknown>[] = [];
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  createInterface({ input: child.stdout! }).on('line', (line) => {
    try {
      logs.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      logs.push({ message: 'not json', line });
    }
  });
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  await eventually(() => expect(logs.find((entry) => entry['message'] === 'relay http listening'), `relay logs: ${JSON.stringify(logs)} stderr: ${stderr}`).toBeDefined(), {
    timeoutMs: 60_000,
  });
  const port = Number(logs.find((entry) => entry['message'] === 'relay http listening')!['port']);
  return { child, logs, port, exited };
}

describe('courier relay (postgresql + rabbitmq)', () => {
  const prefix = `cli${randomBytes(4).toString('hex')}_`;
  // The sink's dead letters are in the config, so /metrics reports their depth.
  const token = randomBytes(16).toString('hex');
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: `${prefix}sink`, COURIER_RELAY_TOKEN: token };
  const authorised = { headers: { authorization: `Bearer ${token}` } };
  const cleanup: (() => Promise<unknown>)[] = [];
  afterAll(async () => {
    for (const close of cleanup.reverse()) await close();
    await deleteBrokerObjects(prefix, [`${prefix}sink`]);
  });

  it('drains a backlog, serves /health and /metrics, stops on SIGTERM with nothing leased', { timeout: 240_000 }, async () => {
    const stores = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Work = defineMessage('cli.Work', { version: 1, topic: `${prefix}work` });
    const copies = new Map<string, number>();
    const subscription = await transport.subscribe({ consumer: `${prefix}sink`, topics: [Work.topic], ordered: false, concurrency: 16 }, async (delivery) => {
      copies.set(delivery.envelope.messageId, (copies.get(delivery.envelope.messageId) ?? 0) + 1);
      await delivery.ack();
    });
    cleanup.push(() => subscription.close());
    const producer = createBus({ outbox: stores.outbox, transport });
    const total = 3_000;
    for (let chunk = 0; chunk < total; chunk += 500) {
      await stores.orm.em.fork().transactional(async (em: EntityManager) => {
        for (let index = chunk; index < chunk + 500; index += 1) producer.outbox(em).publish(Work, { n: index }, index % 2 === 0 ? {} : { key: `k-${index % 32}` });
      });
    }
    const leased = async (): Promise<number> => {
      const rows = (await stores.orm.em.getConnection().execute(`SELECT COUNT(*) AS n FROM "${prefix}outbox" WHERE state = 'pending' AND lease_token IS NOT NULL`, [], 'all')) as { n: string }[];
      return Number(rows[0]!.n);
    };

    // An inbox with a dead-lettered message and a halted key, as a consumer leaves them:
    // /metrics reports both from the config's inbox.
    const billing = `${prefix}billing`;
    await stores.inbox.run('dead-1', `${billing}~dead`, async () => undefined);
    await stores.inbox.run('done-1', billing, async () => undefined);
    await stores.inbox.halt(billing, Work.topic, 'k-halted', makeEnvelope({ topic: Work.topic, key: 'k-halted' }), 'E: poison');

    const first = await startRelay(env);
    cleanup.push(async () => first.child.kill('SIGKILL'));
    await eventually(() => expect(copies.size).toBeGreaterThan(0), { timeoutMs: 60_000 });
    expect(first.logs.find((entry) => entry['message'] === 'relay http listening')).toMatchObject({ host: '127.0.0.1', token: true });
    expect((await fetch(`http://127.0.0.1:${first.port}/metrics`)).status, '/metrics without the token').toBe(401);
    expect((await fetch(`http://127.0.0.1:${first.port}/health`)).status, '/health without the token').toBe(401);
    const health = await fetch(`http://127.0.0.1:${first.port}/health`, authorised);
    expect(health.status).toBe(200);
    expect(await health.json()).toMatchObject({ ready: true, relay: { running: true, paused: false } });
    // A message can reach the consumer before the relay counts it: a confirmed batch is
    // marked published (and counted) in the relay's next claim. Scrape until it shows.
    await eventually(
      async () => {
        const scraped = await (await fetch(`http://127.0.0.1:${first.port}/metrics`, authorised)).text();
        for (const name of ['courier_outbox_pending', 'courier_outbox_oldest_pending_age_seconds', 'courier_outbox_in_flight', 'courier_outbox_dead', 'courier_outbox_halted_keys', 'courier_relay_paused', 'courier_relay_published_total']) {
          expect(scraped, `metric ${name} in:\n${scraped}`).toMatch(new RegExp(`^${name}(\\{[^}]*\\})? \\d`, 'm'));
        }
        expect(Number(/^courier_relay_paused(?:\{[^}]*\})? (\d+)/m.exec(scraped)?.[1])).toBe(0);
        // The transport dead-letter depth of the configured consumer (none dead here).
        expect(scraped).toMatch(new RegExp(`^courier_transport_dead_letters\\{[^}]*messaging_consumer_group_name="${prefix}sink"[^}]*\\} 0$`, 'm'));
        // The inbox gauges of the config's inbox (issue 12: inbox dead letters, halted keys).
        expect(scraped).toMatch(new RegExp(`^courier_inbox_dead_letters\\{[^}]*messaging_consumer_group_name="${billing}"[^}]*\\} 1$`, 'm'));
        expect(scraped).toMatch(new RegExp(`^courier_inbox_records\\{[^}]*messaging_consumer_group_name="${billing}"[^}]*\\} 1$`, 'm'));
        expect(scraped).toMatch(new RegExp(`^courier_inbox_halted_keys\\{[^}]*messaging_consumer_group_name="${billing}"[^}]*\\} 1$`, 'm'));
        // Commit → confirm of the published rows (their age from the claim, database clock).
        expect(scraped).toMatch(/^courier_relay_commit_to_confirm_duration_seconds_count\{[^}]*messaging_destination_name="[^"]+"[^}]*\} [1-9]/m);
        // The publish-duration histogram (sent → every confirm) of the relay's publish calls.
        expect(scraped).toMatch(/^messaging_client_operation_duration_seconds_count\{[^}]*messaging_operation_type="send"[^}]*\} [1-9]/m);
        // The relay names itself (OTel service.name; Prometheus target_info), unless OTEL_SERVICE_NAME says otherwise.
        expect(scraped).toMatch(/^target_info\{[^}]*service_name="courier-relay"/m);
      },
      { timeoutMs: 30_000 },
    );

    first.child.kill('SIGTERM');
    expect(await first.exited).toBe(0);
    expect(first.logs.map((entry) => entry['message'])).toContain('relay stopped');
    expect(first.logs.every((entry) => entry['message'] !== 'not json')).toBe(true);
    expect(await leased()).toBe(0);
    const afterStop = await stores.outbox.stats();
    expect(afterStop).toMatchObject({ inFlight: 0, dead: 0 });

    if (afterStop.pending > 0) {
      const second = await startRelay(env);
      cleanup.push(async () => second.child.kill('SIGKILL'));
      await eventually(() => expect(copies.size).toBe(total), { timeoutMs: 120_000 });
      second.child.kill('SIGINT');
      expect(await second.exited).toBe(0);
    } else {
      await eventually(() => expect(copies.size).toBe(total), { timeoutMs: 60_000 });
    }
    expect(await stores.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 });
    expect(await leased()).toBe(0);
  });

  // Issue 35: tsx loads the config's transport under its own module namespace, so its errors
  // are not `instanceof` the relay's CourierError. The relay's error text then lost its code
  // ("TransportError: … unroutable" without "[PUBLISH_UNROUTABLE]"), and the runbook's
  // `dead replay --all --code PUBLISH_UNROUTABLE` found nothing with the rows dead.
  it('dead rows written by `courier relay` keep their error code: --code finds them', { timeout: 180_000 }, async () => {
    const stores = await openStores('postgresql', prefix);
    cleanup.push(() => stores.close());
    await stores.outbox.ensureSchema();
    const transport = await openTransport(prefix);
    cleanup.push(() => transport.close());
    const Lost = defineMessage('cli.Lost', { version: 1, topic: `${prefix}nowhere` });
    const producer = createBus({ outbox: stores.outbox, transport });
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      for (let index = 0; index < 3; index += 1) producer.outbox(em).publish(Lost, { n: index });
    });
    const relay = await startRelay({ ...env, CLI_TEST_RELAY_MAX_ATTEMPTS: '1' });
    cleanup.push(async () => relay.child.kill('SIGKILL'));
    await eventually(async () => expect((await stores.outbox.stats()).dead).toBe(3), { timeoutMs: 60_000 });
    relay.child.kill('SIGTERM');
    expect(await relay.exited).toBe(0);
    const listed = await runCli(['dead', 'list', '--source', 'outbox', '--code', 'PUBLISH_UNROUTABLE', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const rows = JSON.parse(listed.stdout) as { code: string | null; envelope: { type: string } }[];
    expect(rows.map((row) => [row.envelope.type, row.code])).toEqual([
      ['cli.Lost', 'PUBLISH_UNROUTABLE'],
      ['cli.Lost', 'PUBLISH_UNROUTABLE'],
      ['cli.Lost', 'PUBLISH_UNROUTABLE'],
    ]);
    const dryRun = await runCli(['dead', 'replay', '--all', '--code', 'PUBLISH_UNROUTABLE', '--dry-run'], env);
    expect(dryRun.code, dryRun.stderr).toBe(0);
    expect(dryRun.stdout).not.toMatch(/nothing to replay/);
    await runCli(['dead', 'purge', '--all', '--source', 'outbox', '--yes'], env);
  });
});
