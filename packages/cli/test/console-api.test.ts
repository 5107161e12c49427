// `courier console`'s JSON API through the compiled binary on PostgreSQL: it shows the same
// failure groups and halted keys as `courier dead groups` / `courier halted list` (one
// implementation), refuses every action without the operator token or in read-only mode
// (changing nothing), logs each action with who did it, replays a group exactly once
// (counts checked in the database), and resumes a halted key.
import { randomBytes } from 'node:crypto';
import { request } from 'node:http';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startConsole, type RunningConsole } from './support/console.js';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

const LEASE = { leaseMs: 60_000, perKey: 1 } as const;
const TOKEN = `tok-${randomBytes(8).toString('hex')}`;

describe('courier console API on PostgreSQL', () => {
  const prefix = `cons${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;
  let consoleApp: RunningConsole;
  const envelope = (key: string | null, overrides: Partial<Envelope> = {}): Envelope => makeEnvelope({ topic, key, type: 'console.Tested', ...overrides });
  const append = (envelopes: readonly Envelope[]) =>
    stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, envelopes.map((item) => ({ envelope: item })));
    });
  const api = async (path: string, init: { method?: string; body?: unknown; token?: string } = {}) => {
    const response = await fetch(new URL(path, consoleApp.url), {
      method: init.method ?? 'GET',
      headers: {
        'content-type': 'application/json',
        'x-courier-operator': 'alice',
        ...(init.token !== undefined ? { authorization: `Bearer ${init.token}` } : {}),
      },
      ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
    });
    return { status: response.status, body: (await response.json().catch(() => null)) as Record<string, unknown> };
  };

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    await stores.inbox.ensureSchema?.();
  });
  afterAll(async () => {
    await consoleApp?.stop();
    const sql = (text: string) => stores.orm.em.getConnection().execute(text);
    for (const table of ['outbox', 'inbox', 'outbox_halts', 'inbox_halts', 'inbox_parked', 'meta']) await sql(`DROP TABLE IF EXISTS ${prefix}${table} CASCADE`).catch(() => undefined);
    await stores?.close();
  });

  it('groups, token, read-only, audit, replay once, resume', async () => {
    const poison = [envelope('a'), envelope('b'), envelope('c')];
    const other = envelope('d', { type: 'console.Other' });
    const head = envelope('h');
    await append([...poison, other, head]);
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    const seqOf = (item: Envelope) => batch.records.find((record) => record.envelope.messageId === item.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [
      // The same failure with different ids in the text: one group after normalisation.
      ...poison.map((item, index) => ({ sequence: seqOf(item), error: `TransportError [PUBLISH_UNROUTABLE]: no queue bound for order ${1000 + index}`, outcome: 'dead' as const })),
      { sequence: seqOf(other), error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'dead' },
      { sequence: seqOf(head), error: 'TransportError [PUBLISH_REJECTED]: poison head', outcome: 'halt' },
    ]);
    await append([envelope('h')]);

    consoleApp = await startConsole(['--token', TOKEN], env);
    expect(consoleApp.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/$/);

    const info = await api('/api/info');
    expect(info.body).toMatchObject({ readOnly: false });

    // The same groups as `courier dead groups --json`: one implementation.
    const groups = await api('/api/groups');
    expect(groups.status).toBe(200);
    const list = groups.body['groups'] as { id: string; count: number; code: string; members: { ref: string }[] }[];
    const cliGroups = JSON.parse((await runCli(['dead', 'groups', '--json'], env)).stdout) as { id: string; count: number; refs: string[] }[];
    expect(list.map((group) => [group.id, group.count, group.members.map((member) => member.ref)])).toEqual(cliGroups.map((group) => [group.id, group.count, group.refs]));
    const group = list.find((candidate) => candidate.code === 'PUBLISH_UNROUTABLE')!;
    expect(group.count).toBe(3);
    const refs = group.members.map((member) => member.ref);
    expect(refs.sort()).toEqual(poison.map((item) => `outbox:${seqOf(item)}`).sort());

    const detail = await api(`/api/dead/${encodeURIComponent(refs[0]!)}`);
    expect(detail.status).toBe(200);
    expect(detail.body).toMatchObject({ ref: refs[0], envelope: { topic } });
    // `courier dead show`'s lookup: an unknown ref is a 404, a malformed one a 400.
    expect((await api(`/api/dead/${encodeURIComponent('outbox:999999')}`)).status).toBe(404);
    expect((await api(`/api/dead/${encodeURIComponent('nonsense')}`)).status).toBe(400);

    // The failed-messages list pages through `courier dead list`'s own function: walked two at
    // a time it shows what the CLI lists, in the same order; a bad cursor or limit is a 400.
    const walked: string[] = [];
    const totals: (number | null)[] = [];
    let after: string | null = null;
    for (let round = 0; round < 10; round += 1) {
      const listed = await api(`/api/dead?limit=2${after !== null ? `&after=${encodeURIComponent(after)}` : ''}`);
      expect(listed.status).toBe(200);
      walked.push(...(listed.body['items'] as { ref: string }[]).map((item) => item.ref));
      // The M of "N of M shown": the CLI's count (outbox dead rows and parked heads here).
      totals.push(listed.body['total'] as number | null);
      after = listed.body['next'] as string | null;
      if (after === null) break;
    }
    expect(after).toBeNull();
    const cliListed = JSON.parse((await runCli(['dead', 'list', '--json'], env)).stdout) as { ref: string }[];
    expect(walked).toEqual(cliListed.map((item) => item.ref));
    expect(walked.length).toBeGreaterThanOrEqual(4);
    expect(new Set(totals)).toEqual(new Set([walked.length]));
    expect((await api('/api/dead?after=nonsense')).status).toBe(400);
    expect((await api('/api/dead?limit=0')).status).toBe(400);

    // No token, a wrong token, a foreign Host: refused, nothing changed.
    expect((await api('/api/dead/replay', { method: 'POST', body: { refs } })).status).toBe(401);
    expect((await api('/api/dead/replay', { method: 'POST', body: { refs }, token: 'wrong' })).status).toBe(401);
    // fetch may not set Host: a plain request as a rebinding page's would arrive.
    const foreign = await new Promise<number>((resolve, reject) => {
      request(new URL('/api/groups', consoleApp.url), { headers: { host: 'evil.example:80' } }, (response) => {
        response.resume();
        resolve(response.statusCode ?? 0);
      })
        .on('error', reject)
        .end();
    });
    expect(foreign).toBe(421);
    expect(await stores.outbox.stats()).toMatchObject({ dead: 4, pending: 1, haltedKeys: 1 });
    expect(consoleApp.stdout()).toMatch(/"operator":"alice".*"action":"replay".*"refused"/);

    const replayed = await api('/api/dead/replay', { method: 'POST', body: { refs, group: group.id }, token: TOKEN });
    expect(replayed.status, JSON.stringify(replayed.body)).toBe(200);
    expect(replayed.body).toMatchObject({ requested: 3, outbox: 3, transport: 0, alreadyChanged: 0 });
    // A second click (or a second operator) with the same page: nothing replayed twice.
    const again = await api('/api/dead/replay', { method: 'POST', body: { refs, group: group.id }, token: TOKEN });
    expect(again.body).toMatchObject({ requested: 3, outbox: 0, alreadyChanged: 3 });
    expect(await stores.outbox.stats()).toMatchObject({ dead: 1, pending: 4, haltedKeys: 1 });
    const [row] = (await stores.orm.em.getConnection().execute(`SELECT count(*)::int AS count FROM ${prefix}outbox WHERE message_id IN (${poison.map((item) => `'${item.messageId}'`).join(', ')})`)) as { count: number }[];
    expect(row?.count).toBe(3); // replayed in place: no copies

    const halted = await api('/api/halted');
    const keys = halted.body['keys'] as { consumer: string | null; topic: string; key: string; held: number }[];
    expect(keys).toEqual([expect.objectContaining({ consumer: null, topic, key: 'h', held: 1 })]);
    const resumed = await api('/api/halted/resume', { method: 'POST', body: { consumer: null, topic, key: 'h', action: 'retry' }, token: TOKEN });
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(await stores.outbox.stats()).toMatchObject({ haltedKeys: 0 });
    expect(consoleApp.stdout()).toMatch(/"operator":"alice".*"action":"resume"/);

    const stats = await api('/api/stats');
    expect(stats.body['stats']).toMatchObject({ outbox: { dead: 1, haltedKeys: 0 } });
    expect((stats.body['history'] as unknown[]).length).toBeGreaterThan(0);
    await consoleApp.stop();

    // Read-only: a token does not help; without any token the console is read-only too.
    for (const args of [['--token', TOKEN, '--read-only'], []]) {
      consoleApp = await startConsole(args, env);
      expect((await api('/api/info')).body).toMatchObject({ readOnly: true });
      const refused = await api('/api/dead/purge', { method: 'POST', body: { refs: [`outbox:${seqOf(other)}`] }, token: TOKEN });
      expect(refused.status).toBe(403);
      expect(await stores.outbox.stats()).toMatchObject({ dead: 1 });
      await consoleApp.stop();
    }
  });
});
