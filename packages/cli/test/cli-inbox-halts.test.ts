// `courier halted list|resume --consumer`: the inbox store's halted keys (ordered
// subscriptions with poison 'halt'), listed with their head and held count, and resumed.
import { randomBytes } from 'node:crypto';
import { makeEnvelope } from '@courier/conformance';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './support/run-cli.js';
import { openStores, type CliTestSetup, type Dialect } from './support/setup.js';

describe.each(['postgresql', 'sqlite'] as Dialect[])('courier halted --consumer against %s', (dialect) => {
  const prefix = `clih${randomBytes(4).toString('hex')}_`;
  const env = { CLI_TEST_DIALECT: dialect, CLI_TEST_PREFIX: prefix };
  const topic = `t${prefix}`;
  let stores: CliTestSetup;

  beforeAll(async () => {
    stores = await openStores(dialect, prefix);
    await stores.inbox.ensureSchema();
  });
  afterAll(async () => {
    await stores?.close();
  });

  it('lists a consumer’s halted key with its head and held count, and resumes it (once)', { timeout: 300_000 }, async () => {
    const head = makeEnvelope({ topic, key: 'k' });
    const held = makeEnvelope({ topic, key: 'k' });
    await stores.inbox.halt('billing', topic, 'k', head, 'HANDLER_FAILED: card declined');
    await stores.inbox.halt('billing', topic, 'k', held, 'later');

    const listed = await runCli(['halted', 'list', '--consumer', 'billing', '--json'], env);
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toMatchObject([{ consumer: 'billing', topic, key: 'k', held: 1, resumed: null, head: { envelope: { messageId: head.messageId } } }]);

    const missing = await runCli(['halted', 'resume', topic, 'other', '--consumer', 'billing', '--yes'], env);
    expect(missing.code).toBe(1);
    const resumed = await runCli(['halted', 'resume', topic, 'k', '--consumer', 'billing', '--park', '--yes'], env);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toContain("resumed consumer 'billing'");
    expect((await stores.inbox.listHalted({ consumer: 'billing' }))[0]?.resumed).toBe('park');
  });
});
