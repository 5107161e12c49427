// JetStream stores no message whose header block is over 64 KiB. The envelope travels in
// headers, so envelope fields within the core's limits (64 user headers of 4 KiB) can pass
// it; `validate` refuses such an envelope at `publish()`, with room kept for what a retry copy
// or dead letter adds, instead of the broker refusing it later — or refusing only its dead letter.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { createJetStreamFixture } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe('header room', () => {
  it('validate refuses envelope headers JetStream would refuse, or leave no room for a dead letter; publish refuses them alone', async () => {
    const testId = uniqueId();
    const fixture = await createJetStreamFixture({ testId });
    closers.push(() => fixture.close());
    const topic = `${testId}.headers`;
    const headers = (count: number) => Object.fromEntries(Array.from({ length: count }, (_, index) => [`h${index}`, 'v'.repeat(4000)]));
    const over = makeEnvelope({ topic, headers: headers(17) });
    const tight = makeEnvelope({ topic, headers: headers(16) });
    const fine = makeEnvelope({ topic, headers: headers(14) });
    expect(fixture.transport.validate!(over)).toEqual([expect.stringMatching(new RegExp(`^envelope '${over.messageId}' encodes to \\d+ bytes of NATS headers`))]);
    expect(fixture.transport.validate!(tight)).toHaveLength(1);
    expect(fixture.transport.validate!(fine)).toEqual([]);
    const results = await fixture.transport.publish([over, fine]);
    expect(results.map((result) => (result.ok ? 'ok' : result.error.code))).toEqual(['MESSAGE_INVALID', 'ok']);
  }, 30_000);
});
