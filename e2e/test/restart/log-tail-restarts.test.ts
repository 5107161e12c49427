// Server restarts with the relay tailing PostgreSQL's log (`PgLogicalOutboxStore`, issue 38),
// end to end: PostgreSQL → RabbitMQ → consumer while RabbitMQ (stop_app / start_app) or
// PostgreSQL (pg_ctlcluster stop / start: the replication stream is cut too) goes away, and
// a relay killed while the broker is down. They disturb every test on the machine, so they
// run in the serial restart project.
import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { promisify } from 'node:util';
import { SCENARIOS, runInProcessScenario } from '@courier/conformance';
import { createBus, defineMessage, noopLogger } from '@courier/core';
import { afterAll, describe, expect, it } from 'vitest';
import { createRabbitMqFixture, E2E_PUBLISH_TIMEOUT_MS, rabbitMqTransport, RESTART_CASE_TIMEOUT_MS, restartCaseDeadline } from '../support/fixtures.js';
import { dropLogTailSlots, logTailStore, type LogTailStoreFixture } from '../support/log-tail-fixtures.js';

const run = promisify(execFile);
const SLOT_PREFIX = 'ltrs_';

/** Restarts the machine's PostgreSQL cluster (as ENVIRONMENT.md starts it). */
async function postgres(action: 'stop' | 'start'): Promise<void> {
  const version = readdirSync('/etc/postgresql')[0];
  if (!version) throw new Error('no PostgreSQL cluster under /etc/postgresql: start one and point COURIER_PG_URL at it');
  await run('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', action, ...(action === 'stop' ? ['-m', 'fast'] : [])]);
}

const plan = { messages: 200, keys: 8, perTransaction: 5, rolledBackTransactions: 3 };
const brokerTransport = (context: { testId: string }) => createRabbitMqFixture(context, { outage: 'broker', config: { publishTimeoutMs: E2E_PUBLISH_TIMEOUT_MS } });

afterAll(() => dropLogTailSlots(SLOT_PREFIX));

describe('server restarts with the log-tailing relay (postgresql+rabbitmq)', () => {
  it('a RabbitMQ restart loses nothing, applies nothing twice, keeps per-key order, burns no attempts', async () => {
    const deadline = restartCaseDeadline(5_000);
    const result = await runInProcessScenario(
      { store: (context) => logTailStore(context, SLOT_PREFIX, { readAtOnce: true }), transport: brokerTransport },
      SCENARIOS['broker-restart'],
      'throw',
      { seed: Date.now() % 2 ** 31, plan, timeoutMs: 120_000, deadline },
    );
    expect(result.faultFired).toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.applied).toBe(result.committed);
    expect(result.relayPauses).toBeGreaterThan(0);
  }, RESTART_CASE_TIMEOUT_MS);

  it('PostgreSQL stops (fast) while the log-tail reader holds an unpublished row; the row is completed after the restart', async () => {
    // Failed before the reader reported what it received: PostgreSQL's shutdown waits until every WAL sender's client
    // reports the last WAL sent as written, and a reader repeating only its confirmed position (the row unsettled)
    // kept it waiting: "pg_ctl: server does not shut down" after 60 s.
    const testId = `t${Date.now().toString(16)}s`;
    const store = await logTailStore({ testId }, SLOT_PREFIX, { readAtOnce: true });
    const transport = await rabbitMqTransport({ testId });
    let down = false;
    try {
      expect(store.outbox.streaming).toBe(true);
      const Work = defineMessage('restart.Work', { version: 1, topic: `${testId}.work` });
      const producer = createBus({ outbox: store.another(), transport: transport.transport, logger: noopLogger });
      await store.transaction(async (tx) => {
        await producer.outbox(tx).publish(Work, { i: 0 }, { key: 'a' });
      });
      const claimUntil = Date.now() + 30_000;
      let batch = await store.outbox.claim({ owner: 'holder', limit: 10, leaseMs: 150_000, perKey: 1 });
      while (batch.records.length === 0 && Date.now() < claimUntil) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        batch = await store.outbox.claim({ owner: 'holder', limit: 10, leaseMs: 150_000, perKey: 1 });
      }
      expect(batch.records).toHaveLength(1);
      expect(store.outbox.claimed.logged).toBe(1);
      down = true;
      await postgres('stop');
      await postgres('start');
      down = false;
      // The reader comes back by itself; the row, still leased to it, is completed.
      const streamUntil = Date.now() + 60_000;
      while (!store.outbox.streaming && Date.now() < streamUntil) await new Promise((resolve) => setTimeout(resolve, 100));
      expect(store.outbox.streaming).toBe(true);
      let completed = 0;
      const completeUntil = Date.now() + 30_000;
      for (;;) {
        try {
          completed = await store.outbox.complete(batch.lease, batch.records.map((record) => record.sequence));
          break;
        } catch (error) {
          // The pool's first query after the restart may meet a connection the server closed.
          if (Date.now() > completeUntil) throw error;
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
      }
      expect(completed).toBe(1);
      expect((await store.outbox.stats()).pending).toBe(0);
    } finally {
      if (down) await postgres('start').catch(() => undefined);
      await transport.close();
      await store.close();
    }
  }, RESTART_CASE_TIMEOUT_MS);

  it('a PostgreSQL restart (the slot\'s stream cut too) loses nothing and the relay resumes reading the log by itself', async () => {
    const deadline = restartCaseDeadline(5_000);
    const stores: LogTailStoreFixture[] = [];
    const result = await runInProcessScenario(
      {
        store: async (context) => {
          const fixture = await logTailStore(context, SLOT_PREFIX, { readAtOnce: true });
          stores.push(fixture);
          return { ...fixture, outage: { begin: () => postgres('stop'), end: () => postgres('start') } };
        },
        transport: rabbitMqTransport,
      },
      SCENARIOS['database-restart'],
      'throw',
      { seed: Date.now() % 2 ** 31, plan, timeoutMs: 120_000, deadline },
    );
    expect(result.faultFired).toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.applied).toBe(result.committed);
  }, RESTART_CASE_TIMEOUT_MS);

  it('a relay killed while the broker is down: the next relay on the slot publishes every row, each key in order, none skipped', async () => {
    const testId = `t${Date.now().toString(16)}`;
    const store = await logTailStore({ testId }, SLOT_PREFIX, { readAtOnce: true });
    const transport = await brokerTransport({ testId });
    const Work = defineMessage('restart.Work', { version: 1, topic: `${testId}.work` });
    const tuning = { batchSize: 10, leaseMs: 1_500, pollIntervalMs: 50, retry: { maxAttempts: 1 }, pause: { initialDelayMs: 20, maxDelayMs: 250 } };
    let brokerDown = false;
    try {
      // The consumer's bus first: the queue exists before anything is published.
      const applied = new Map<string, number[]>();
      const consumer = createBus({ outbox: store.another(), inbox: store.inbox, transport: await transport.connect(), logger: noopLogger });
      consumer.subscribe(`${testId}.consumer`, Work, async (message, ctx) => {
        await store.recordEffect(ctx.tx, message.messageId);
        const { key, i } = message.payload as { key: string; i: number };
        applied.set(key, [...(applied.get(key) ?? []), i]);
      }, { ordered: true });
      await consumer.start({ relay: false, consumers: true });
      // Relay A tails the slot; the broker goes away; the traffic is committed; A claims it, cannot publish, and is killed.
      const relayA = createBus({ outbox: store.outbox, transport: await transport.connect(), logger: noopLogger, relay: tuning });
      await relayA.start({ relay: true, consumers: false });
      await transport.outage!.begin();
      brokerDown = true;
      const producer = createBus({ outbox: store.another(), transport: transport.transport, logger: noopLogger });
      const keys = ['a', 'b', 'c', 'd'];
      for (let t = 0; t < 20; t++) {
        await store.transaction(async (tx) => {
          for (let j = 0; j < 5; j++) {
            const i = t * 5 + j;
            await producer.outbox(tx).publish(Work, { key: keys[i % keys.length]!, i }, { key: keys[i % keys.length]! });
          }
        });
      }
      const deadline = Date.now() + 30_000;
      while (store.outbox.claimed.logged === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20));
      expect(store.outbox.claimed.logged, 'relay A claimed rows from the log while the broker was down').toBeGreaterThan(0);
      // Killed: no release, no completion; its slot connection and pool go with it.
      await relayA.stop({ timeoutMs: 0 }).catch(() => undefined);
      await store.outbox.close();
      await transport.outage!.end();
      brokerDown = false;
      // Relay B takes the slot over and publishes what A never confirmed.
      const next = store.another();
      const relayB = createBus({ outbox: next, transport: await transport.connect(), logger: noopLogger, relay: tuning });
      await relayB.start({ relay: true, consumers: false });
      const until = Date.now() + 90_000;
      const count = () => [...applied.values()].reduce((sum, list) => sum + list.length, 0);
      while (count() < 100 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 50));
      // Applied once each (the inbox drops a second delivery), every key in commit order.
      const effects = await store.readEffects();
      expect(new Set(effects).size).toBe(100);
      expect(effects).toHaveLength(100);
      for (const key of keys) {
        const order = applied.get(key) ?? [];
        expect(order).toHaveLength(25);
        expect(order).toEqual([...order].sort((x, y) => x - y));
      }
      expect(next.claimed.logged + next.claimed.swept).toBeGreaterThan(0);
      console.log(`[log-tail restart] relay A claimed ${store.outbox.claimed.logged} from the log before its kill; relay B claimed ${next.claimed.logged} from the log, ${next.claimed.swept} by sweep`);
      await relayB.stop();
      await consumer.stop();
      await producer.stop();
    } finally {
      if (brokerDown) await transport.outage!.end().catch(() => undefined);
      await transport.close();
      await store.close();
    }
  }, RESTART_CASE_TIMEOUT_MS);
});
