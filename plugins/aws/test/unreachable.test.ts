// An SQS endpoint that does not answer: publish and subscribe reject with a retriable
// TransportError (the relay pauses, the bus retries subscribe) instead of hanging.
import { createServer } from 'node:net';
import { TransportError } from '@courier/core';
import { makeEnvelope } from '@courier/conformance';
import { describe, expect, it } from 'vitest';
import { SqsTransport } from '../src/index.js';
import { TEST_CONFIG, sqsClient } from './support/fixture.js';

/** A loopback port nothing listens on (taken, then released). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('unreachable endpoint', () => {
  it('publish and subscribe reject with a retriable TransportError', async () => {
    const client = sqsClient(`http://127.0.0.1:${await closedPort()}`);
    const transport = new SqsTransport({ client, prefix: 'unreachable-', ...TEST_CONFIG });
    const published = await transport.publish([makeEnvelope()]).catch((error: unknown) => error);
    expect(published).toBeInstanceOf(TransportError);
    expect((published as TransportError).retriable).toBe(true);
    const subscribed = await transport.subscribe({ consumer: 'c', topics: ['t'], ordered: false, concurrency: 1 }, async () => undefined).catch((error: unknown) => error);
    expect(subscribed).toBeInstanceOf(TransportError);
    expect((subscribed as TransportError).retriable).toBe(true);
    await transport.close();
    client.destroy();
  });
});
