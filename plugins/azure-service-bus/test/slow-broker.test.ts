// A broker that is slow but working: every byte takes a while each way, so a fresh client's
// handshake (TCP, SASL, CBS put-token, link attach) outlasts a publish deadline. A timeout on
// a client that never answered is not a lost connection: giving that client up restarts the
// handshake, and the broker is never reached (seen: every publish timed out on a new client
// for as long as the test ran). The transport must get through, as the relay's retries would.
import { connect, createServer, type Socket } from 'node:net';
import { ServiceBusClient } from '@azure/service-bus';
import { CourierError } from '@courier/core';
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import { ServiceBusTransport } from '../src/index.js';
import { skipOnRealNamespace } from './support/namespace.js';
import { standIn, standInConnectionString } from './support/standin-server.js';

/** One-way delay of every chunk: a handshake of about ten round trips then takes ~6 s. */
const DELAY_MS = 300;
const PUBLISH_TIMEOUT_MS = 1_000;

/** A TCP proxy to `port` that holds every chunk `delayMs` in each direction, order kept. */
async function slowProxy(port: number, delayMs: number): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let closing = false;
  const server = createServer((client) => {
    if (closing) return void client.destroy();
    const upstream = connect(port, '127.0.0.1');
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    for (const [from, to] of [[client, upstream], [upstream, client]] as const) {
      sockets.add(from);
      from.on('data', (chunk) => setTimeout(() => to.destroyed || to.write(chunk), delayMs));
      from.on('close', end);
      from.on('error', end);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    close: async () => {
      closing = true;
      const closed = new Promise((resolve) => server.close(resolve));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe.skipIf(skipOnRealNamespace('the slow link is a local proxy in front of the stand-in'))('ServiceBusTransport behind a slow link', () => {
  it(`publish gets through although a fresh client's handshake outlasts publishTimeoutMs (${PUBLISH_TIMEOUT_MS} ms), retrying as the relay does; few clients are made`, async () => {
    const proxy = await slowProxy((await standIn()).port, DELAY_MS);
    let made = 0;
    const client = () => {
      made += 1;
      return new ServiceBusClient(standInConnectionString(proxy.port), { retryOptions: { maxRetries: 1, timeoutInMs: 30_000 } });
    };
    const transport = new ServiceBusTransport({ client, prefix: `${uniqueId()}.`, publishTimeoutMs: PUBLISH_TIMEOUT_MS });
    // Not awaited to the end: the clients given up while still connecting close only when
    // the SDK gives up on them (over 15 s here; a follow-up, not what this case is about).
    closers.push(async () => void (await Promise.race([transport.close(), new Promise((resolve) => setTimeout(resolve, 2_000))])));
    closers.push(() => proxy.close());
    const startedAt = Date.now();
    const attempts: string[] = [];
    let sent = false;
    // The relay retries a retriable rejection after a pause; a minute is many times the handshake.
    while (!sent && Date.now() - startedAt < 60_000) {
      try {
        const [result] = await transport.publish([makeEnvelope({ topic: 'orders.placed', key: 'k' })]);
        sent = result?.ok === true;
        attempts.push(`${Date.now() - startedAt} ms: ${result?.ok ? 'sent' : result?.error.message}`);
      } catch (error) {
        expect(error).toBeInstanceOf(CourierError);
        expect((error as CourierError).retriable, String(error)).toBe(true);
        attempts.push(`${Date.now() - startedAt} ms: ${(error as Error).message}`);
        // The relay's pause between tries, part of the scenario: its length decides nothing.
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    }
    console.log(`[azure-service-bus] slow link: ${made} client(s), ${attempts.length} publish call(s)\n${attempts.join('\n')}`);
    expect(sent, `never sent in 60 s; ${made} clients made`).toBe(true);
    expect(made, 'clients made').toBeLessThanOrEqual(4);
  }, 120_000);
});
