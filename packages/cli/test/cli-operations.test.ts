// Operations round 2 through the compiled binary on PostgreSQL (+ RabbitMQ where a broker is
// involved): halted consumer keys found without naming the consumer, bulk resume with a dry
// run, failure groups with replay/purge by group, stats that print what they can read when
// the broker is down, and prune's dry run and confirmation.
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

const LEASE = { leaseMs: 60_000, perKey: 1 } as const;

describe('courier operations (postgresql)', () => {
  const prefix = `clio${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;
  const append = (envelopes: readonly Envelope[]) =>
    stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, envelopes.map((item) => ({ envelope: item })));
    });

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    await stores.inbox.ensureSchema();
  });
  afterAll(async () => {
    await stores?.close();
  });

  it("stats and halted list show every consumer's halted keys unnamed; resume --all resumes them in bulk after a dry run", async () => {
    // Two consumers with halted keys (one holding two messages), none named on the command line.
    for (const [consumer, key, held] of [['billing', 'k1', 2], ['billing', 'k2', 0], ['shipping', 'k1', 1]] as const) {
      await stores.inbox.halt(consumer, topic, key, makeEnvelope({ topic, key }), 'HandlerError [HANDLER_FAILED]: boom');
      for (let index = 0; index < held; index += 1) await stores.inbox.halt(consumer, topic, key, makeEnvelope({ topic, key }), 'held');
    }

    const stats = await runCli(['stats', '--json'], env);
    expect(stats.code, stats.stderr).toBe(0);
    expect(JSON.parse(stats.stdout).consumerHalts).toEqual([
      { consumer: 'billing', haltedKeys: 2, held: 2 },
      { consumer: 'shipping', haltedKeys: 1, held: 1 },
    ]);
    const text = await runCli(['stats'], env);
    expect(text.stdout).toMatch(/consumer halted keys\s+CONSUMER\s+HALTED KEYS\s+MESSAGES HELD\s+billing\s+2\s+2\s+shipping\s+1\s+1/);

    const listed = await runCli(['halted', 'list', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const keys = JSON.parse(listed.stdout) as { consumer: string | null; key: string; held: number }[];
    expect(keys.map((key) => `${key.consumer}/${key.key}/${key.held}`).sort()).toEqual(['billing/k1/2', 'billing/k2/0', 'shipping/k1/1']);
    expect((await runCli(['halted', 'list'], env)).stdout).toContain('consumer shipping');

    const dry = await runCli(['halted', 'resume', '--all', '--consumer', 'billing', '--dry-run'], env);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain('dry run: would retry the head of 2 halted key(s); nothing changed');
    expect((await stores.inbox.listHalted({})).every((key) => key.resumed === null)).toBe(true);
    // No terminal and no --yes: refused, nothing changed.
    expect((await runCli(['halted', 'resume', '--all'], env)).code).toBe(2);
    expect((await runCli(['halted', 'resume', '--all', topic, 'k1'], env)).code).toBe(2);

    const resumed = await runCli(['halted', 'resume', '--all', '--consumer', 'billing', '--park', '--yes'], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toContain('resumed 2 of 2 halted key(s) (park)');
    const after = await stores.inbox.listHalted({});
    expect(after.filter((key) => key.consumer === 'billing').map((key) => key.resumed)).toEqual(['park', 'park']);
    expect(after.find((key) => key.consumer === 'shipping')?.resumed).toBeNull();
    // Resumed keys are draining: a second bulk resume leaves them alone and takes the rest.
    const rest = await runCli(['halted', 'resume', '--all', '--yes'], env);
    expect(rest.code, rest.stderr).toBe(0);
    expect(rest.stdout).toContain("resumed consumer 'shipping'");
    expect(rest.stdout).not.toContain("'billing'");
  });

  it('dead groups groups dead rows by type, code and normalised error; replay and purge act on one group only', async () => {
    const rows = [
      makeEnvelope({ topic, key: null, type: 'cli.Placed' }),
      makeEnvelope({ topic, key: null, type: 'cli.Placed' }),
      makeEnvelope({ topic, key: null, type: 'cli.Placed' }),
      makeEnvelope({ topic, key: null, type: 'cli.Paid' }),
    ];
    await append(rows);
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    const seqOf = (item: Envelope) => batch.records.find((record) => record.envelope.messageId === item.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [
      { sequence: seqOf(rows[0]!), error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for 'order-17' (id 4711)`, outcome: 'dead' },
      { sequence: seqOf(rows[1]!), error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for 'order-18' (id 4712)`, outcome: 'dead' },
      { sequence: seqOf(rows[2]!), error: 'TransportError [PAYLOAD_TOO_LARGE]: 300000 bytes', outcome: 'dead' },
      { sequence: seqOf(rows[3]!), error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for 'order-19' (id 4713)`, outcome: 'dead' },
    ]);

    const grouped = await runCli(['dead', 'groups', '--json'], env);
    expect(grouped.code, grouped.stderr).toBe(0);
    const groups = JSON.parse(grouped.stdout) as { id: string; type: string; code: string; consumer: null; count: number; error: string; refs: string[]; firstSeen: string; lastSeen: string }[];
    expect(groups.map((group) => [group.type, group.code, group.count])).toEqual([
      ['cli.Placed', 'PUBLISH_UNROUTABLE', 2],
      ...groups.slice(1).map((group) => [group.type, group.code, 1]),
    ]);
    expect(groups).toHaveLength(3);
    const [unroutable] = groups;
    expect(unroutable!.error).toBe(`TransportError [PUBLISH_UNROUTABLE]: no queue bound for '<value>' (id <n>)`);
    expect(unroutable!.refs.sort()).toEqual([`outbox:${seqOf(rows[0]!)}`, `outbox:${seqOf(rows[1]!)}`].sort());
    expect(Date.parse(unroutable!.firstSeen)).toBeLessThanOrEqual(Date.parse(unroutable!.lastSeen));
    const table = await runCli(['dead', 'groups'], env);
    expect(table.stdout).toMatch(new RegExp(`${unroutable!.id}\\s+2\\s+cli\\.Placed\\s+PUBLISH_UNROUTABLE\\s+\\(outbox\\)`));

    expect((await runCli(['dead', 'replay', '--group', 'not-an-id'], env)).code).toBe(2);
    const dry = await runCli(['dead', 'replay', '--group', unroutable!.id, '--dry-run'], env);
    expect(dry.stdout).toContain('dry run: would replay 2 message(s); nothing changed');
    const replayed = await runCli(['dead', 'replay', '--group', unroutable!.id, '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('replayed 2 outbox row(s)');
    expect((await stores.outbox.stats()).dead).toBe(2);
    const listed = JSON.parse((await runCli(['dead', 'list', '--json', '--group', groups[1]!.id], env)).stdout) as { ref: string }[];
    expect(listed.map((item) => item.ref)).toEqual(groups[1]!.refs);
    const purged = await runCli(['dead', 'purge', '--group', groups[1]!.id, '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(purged.stdout).toContain('purged 1 outbox row(s)');
    expect((await stores.outbox.stats()).dead).toBe(1);
  });

  it('dead list says when --limit cut the listing, with the next page\'s cursor', async () => {
    const listed = await runCli(['dead', 'list', '--limit', '1', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toHaveLength(1);
    expect(listed.stderr).toBe('');
    await append([makeEnvelope({ topic, key: null })]);
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    await stores.outbox.fail(batch.lease, batch.records.map((record) => ({ sequence: record.sequence, error: 'x', outcome: 'dead' as const })));
    const cut = await runCli(['dead', 'list', '--limit', '1', '--json'], env);
    expect(JSON.parse(cut.stdout)).toHaveLength(1);
    // Earlier cases of this file left dead rows of their own: more follow, with the cursor.
    expect(cut.stderr).toMatch(/courier: 1 of ([2-9]|[1-9]\d+) shown; more follow: courier dead list --after \S+ /);
  });

  it('stats prints the outbox backlog when the broker is down, names what it could not read, and exits 1', async () => {
    const down = await runCli(['stats'], { ...env, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: 'payments', COURIER_RABBITMQ_URL: 'amqp://guest:guest@127.0.0.1:1' });
    expect(down.code, down.stderr).toBe(1);
    expect(down.stdout).toMatch(/^outbox\s+PENDING/);
    expect(down.stdout).toMatch(/could not read[^\n]*\n\s+transport dead letters of 'payments': /);
    const json = await runCli(['stats', '--json'], { ...env, CLI_TEST_BROKER_PREFIX: prefix, CLI_TEST_CONSUMERS: 'payments', COURIER_RABBITMQ_URL: 'amqp://guest:guest@127.0.0.1:1' });
    const parsed = JSON.parse(json.stdout) as { outbox: { dead: number }; transport: unknown[]; unavailable: { what: string }[] };
    expect(parsed.outbox.dead).toBe((await stores.outbox.stats()).dead);
    expect(parsed.transport).toEqual([]);
    // Both reads that need the broker are named: its dead letters and the consumer's lag.
    expect(parsed.unavailable.map((part) => part.what)).toEqual(["transport dead letters of 'payments'", "lag of 'payments' at the broker"]);
  });

  it('prune --dry-run deletes nothing; an inbox window below a day needs --yes', async () => {
    await stores.inbox.run(`old-${prefix}`, 'pruned', async () => undefined);
    const records = async () => (await stores.inbox.stats()).consumers.find((row) => row.consumer === 'pruned')?.records ?? 0;
    const dry = await runCli(['prune', '--older-than', '0s', '--dry-run'], env);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain('dry run: nothing deleted');
    expect(dry.stdout).toContain("inbox: would delete records older than 0s");
    expect(await records()).toBe(1);
    const refused = await runCli(['prune', '--older-than', '0s'], env);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('without confirmation');
    expect(await records()).toBe(1);
    // The outbox alone has no deduplication window: no confirmation.
    expect((await runCli(['prune', '--older-than', '0s', '--only', 'outbox'], env)).code).toBe(0);
    const pruned = await runCli(['prune', '--older-than', '0s', '--yes'], env);
    expect(pruned.code, pruned.stderr).toBe(0);
    expect(await records()).toBe(0);
  });
});
