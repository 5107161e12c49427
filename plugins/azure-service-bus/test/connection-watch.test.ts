// The disconnect watch reads an SDK internal (`_connectionContext.connection`). A release that
// renamed it would leave the transport with its fallback only: an operation that fails on the
// connection or misses its deadline reports the client lost. These cases take the field away
// (the one reader, `sdkConnection.of`, answers nothing) and hold the fallback to the same
// promise as the watch: sending and receiving resume well before the SDK's own 60 s, through
// a replaced client. The first case is the canary: it fails when the pinned SDK moves the field.
import { ServiceBusClient } from '@azure/service-bus';
import type { Delivery } from '@courier/core';
import { CONNECTIVITY_CODES, CourierError } from '@courier/core';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { sdkConnection } from '../src/client-source.js';
import type { ServiceBusTransport } from '../src/index.js';
import { createServiceBusFixture } from './support/fixture.js';
import { cleanupNamespace, REAL_CONNECTION_STRING, skipOnRealNamespace } from './support/namespace.js';
import { standIn, standInConnectionString } from './support/standin-server.js';

afterAll(cleanupNamespace);

/** Recovery by the SDK alone waits out its fixed 60 s operation timeout; the fallback must be far quicker. */
const PROMPT_MS = 30_000;

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

const fixtureFor = async () => {
  const fixture = await createServiceBusFixture({ testId: uniqueId() });
  closers.push(() => fixture.close());
  return fixture;
};

const generationOf = (transport: unknown): number => (transport as ServiceBusTransport).source.current.generation;

describe('the SDK connection field the disconnect watch reads', () => {
  it('is where @azure/service-bus 7.9 keeps it (if this fails, the SDK moved it: recovery then rests on the fallback below)', async () => {
    const client = new ServiceBusClient(REAL_CONNECTION_STRING ?? standInConnectionString((await standIn()).port));
    try {
      expect(sdkConnection.of(client)).toBeDefined();
    } finally {
      await client.close();
    }
  });

  it('leads to the socket `close()` destroys when it abandons a client (if this fails, an abandoned close can keep a process alive for the SDK\'s timeouts again)', async () => {
    const client = new ServiceBusClient(REAL_CONNECTION_STRING ?? standInConnectionString((await standIn()).port));
    try {
      expect(sdkConnection.destroySocket(client), 'no socket before the client connected').toBe(false);
      // Any operation opens the AMQP connection; whether the entity exists does not matter.
      const sender = client.createSender(`canary-${uniqueId()}`);
      await sender.createMessageBatch().catch(() => undefined);
      const disconnected = new Promise<void>((resolve) => sdkConnection.of(client)?.once('disconnected', () => resolve()));
      expect(sdkConnection.destroySocket(client)).toBe(true);
      await expect(Promise.race([disconnected.then(() => 'disconnected'), new Promise((resolve) => setTimeout(() => resolve('no disconnect within 10 s'), 10_000))])).resolves.toBe('disconnected');
    } finally {
      await client.close().catch(() => undefined);
    }
  });
});

describe.skipIf(skipOnRealNamespace('the outage cuts the fixture\'s proxies'))('without the SDK connection field (no disconnect watch: failed and late operations alone)', () => {
  beforeEach(() => {
    vi.spyOn(sdkConnection, 'of').mockReturnValue(undefined);
  });
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('publish rejects retriably during an outage and sends again soon after it, on a replaced client', async () => {
    const fixture = await fixtureFor();
    const topic = 'orders.placed';
    const seen: string[] = [];
    const consumer = await fixture.connect();
    await consumer.subscribe({ consumer: 'watchless-publish', topics: [topic], ordered: false, concurrency: 2 }, async (delivery: Delivery) => {
      seen.push(delivery.envelope.messageId);
      await delivery.ack();
    });
    const before = makeEnvelope({ topic, key: 'k' });
    expect((await fixture.transport.publish([before]))[0]?.ok).toBe(true);
    await eventually(() => expect(seen).toContain(before.messageId), { timeoutMs: 10_000 });
    expect(sdkConnection.of).toHaveBeenCalled();
    await fixture.outage!.begin();
    let failure: unknown;
    try {
      await fixture.transport.publish([makeEnvelope({ topic, key: 'k' })]);
    } catch (error) {
      failure = error;
    } finally {
      await fixture.outage!.end();
    }
    expect(failure).toBeInstanceOf(CourierError);
    expect((failure as CourierError).retriable).toBe(true);
    expect(CONNECTIVITY_CODES).toContain((failure as CourierError).code);
    const endedAt = Date.now();
    const after = makeEnvelope({ topic, key: 'k' });
    await eventually(async () => expect((await fixture.transport.publish([after]))[0]?.ok).toBe(true), { timeoutMs: PROMPT_MS, intervalMs: 200 });
    await eventually(() => expect(seen).toContain(after.messageId), { timeoutMs: PROMPT_MS });
    const took = Date.now() - endedAt;
    console.log(`[azure-service-bus] no watch: published and received ${took} ms after the outage ended`);
    expect(took, 'recovery took about the SDK\'s 60 s operation timeout').toBeLessThan(PROMPT_MS);
    expect(generationOf(fixture.transport), 'the publisher\'s client was not replaced').toBeGreaterThan(0);
    expect(generationOf(consumer), 'the consumer\'s client was not replaced').toBeGreaterThan(0);
  }, 120_000);

  for (const ordered of [true, false]) {
    it(`a consumer-only transport (${ordered ? 'ordered: waiting for a session' : 'unordered: receiving'}) cut off receives again soon after the outage, on a replaced client`, async () => {
      const fixture = await fixtureFor();
      const topic = 'orders.placed';
      const seen: string[] = [];
      const consumer = await fixture.connect();
      await consumer.subscribe({ consumer: `watchless-${ordered ? 'ordered' : 'unordered'}`, topics: [topic], ordered, concurrency: 2 }, async (delivery: Delivery) => {
        seen.push(delivery.envelope.messageId);
        await delivery.ack();
      });
      const before = makeEnvelope({ topic, key: 'k' });
      expect((await fixture.transport.publish([before]))[0]?.ok).toBe(true);
      await eventually(() => expect(seen).toContain(before.messageId), { timeoutMs: 10_000 });
      await fixture.outage!.begin();
      // The outage's length, part of the scenario: begin() has already cut every connection,
      // and the replaced client is checked below whatever a loaded machine lets the consumer
      // see of the outage; the constant only sets how long new connections are refused.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      await fixture.outage!.end();
      const endedAt = Date.now();
      const after = makeEnvelope({ topic, key: 'k' });
      await eventually(async () => expect((await fixture.transport.publish([after]))[0]?.ok).toBe(true), { timeoutMs: PROMPT_MS, intervalMs: 200 });
      await eventually(() => expect(seen).toContain(after.messageId), { timeoutMs: PROMPT_MS });
      const took = Date.now() - endedAt;
      console.log(`[azure-service-bus] no watch, ${ordered ? 'ordered' : 'unordered'} consumer: received ${took} ms after the outage ended`);
      expect(took, 'recovery took about the SDK\'s 60 s operation timeout').toBeLessThan(PROMPT_MS);
      expect(generationOf(consumer), 'the consumer\'s client was not replaced').toBeGreaterThan(0);
    }, 120_000);
  }
});
