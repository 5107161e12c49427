import type { Channel, ChannelModel } from 'amqplib';
import { afterEach, describe, expect, it } from 'vitest';
import { RabbitMqTransport } from '../src/index.js';
import { deleteTopology, eventually, openConnection, TEST_TIERS_MS, testId } from './support/broker.js';
import { destroySocket } from './support/fixture.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/**
 * How long an operation that meets a dead connection may take to answer. It needs
 * milliseconds; the bound only has to tell "answers" from "never answers" on a loaded machine.
 */
const ANSWER_MS = 10_000;

/** `promise`'s outcome, or 'still waiting' once `ms` passed without one. */
async function outcomeWithin(promise: Promise<unknown>, ms: number): Promise<'resolved' | 'rejected' | 'still waiting'> {
  let timer: NodeJS.Timeout | undefined;
  const waiting = new Promise<'still waiting'>((resolve) => (timer = setTimeout(() => resolve('still waiting'), ms)));
  try {
    return await Promise.race([promise.then(() => 'resolved' as const, () => 'rejected' as const), waiting]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A transport whose connection can be made to die at the worst moment of a channel close:
 * after the transport sent `channel.close`, before the broker's `close-ok` came back (an
 * outage or a broker restart landing there). `cutAtNextClose()` arms it for one close.
 */
function transportCutAtClose(prefix: string): { transport: RabbitMqTransport; cutAtNextClose(): void; cuts(): number } {
  let armed = false;
  let cuts = 0;
  const transport = new RabbitMqTransport({
    prefix,
    delayTiersMs: TEST_TIERS_MS,
    reconnect: { initialDelayMs: 50, maxDelayMs: 200 },
    connection: async () => {
      const connection: ChannelModel = await openConnection(`${prefix}-cut-at-close`);
      const createChannel = connection.createChannel.bind(connection);
      connection.createChannel = async (...args) => {
        const channel: Channel = await createChannel(...args);
        const close = channel.close.bind(channel);
        channel.close = () => {
          const closing = close();
          if (armed) {
            armed = false;
            cuts++;
            destroySocket(connection);
          }
          return closing;
        };
        return channel;
      };
      return connection;
    },
  });
  return { transport, cutAtNextClose: () => void (armed = true), cuts: () => cuts };
}

describe('RabbitMqTransport when the connection dies during a channel close', () => {
  // amqplib calls a channel close's callback only on the broker's close-ok: when the
  // connection dies first, `channel.close()` never settles. A dead-letter read awaited it,
  // so it never ended, and every later read of that queue in the process queued behind it
  // (CI: the bus suite's broker-restart case could not read its end state for 45 s).
  it('a dead-letter read answers, and the next read of the same queue works after the reconnect', async () => {
    const prefix = `courier-${testId()}`;
    const { transport, cutAtNextClose, cuts } = transportCutAtClose(prefix);
    cleanups.push(async () => {
      await transport.close();
      await deleteTopology(prefix, ['c']);
    });
    await transport.provision({ consumer: 'c', topics: ['orders'], ordered: false });
    expect(await transport.deadLetters.list('c')).toEqual([]);

    cutAtNextClose();
    const first = await outcomeWithin(transport.deadLetters.list('c'), ANSWER_MS);
    expect(cuts()).toBe(1);
    expect(first).not.toBe('still waiting');

    // Reads of one queue take turns in a process: a read that never ended would hold this one too.
    await eventually(async () => expect(await transport.deadLetters.list('c')).toEqual([]), ANSWER_MS);
    await eventually(async () => expect(await transport.deadLetters.count('c')).toBe(0), ANSWER_MS);
  });

  it('provision answers', async () => {
    const prefix = `courier-${testId()}`;
    const { transport, cutAtNextClose, cuts } = transportCutAtClose(prefix);
    cleanups.push(async () => {
      await transport.close();
      await deleteTopology(prefix, ['c']);
    });
    cutAtNextClose();
    const outcome = await outcomeWithin(transport.provision({ consumer: 'c', topics: ['orders'], ordered: false }), ANSWER_MS);
    expect(cuts()).toBe(1);
    expect(outcome).not.toBe('still waiting');
  });

  it('close answers when the connection dies while a subscription closes its channel', async () => {
    const prefix = `courier-${testId()}`;
    const { transport, cutAtNextClose, cuts } = transportCutAtClose(prefix);
    cleanups.push(() => deleteTopology(prefix, ['c']));
    await transport.subscribe({ consumer: 'c', topics: ['orders'], concurrency: 1, ordered: false }, async () => undefined);
    cutAtNextClose();
    const outcome = await outcomeWithin(transport.close(), ANSWER_MS);
    expect(cuts()).toBe(1);
    expect(outcome).toBe('resolved');
  });
});
