// An SQS endpoint that does not answer: publish and subscribe reject with a retriable
// TransportError (the relay pauses, the bus retries subscribe) instead of hanging.
import { createServer } from 'node:net';
import { TransportError } from '@courier/core';
import { makeEnvelope } from '@courier/conformance';
import { describe, expect, it } from 'vitest';
import { SqsTransport } from '../src/index.js';
import { TcpProxy, targetOf } from '@courier/conformance';
import { TEST_CONFIG, onRealAws, sqsClient, sqsEndpoint, waitForSqs } from './support/fixture.js';

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

// The SIGKILLed-worker cases of the bus suite start fresh processes on a loaded machine; their
// check that the SQS server answers was one TCP connect, and failed the case whenever that
// one attempt was refused or timed out. It waits for the server now.
describe.skipIf(onRealAws)('waiting for the SQS server', () => {
  it('waits until a server that comes up late answers', async () => {
    await using proxy = await TcpProxy.create(targetOf(sqsEndpoint, 9324));
    const opening = setTimeout(() => void proxy.open(), 1_500);
    try {
      await expect(waitForSqs(`http://127.0.0.1:${proxy.port}`, 30_000)).resolves.toBeUndefined();
    } finally {
      clearTimeout(opening);
    }
  });

  it('gives up after its patience, naming the endpoint and how to start ElasticMQ', async () => {
    const port = await closedPort();
    const began = Date.now();
    await expect(waitForSqs(`http://127.0.0.1:${port}`, 1_500)).rejects.toThrow(new RegExp(`no SQS server answers on http://127.0.0.1:${port} within 2s .*scripts/elasticmq.sh start`));
    expect(Date.now() - began).toBeGreaterThanOrEqual(1_000);
  });
});
