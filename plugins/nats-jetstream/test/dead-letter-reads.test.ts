// Operator commands never create anything (issue 35): reading, replaying or purging the
// dead letters of a prefix nothing was ever published to leaves the server as it was, with
// no `<prefix>_MSG`, `_DLQ` or `_LEASE` stream; the streams appear with the first publish.
// Before, every dead-letter call connected, and connecting declared the three streams.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { afterEach, describe, expect, it } from 'vitest';
import { NatsJetStreamTransport } from '../src/index.js';
import { natsUrl } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** The names of the prefix's streams that exist on the server. */
async function streamsOf(jsm: JetStreamManager, prefix: string): Promise<string[]> {
  const found: string[] = [];
  for (const name of [`${prefix}_MSG`, `${prefix}_DLQ`, `${prefix}_LEASE`]) {
    const info = await jsm.streams.info(name).catch((error: unknown) => {
      if (/stream not found/i.test(String(error))) return undefined;
      throw error;
    });
    if (info) found.push(name);
  }
  return found;
}

describe('dead-letter reads on a prefix with no streams', () => {
  it('list, replay and purge create no stream and find nothing; the first publish creates them', async () => {
    const prefix = `dlr_${uniqueId().replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 24)}`;
    const admin: NatsConnection = await connect({ servers: natsUrl, timeout: 5_000 });
    closers.push(() => admin.close());
    const jsm = await jetstreamManager(admin);
    closers.push(async () => {
      for (const name of await streamsOf(jsm, prefix)) await jsm.streams.delete(name);
    });
    const transport = new NatsJetStreamTransport({ prefix, connection: () => connect({ servers: natsUrl, timeout: 5_000 }) });
    closers.push(() => transport.close());
    expect(await streamsOf(jsm, prefix)).toEqual([]);

    expect(await transport.deadLetters!.list('payments')).toEqual([]);
    expect(await transport.deadLetters!.list('payments', { limit: 5 })).toEqual([]);
    expect(await transport.deadLetters!.replay('payments', ['1', '2'])).toBe(0);
    expect(await transport.deadLetters!.purge('payments', ['1'])).toBe(0);
    expect(await streamsOf(jsm, prefix)).toEqual([]);

    // Publishing still declares them (on the connection the reads opened).
    const [result] = await transport.publish([makeEnvelope({ topic: `${prefix}.orders` })]);
    expect(result!.ok).toBe(true);
    expect(await streamsOf(jsm, prefix)).toEqual([`${prefix}_MSG`, `${prefix}_DLQ`, `${prefix}_LEASE`]);
    expect(await transport.deadLetters!.list('payments')).toEqual([]);
  }, 30_000);
});
