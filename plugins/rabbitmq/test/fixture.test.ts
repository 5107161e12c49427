import type { TransportFixture } from '@courier/conformance';
import { TransportError } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import type { RabbitMqTransport } from '../src/index.js';
import { deleteTopology, eventually, existingQueues, testId } from './support/broker.js';
import { createRabbitMqFixture } from './support/fixture.js';

// The conformance fixture is test support, but the bus suite's broker-restart verdict
// rests on its outage: these cases pin what it promises.
const fixtures: TransportFixture[] = [];
afterEach(async () => {
  for (const fixture of fixtures.splice(0)) await fixture.close();
});

async function networkFixture(): Promise<TransportFixture> {
  const fixture = await createRabbitMqFixture({ testId: testId() }, { outage: 'network' });
  fixtures.push(fixture);
  return fixture;
}

const endpoint = { consumer: 'c', topics: ['t'], ordered: false } as const;

describe('RabbitMQ fixture outage', () => {
  it('also cuts a connection whose handshake was in flight when the outage began, and lets it reconnect after', async () => {
    const fixture = await networkFixture();
    const transport = fixture.transport as RabbitMqTransport;
    // The first use connects: the factory has passed its checks and the handshake is on the wire.
    const opening = transport.provision(endpoint);
    await fixture.outage!.begin();
    const error = await opening.then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error, 'a connection completed in the middle of the outage').toBeInstanceOf(TransportError);
    expect(transport.connected).toBe(false);
    await fixture.outage!.end();
    await eventually(() => expect(transport.connected).toBe(true));
    await transport.provision(endpoint);
  });

  it('keeps a killed transport from connecting through a handshake already in flight', async () => {
    const fixture = await networkFixture();
    const transport = (await fixture.connect()) as RabbitMqTransport;
    const opening = transport.provision(endpoint);
    await fixture.kill(transport);
    const error = await opening.then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error, 'a killed transport connected').toBeInstanceOf(TransportError);
    expect(transport.connected).toBe(false);
  });
});

describe('RabbitMQ fixture close', () => {
  it('deletes the queues of a consumer the test only provisioned', async () => {
    // Left behind, they stay on the shared broker for good: durable quorum queues, unbound
    // once the close deletes the prefix's exchange.
    const id = testId();
    const fixture = await createRabbitMqFixture({ testId: id }, { outage: 'network' });
    const transport = fixture.transport as RabbitMqTransport;
    const names = transport.names(endpoint.consumer);
    const queues = [names.queue, names.deadLetterQueue, ...names.retryQueues.map((tier) => tier.name)];
    try {
      await transport.provision(endpoint);
      expect(await existingQueues(queues)).toEqual(queues);
      await fixture.close();
      expect(await existingQueues(queues), 'queues left on the broker after the fixture closed').toEqual([]);
    } finally {
      await deleteTopology(`courier-${id}`, [endpoint.consumer]);
    }
  });
});
