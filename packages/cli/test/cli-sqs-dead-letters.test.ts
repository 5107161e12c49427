// `courier dead list` on SQS through the compiled binary (ElasticMQ, COURIER_SQS_ENDPOINT): SQS
// has no peek, and receives with visibility 0 see only the first messages of a FIFO queue's
// groups (10 of 25 here), so the listing shows what it could read and says "read N of M the
// broker counts" on stderr instead of passing a partial list off as all (issue 35); nothing is
// hidden or taken by the reads; purging what is shown brings the rest into view.
import { join } from 'node:path';
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, describe, expect, it } from 'vitest';
import { SqsTransport } from '../../../plugins/aws/src/index.js';
import { PACKAGE_DIR, runCli } from './support/run-cli.js';
import { SQSClient } from './support/sqs.config.js';

const CONFIG = join(PACKAGE_DIR, 'test', 'support', 'sqs.config.ts');
const DEAD = 25;

describe('courier dead list on SQS (FIFO, ElasticMQ)', () => {
  const prefix = `${uniqueId()}-`;
  const env = { CLI_TEST_SQS_PREFIX: prefix, CLI_TEST_SQS_FIFO: '1', CLI_TEST_CONSUMERS: 'billing' };
  const client = new SQSClient({ endpoint: process.env['COURIER_SQS_ENDPOINT'] ?? 'http://127.0.0.1:9324', region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' } });
  const transport = new SqsTransport({ client, prefix, fifo: true, visibilityTimeoutSeconds: 5, waitTimeSeconds: 1 });
  afterAll(async () => {
    await transport.close();
    client.destroy();
  });

  it('lists what it can read, says read N of M, hides nothing; purging what is shown reaches all', { timeout: 300_000 }, async () => {
    const envelopes = Array.from({ length: DEAD }, (_, index) => makeEnvelope({ topic: 'orders', key: `k${index % 5}` }));
    const subscription = await transport.subscribe({ consumer: 'billing', topics: ['orders'], ordered: false, concurrency: 4 }, async (delivery) => {
      await delivery.deadLetter({ code: 'HANDLER_FAILED', message: 'refused' });
    });
    for (const result of await transport.publish(envelopes)) expect(result.ok).toBe(true);
    const deadline = Date.now() + 60_000;
    while ((await transport.deadLetters.count!('billing')) < DEAD && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 200));
    await subscription.close();
    expect(await transport.deadLetters.count!('billing')).toBe(DEAD);

    const listed = await runCli(['dead', 'list', '--json', '--limit', '1000'], env, 120_000, CONFIG);
    expect(listed.code, listed.stderr).toBe(0);
    const shown = JSON.parse(listed.stdout) as { ref: string }[];
    expect(shown.length).toBeGreaterThan(0);
    console.log(`[cli sqs] dead list showed ${shown.length} of ${DEAD}`);
    if (shown.length < DEAD) expect(listed.stderr).toContain(`courier: dead letters of 'billing': read ${shown.length} of ${DEAD} the broker counts`);
    else expect(listed.stderr).toBe('');
    // The read hid nothing: the depth is whole, and a second reader sees as much.
    expect(await transport.deadLetters.count!('billing')).toBe(DEAD);

    // Purge --all acts on what it read, says so, and a few rounds reach every dead letter.
    const seen = new Set<string>();
    for (let round = 0; round < 10 && seen.size < DEAD; round += 1) {
      const purged = await runCli(['dead', 'purge', '--all', '--yes'], env, 120_000, CONFIG);
      expect(purged.code, purged.stderr).toBe(0);
      const count = Number(/purged 0 outbox row\(s\), 0 parked consumer head\(s\) and (\d+) transport dead letter\(s\)/.exec(purged.stdout)?.[1]);
      expect(count, purged.stdout).toBeGreaterThan(0);
      for (const match of purged.stdout.matchAll(/dlq:billing:(\S+)/g)) {
        expect(seen.has(match[1]!), 'purged twice').toBe(false);
        seen.add(match[1]!);
      }
    }
    expect(seen.size).toBe(DEAD);
    expect(await transport.deadLetters.count!('billing')).toBe(0);
  });
});
