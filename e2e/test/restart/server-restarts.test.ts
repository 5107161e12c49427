// Server restarts under load, end to end: PostgreSQL → RabbitMQ → consumer while the
// broker (stop_app / start_app) or the database (pg_ctlcluster stop / start) goes away
// mid-run. They disturb every test on the machine, so they run serially, last.
import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { promisify } from 'node:util';
import { SCENARIOS, runInProcessScenario, type StoreFixture } from '@courier/conformance';
import type { EntityManager } from '@mikro-orm/core';
import { describe, expect, it } from 'vitest';
import { createPostgresFixture, createRabbitMqFixture, E2E_PUBLISH_TIMEOUT_MS, postgresStore, rabbitMqTransport, RESTART_CASE_TIMEOUT_MS, restartCaseDeadline } from '../support/fixtures.js';

const run = promisify(execFile);

/** Restarts the machine's PostgreSQL cluster (as ENVIRONMENT.md starts it). */
async function postgres(action: 'stop' | 'start'): Promise<void> {
  const version = readdirSync('/etc/postgresql')[0];
  if (!version) throw new Error('no PostgreSQL cluster under /etc/postgresql: start one and point COURIER_PG_URL at it');
  await run('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', action, ...(action === 'stop' ? ['-m', 'fast'] : [])]);
}

const plan = { messages: 200, keys: 8, perTransaction: 5, rolledBackTransactions: 3 };

describe('server restarts under load (postgresql+rabbitmq)', () => {
  it('a RabbitMQ restart loses nothing, applies nothing twice, keeps per-key order, burns no attempts', async () => {
    const deadline = restartCaseDeadline(5_000);
    const result = await runInProcessScenario(
      { store: postgresStore, transport: (context) => createRabbitMqFixture(context, { outage: 'broker', config: { publishTimeoutMs: E2E_PUBLISH_TIMEOUT_MS } }) },
      SCENARIOS['broker-restart'],
      'throw',
      { seed: Date.now() % 2 ** 31, plan, timeoutMs: 120_000, deadline },
    );
    expect(result.faultFired).toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.applied).toBe(result.committed);
    expect(result.relayPauses).toBeGreaterThan(0);
  }, RESTART_CASE_TIMEOUT_MS);

  it('a PostgreSQL restart loses nothing and the relay resumes by itself', async () => {
    const deadline = restartCaseDeadline(5_000);
    const store = async (context: { testId: string }): Promise<StoreFixture<EntityManager>> => {
      const fixture = await createPostgresFixture(context);
      return {
        ...fixture,
        outage: {
          begin: () => postgres('stop'),
          end: () => postgres('start'),
        },
      };
    };
    const result = await runInProcessScenario(
      { store, transport: rabbitMqTransport },
      SCENARIOS['database-restart'],
      'throw',
      { seed: Date.now() % 2 ** 31, plan, timeoutMs: 120_000, deadline },
    );
    expect(result.faultFired).toBe(true);
    expect(result.problems).toEqual([]);
    expect(result.applied).toBe(result.committed);
  }, RESTART_CASE_TIMEOUT_MS);
});
