// Outbox dead rows keep their error code and error class (schema version 5), so the runbook's
// `courier dead replay --all --code PUBLISH_UNROUTABLE` selects by the stored code, through the
// compiled binary on PostgreSQL. Rows dead-lettered before version 5 have no stored code: their
// code is read from the relay's `Name [CODE]: message` text, and only from there.
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import type { Envelope } from '@courier/core';
import type { EntityManager } from '@mikro-orm/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup } from './support/setup.js';

describe('courier dead --code on stored codes (postgresql)', () => {
  const prefix = `clic${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: 'postgresql', CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;

  beforeAll(async () => {
    stores = await openStores('postgresql', prefix);
    await stores.outbox.ensureSchema();
    await stores.inbox.ensureSchema();
  });
  afterAll(async () => {
    await stores?.close();
  });

  it('replay --all --code takes rows by their stored code, old rows by the code in their text, and never a code quoted inside a message', async () => {
    const [stored, legacy, quoted, other] = [0, 1, 2, 3].map(() => makeEnvelope({ topic, key: null, type: 'cli.Placed' })) as [Envelope, Envelope, Envelope, Envelope];
    await stores.orm.em.fork().transactional(async (em: EntityManager) => {
      stores.outbox.append(em, [stored, legacy, quoted, other].map((envelope) => ({ envelope })));
    });
    const batch = await stores.outbox.claim({ owner: 'test', limit: 100, leaseMs: 60_000, perKey: 1 });
    const seqOf = (item: Envelope) => batch.records.find((record) => record.envelope.messageId === item.messageId)!.sequence;
    await stores.outbox.fail(batch.lease, [
      // As the relay records it: the code in its own column, whatever the text says.
      { sequence: seqOf(stored), error: "no queue bound for routing key 'order-17'", outcome: 'dead', code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' },
      // As a v4 store left it: no code column value, the relay's text.
      { sequence: seqOf(legacy), error: 'TransportError [PUBLISH_UNROUTABLE]: no queue bound', outcome: 'dead' },
      // A broker message that quotes a code is not that code.
      { sequence: seqOf(quoted), error: 'broker said: [PUBLISH_UNROUTABLE] is not our problem', outcome: 'dead', code: 'PUBLISH_REJECTED', errorName: 'TransportError' },
      { sequence: seqOf(other), error: 'TransportError [PAYLOAD_TOO_LARGE]: 300000 bytes', outcome: 'dead', code: 'PAYLOAD_TOO_LARGE', errorName: 'TransportError' },
    ]);

    const shown = await runCli(['dead', 'show', `outbox:${seqOf(stored)}`], env);
    expect(shown.code, shown.stderr).toBe(0);
    const [item] = JSON.parse(shown.stdout) as { code: string; errorName: string; firstFailedAt: string; parkedAt: string }[];
    expect(item).toMatchObject({ code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' });
    expect(Date.parse(item!.firstFailedAt)).toBeLessThanOrEqual(Date.parse(item!.parkedAt));

    const dry = await runCli(['dead', 'replay', '--all', '--code', 'PUBLISH_UNROUTABLE', '--dry-run'], env);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toContain('would replay 2 message(s)');
    const replayed = await runCli(['dead', 'replay', '--all', '--code', 'PUBLISH_UNROUTABLE', '--yes'], env);
    expect(replayed.code, replayed.stderr).toBe(0);
    expect(replayed.stdout).toContain('replayed 2 outbox row(s)');
    const left = await stores.outbox.listDead({ topic });
    expect(left.map((row) => row.envelope.messageId).sort()).toEqual([quoted.messageId, other.messageId].sort());
  });
});
