// A consumer's head parked by `courier halted resume --consumer … --park` is a dead letter for
// the CLI: `dead list`, `show` and `groups` show it (consumer, error, parkedAt); `replay` makes
// it the head of a resumed halt of its key, which a running consumer instance drains (it runs
// once, also when two operators replay it at once); `purge` deletes it (issue 35: both were
// refused with exit 2 while the inbox store could only list parked heads).
import { randomBytes } from 'node:crypto';
import { eventually, makeEnvelope } from '@courier/conformance';
import { createBus, defineMessage, InMemoryBroker, type Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

describe('courier dead: parked consumer heads against postgresql', () => {
  const prefix = `clipk${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;
  let head: Envelope;
  let ref: string;

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    await stores.inbox.ensureSchema();
    // Halt a key of consumer 'billing', resume it with --park through the binary, then drain
    // it as a running consumer instance would (claim, settle the head as parked).
    head = makeEnvelope({ topic, key: 'k', type: `${prefix}.Charge` });
    ref = `parked:billing:${head.messageId}`;
    await stores.inbox.halt('billing', topic, 'k', head, 'HANDLER_FAILED: card 4242 declined');
    const resumed = await runCli(['halted', 'resume', topic, 'k', '--consumer', 'billing', '--park', '--yes'], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toContain(ref);
    const claim = await stores.inbox.claimResumed('billing', 'test-drainer', 30_000);
    expect(claim).toMatchObject({ action: 'park', head: { envelope: { messageId: head.messageId } } });
    expect(await stores.inbox.settleHead('billing', topic, 'k', 'test-drainer', { parked: true })).toBe(true);
    expect(await stores.inbox.lift('billing', topic, 'k', 'test-drainer')).toBe(true);
    expect(await stores.inbox.listParked({ consumer: 'billing' })).toHaveLength(1);
  }, 300_000);
  afterAll(async () => {
    await stores?.close();
  });

  it('dead list shows the parked head with its consumer, code, error and parkedAt', { timeout: 300_000 }, async () => {
    const listed = await runCli(['dead', 'list', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { ref: string; parkedAt: string }[];
    expect(items).toMatchObject([{ ref, source: 'inbox', state: 'parked', consumer: 'billing', code: 'HANDLER_FAILED', error: 'card 4242 declined', attempts: null, envelope: { messageId: head.messageId, topic } }]);
    expect(Math.abs(Date.parse(items[0]!.parkedAt) - Date.now())).toBeLessThan(10 * 60_000);
    // stats counts it per consumer, as it counts halted keys.
    const stats = await runCli(['stats', '--json'], env);
    expect(stats.code, stats.stderr).toBe(0);
    expect(JSON.parse(stats.stdout).parkedHeads).toEqual([{ consumer: 'billing', parked: 1 }]);

    const text = await runCli(['dead', 'list'], env);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(new RegExp(`${ref}\\s+parked\\s+${topic}`));

    // The filters apply to parked heads like to every other dead letter.
    expect(JSON.parse((await runCli(['dead', 'list', '--source', 'inbox', '--consumer', 'billing', '--code', 'HANDLER_FAILED', '--json'], env)).stdout)).toHaveLength(1);
    for (const narrowed of [
      ['--source', 'outbox'],
      ['--source', 'transport'],
      ['--consumer', 'shipping'],
      ['--code', 'OTHER'],
      ['--older-than', '1h'],
    ]) {
      const result = await runCli(['dead', 'list', ...narrowed, '--json'], env);
      expect(result.code, `${narrowed.join(' ')}: ${result.stderr}`).toBe(0);
      expect(JSON.parse(result.stdout), narrowed.join(' ')).toEqual([]);
    }
  });

  it('dead show prints the parked head in full; an unknown parked ref is not found (exit 1)', { timeout: 300_000 }, async () => {
    const shown = await runCli(['dead', 'show', ref], env);
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout)).toMatchObject([{ ref, consumer: 'billing', error: 'card 4242 declined', envelope: { messageId: head.messageId, payload: head.payload } }]);
    const missing = await runCli(['dead', 'show', 'parked:billing:no-such-message'], env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("no dead letter 'parked:billing:no-such-message'");
  });

  it('dead groups counts the parked head under its consumer and code; --group selects it', { timeout: 300_000 }, async () => {
    const grouped = await runCli(['dead', 'groups', '--json'], env);
    expect(grouped.code, grouped.stderr).toBe(0);
    const groups = JSON.parse(grouped.stdout) as { id: string }[];
    expect(groups).toMatchObject([{ count: 1, type: head.type, code: 'HANDLER_FAILED', consumer: 'billing', refs: [ref] }]);
    const members = await runCli(['dead', 'list', '--group', groups[0]!.id, '--json'], env);
    expect(JSON.parse(members.stdout)).toMatchObject([{ ref }]);
  });

  /** Parks a new head of `key` as the beforeAll does: halt, resume --park through the binary, drain as a consumer instance. */
  async function parkHead(key: string): Promise<Envelope> {
    const parked = makeEnvelope({ topic, key, type: `${prefix}.Charge` });
    await stores.inbox.halt('billing', topic, key, parked, 'HANDLER_FAILED: card declined');
    const resumed = await runCli(['halted', 'resume', topic, key, '--consumer', 'billing', '--park', '--yes'], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(await stores.inbox.claimResumed('billing', 'test-drainer', 30_000)).toMatchObject({ key, action: 'park' });
    expect(await stores.inbox.settleHead('billing', topic, key, 'test-drainer', { parked: true })).toBe(true);
    expect(await stores.inbox.lift('billing', topic, key, 'test-drainer')).toBe(true);
    return parked;
  }

  it('replay of a parked head: two operators at once replay it once; a running consumer runs it once and lifts the halt', { timeout: 300_000 }, async () => {
    const parked = await parkHead('k-replay');
    const replayRef = `parked:billing:${parked.messageId}`;
    const dryRun = await runCli(['dead', 'replay', replayRef, '--dry-run'], env);
    expect(dryRun.code, dryRun.stderr).toBe(0);
    expect(dryRun.stdout).toContain('dry run: would replay 1 message(s); nothing changed');
    expect((await stores.inbox.listParked({ consumer: 'billing' })).map((entry) => entry.envelope.messageId)).toContain(parked.messageId);

    const both = await Promise.all([runCli(['dead', 'replay', replayRef, '--yes'], env), runCli(['dead', 'replay', replayRef, '--yes'], env)]);
    const replayed = both.filter((result) => result.code === 0 && result.stdout.includes('replayed 0 outbox row(s), 1 parked consumer head(s) and 0 transport dead letter(s)'));
    expect(replayed, JSON.stringify(both)).toHaveLength(1);
    // The other found it gone: not found (exit 1), or gone between its read and its change.
    const other = both.find((result) => result !== replayed[0])!;
    expect(other.code === 1 || other.stderr.includes('1 of 1 had already changed'), JSON.stringify(other)).toBe(true);
    expect(replayed[0]!.stdout).toContain('run once a running instance of their consumer drains them');
    expect((await stores.inbox.listParked({ consumer: 'billing' })).map((entry) => entry.envelope.messageId)).not.toContain(parked.messageId);
    expect((await stores.inbox.listHalted({ consumer: 'billing' })).filter((halt) => halt.key === 'k-replay')).toMatchObject([
      { resumed: 'retry', head: { envelope: { messageId: parked.messageId } } },
    ]);

    // A consumer instance of 'billing' (ordered, poison 'halt') drains the resumed key.
    const Charge = defineMessage(`${prefix}.Charge`, { version: 1, topic });
    const broker = new InMemoryBroker();
    const bus = createBus({ outbox: stores.outbox, inbox: stores.inbox, transport: broker.connect() });
    const runs: string[] = [];
    bus.subscribe('billing', Charge, async (message) => void runs.push(message.messageId), { ordered: true, poison: 'halt' });
    await bus.start({ relay: false });
    try {
      await eventually(async () => expect((await stores.inbox.listHalted({ consumer: 'billing' })).filter((halt) => halt.key === 'k-replay')).toEqual([]), { timeoutMs: 60_000 });
      expect(runs).toEqual([parked.messageId]);
    } finally {
      await bus.stop();
      await broker.close();
    }
  });

  it('purge of a parked head by reference deletes it; the same reference again is not found (exit 1)', { timeout: 300_000 }, async () => {
    const parked = await parkHead('k-purge');
    const purgeRef = `parked:billing:${parked.messageId}`;
    const purged = await runCli(['dead', 'purge', purgeRef, '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(purged.stdout).toContain('purged 0 outbox row(s), 1 parked consumer head(s) and 0 transport dead letter(s)');
    expect((await stores.inbox.listParked({ consumer: 'billing' })).map((entry) => entry.envelope.messageId)).not.toContain(parked.messageId);
    const again = await runCli(['dead', 'purge', purgeRef, '--yes'], env);
    expect(again.code, again.stdout).toBe(1);
  });

  it('with an outbox dead row beside it: a bulk purge purges the row and the head', { timeout: 300_000 }, async () => {
    const row = makeEnvelope({ topic, key: null, type: `${prefix}.Placed` });
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, [{ envelope: row }]);
    });
    const batch = await stores.outbox.claim({ owner: 'test', limit: 10, leaseMs: 60_000, perKey: 1 });
    const sequence = batch.records.find((record) => record.envelope.messageId === row.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [{ sequence, error: 'TransportError [PUBLISH_UNROUTABLE]: no queue bound', outcome: 'dead' }]);

    const listed = JSON.parse((await runCli(['dead', 'list', '--json'], env)).stdout) as { ref: string }[];
    expect(listed.map((item) => item.ref)).toEqual([`outbox:${sequence}`, ref]);

    const purged = await runCli(['dead', 'purge', '--all', '--yes'], env);
    expect(purged.code, purged.stderr).toBe(0);
    expect(purged.stdout).toContain('purged 1 outbox row(s), 1 parked consumer head(s) and 0 transport dead letter(s)');
    expect((await stores.outbox.stats()).dead).toBe(0);
    expect(await stores.inbox.listParked({ consumer: 'billing' })).toEqual([]);
  });

  it('--help of halted resume says where a parked consumer head goes', { timeout: 300_000 }, async () => {
    const help = await runCli(['halted', 'resume', '--help'], env);
    expect(help.code).toBe(0);
    expect(help.stdout.replace(/\s+/g, ' ')).toContain('a consumer\'s is kept by the inbox store as a parked head (parked:<consumer>:<messageId>)');
  });
});
