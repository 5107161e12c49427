// `courier dead list` a page at a time through the compiled binary on PostgreSQL: dead outbox
// rows and consumers' parked heads walked with --limit / --after, while messages are replayed
// between pages (some already shown, some not yet): every message that stayed parked is
// shown exactly once, in order, and the walk ends (issue 35: the listing read everything on
// every call and paged by position, so a replay between pages shifted the rest).
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

const LEASE = { leaseMs: 60_000, perKey: 1 } as const;

describe('courier dead list pages with a cursor (postgresql)', () => {
  const prefix = `clipg${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;
  const deadRefs: string[] = [];
  const parkedRefs: string[] = [];
  const sequenceOf = new Map<string, bigint>();
  const parkedHead = new Map<string, Envelope>();

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    await stores.inbox.ensureSchema();
    const rows = Array.from({ length: 12 }, (_, index) => makeEnvelope({ topic, key: `o${index}` }));
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, rows.map((envelope) => ({ envelope })));
    });
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, ...LEASE });
    await stores.outbox.fail(batch.lease, batch.records.map((record) => ({ sequence: record.sequence, error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'dead' as const })));
    for (const record of [...batch.records].sort((a, b) => (a.sequence < b.sequence ? -1 : 1))) {
      deadRefs.push(`outbox:${record.sequence}`);
      sequenceOf.set(`outbox:${record.sequence}`, record.sequence);
    }
    // Parked consumer heads, parked one after another as a running consumer parks them.
    for (let index = 0; index < 9; index += 1) {
      const consumer = index % 2 === 0 ? 'billing' : 'shipping';
      const head = makeEnvelope({ topic, key: `p${index}` });
      await stores.inbox.halt(consumer, topic, head.key!, head, 'HANDLER_FAILED: declined');
      await stores.inbox.resumeHalted(consumer, topic, head.key!, 'park');
      expect(await stores.inbox.claimResumed(consumer, 'parker', 60_000)).toMatchObject({ key: head.key });
      expect(await stores.inbox.settleHead(consumer, topic, head.key!, 'parker', { parked: true })).toBe(true);
      expect(await stores.inbox.lift(consumer, topic, head.key!, 'parker')).toBe(true);
      const ref = `parked:${consumer}:${head.messageId}`;
      parkedRefs.push(ref);
      parkedHead.set(ref, head);
    }
  }, 300_000);
  afterAll(async () => {
    await stores?.close();
  });

  const page = async (args: readonly string[]) => {
    const result = await runCli(['dead', 'list', '--json', ...args], env);
    expect(result.code, result.stderr).toBe(0);
    const items = JSON.parse(result.stdout) as { ref: string; cursor: string }[];
    const next = /more follow: courier dead list --after (\S+) /.exec(result.stderr)?.[1] ?? null;
    return { items, next, stderr: result.stderr };
  };

  it('a walk with replays between pages shows every message that stayed parked once, in order', { timeout: 300_000 }, async () => {
    const everything = await page(['--limit', '1000']);
    expect(everything.items.map((item) => item.ref)).toEqual([...deadRefs, ...parkedRefs]);
    expect(everything.next).toBeNull();
    expect(everything.stderr).toBe('');

    const shown: string[] = [];
    const gone = new Set<string>();
    let after: string | null = null;
    for (let round = 0; round < 20; round += 1) {
      const current = await page(['--limit', '5', ...(after !== null ? ['--after', after] : [])]);
      shown.push(...current.items.map((item) => item.ref));
      // The next cursor is the last item's own: --json carries it on every item.
      if (current.next !== null) expect(current.next).toBe(current.items[current.items.length - 1]!.cursor);
      if (round === 0) {
        // Replay one row already shown and two not yet shown: the rest must not shift.
        for (const ref of [deadRefs[1]!, deadRefs[6]!, deadRefs[7]!]) gone.add(ref);
        expect(await stores.outbox.replay([deadRefs[1]!, deadRefs[6]!, deadRefs[7]!].map((ref) => sequenceOf.get(ref)!))).toBe(3);
      }
      if (round === 2) {
        // Now inside the parked heads: replay one shown, purge one not yet shown.
        const [, , shownHead] = /^parked:([^:]+):(.+)$/.exec(current.items.find((item) => item.ref.startsWith('parked:'))!.ref)!;
        const shownRef = parkedRefs.find((ref) => ref.endsWith(shownHead!))!;
        const ahead = parkedRefs[parkedRefs.length - 2]!;
        expect(shown).not.toContain(ahead);
        gone.add(shownRef).add(ahead);
        const [, shownConsumer] = /^parked:([^:]+):/.exec(shownRef)!;
        expect(await stores.inbox.replayParked(shownConsumer!, parkedHead.get(shownRef)!.messageId)).toBe('resumed');
        const [, aheadConsumer] = /^parked:([^:]+):/.exec(ahead)!;
        expect(await stores.inbox.purgeParked(aheadConsumer!, parkedHead.get(ahead)!.messageId)).toBe(true);
      }
      if (current.next === null) break;
      after = current.next;
    }
    expect(after, 'the walk ended').not.toBeNull();
    expect(new Set(shown).size, 'nothing shown twice').toBe(shown.length);
    // Everything that stayed parked was shown, in the listing's order; what left before its
    // page came was not; what left after being shown was shown once.
    const expected = [...deadRefs, ...parkedRefs].filter((ref) => !gone.has(ref) || shown.indexOf(ref) >= 0);
    expect(shown).toEqual(expected);
    for (const ref of [deadRefs[6]!, deadRefs[7]!]) expect(shown).not.toContain(ref);
    expect(shown).toContain(deadRefs[1]!);
  });

  it('filters page too; a bad cursor is a usage error (exit 2) naming it', { timeout: 300_000 }, async () => {
    const first = await page(['--source', 'inbox', '--consumer', 'billing', '--limit', '2']);
    expect(first.items.every((item) => item.ref.startsWith('parked:billing:'))).toBe(true);
    expect(first.next).not.toBeNull();
    const second = await page(['--source', 'inbox', '--consumer', 'billing', '--limit', '100', '--after', first.next!]);
    expect(second.next).toBeNull();
    const all = (await page(['--source', 'inbox', '--consumer', 'billing', '--limit', '100'])).items.map((item) => item.ref);
    expect([...first.items, ...second.items].map((item) => item.ref)).toEqual(all);

    const text = await runCli(['dead', 'list', '--limit', '1'], env);
    expect(text.code, text.stderr).toBe(0);
    // The total is counted, not read: the outbox's dead rows and the parked heads.
    const total = (await stores.outbox.stats()).dead + (await stores.inbox.countParked());
    expect(text.stderr).toMatch(new RegExp(`^courier: 1 of ${total} shown; more follow: courier dead list --after \\S+ \\(with the same filters\\)$`, 'm'));
    // A filter only a read can tell gives no total: none is guessed.
    const typed = await runCli(['dead', 'list', '--topic', topic, '--limit', '1'], env);
    expect(typed.stderr).toMatch(/^courier: 1 shown; more follow: /m);
    const outboxOnly = await runCli(['dead', 'list', '--source', 'outbox', '--limit', '2'], env);
    expect(outboxOnly.stderr).toContain(`courier: 2 of ${(await stores.outbox.stats()).dead} shown; more follow:`);
    const cursor = /--after (\S+)/.exec(outboxOnly.stderr)![1]!;
    expect((await runCli(['dead', 'list', '--source', 'outbox', '--limit', '2', '--after', cursor], env)).stderr).toMatch(/courier: 2 more of \d+ shown; more follow:/);

    for (const cursor of ['nonsense', 'outbox:1', Buffer.from('["x","1"]').toString('base64url')]) {
      const bad = await runCli(['dead', 'list', '--after', cursor], env);
      expect(bad.code, bad.stderr).toBe(2);
      expect(bad.stderr).toContain(`--after '${cursor}' is not a cursor`);
    }
  });
});
