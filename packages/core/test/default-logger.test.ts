// A service built as the README shows (no `logger`) must still say when a message needs a
// person: dead-lettered or halted. Before the default logger it printed nothing at all.
import { afterEach, beforeEach, describe, expect, it, vi, type MockInstance } from 'vitest';
import {
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  UnrecoverableError,
  createBus,
  defaultLogger,
  defineMessage,
  newMessageId,
  noopLogger,
  type Envelope,
} from '@courier/core';
import { eventually } from './support/harness.js';

const Charged = defineMessage('billing.Charged', { version: 1 });

function envelope(messageId: string, key: string | null): Envelope {
  return {
    messageId,
    type: Charged.type,
    version: 1,
    topic: Charged.topic,
    occurredAt: new Date().toISOString(),
    key,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
  };
}

/** The JSON lines written to stderr (console.error) so far. */
function lines(spy: MockInstance): { level: string; message: string; [field: string]: unknown }[] {
  return spy.mock.calls.flatMap(([first]) => {
    if (typeof first !== 'string') return [];
    try {
      return [JSON.parse(first) as { level: string; message: string }];
    } catch {
      return [];
    }
  });
}

describe('the default logger', () => {
  let stderr: MockInstance;
  let stdout: MockInstance;
  beforeEach(() => {
    stderr = vi.spyOn(console, 'error').mockImplementation(() => {});
    stdout = vi.spyOn(console, 'log').mockImplementation(() => {});
  });
  afterEach(() => vi.restoreAllMocks());

  /** A bus configured as the README's quick start: no `logger`. */
  async function readmeBus(options: { poison: 'park' | 'halt' }) {
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const connection = broker.connect();
    const bus = createBus({
      outbox: new InMemoryOutboxStore({ database }),
      inbox: new InMemoryInboxStore({ database }),
      transport: connection,
      relay: { pollIntervalMs: 20 },
    });
    const applied: string[] = [];
    bus.subscribe(
      'billing',
      Charged,
      async (message, context) => {
        if (message.messageId.startsWith('bad-')) throw new UnrecoverableError(`card refused for ${message.messageId}`);
        context.tx.onCommit(() => applied.push(message.messageId));
      },
      { ordered: true, poison: options.poison, retry: { maxAttempts: 1 } },
    );
    await bus.start();
    return {
      bus,
      connection,
      applied,
      async [Symbol.asyncDispose]() {
        await bus.stop();
        await broker.close();
      },
    };
  }

  it('logs a dead-lettered message at error on stderr, naming the consumer and the message', async () => {
    await using h = await readmeBus({ poison: 'park' });
    const bad = `bad-${newMessageId()}`;
    const good = `good-${newMessageId()}`;
    await h.connection.publish([envelope(bad, 'k'), envelope(good, 'j')]);
    await eventually(() => expect(h.bus.health().counters.deadLettered).toBe(1));
    await eventually(() => expect(h.applied).toEqual([good]));
    const dead = lines(stderr).filter((line) => line.message === 'message dead-lettered');
    expect(dead).toHaveLength(1);
    expect(dead[0]).toMatchObject({ level: 'error', consumer: 'billing', messageId: bad });
    // Info and debug stay out: the bus started and applied a message without a word on stdout.
    expect(stdout).not.toHaveBeenCalled();
    expect(lines(stderr).every((line) => line.level === 'warn' || line.level === 'error')).toBe(true);
  });

  it('logs a halted key at error on stderr, naming the consumer and the key', async () => {
    await using h = await readmeBus({ poison: 'halt' });
    const bad = `bad-${newMessageId()}`;
    await h.connection.publish([envelope(bad, 'acct-7')]);
    await eventually(() => expect(h.bus.health().counters.haltedKeys).toBe(1));
    const halted = lines(stderr).filter((line) => line.message.startsWith('key halted'));
    expect(halted).toHaveLength(1);
    expect(halted[0]).toMatchObject({ level: 'error', consumer: 'billing', key: 'acct-7' });
    expect(stdout).not.toHaveBeenCalled();
  });

  it('writes warn and error, never info or debug; noopLogger stays available for silence', () => {
    defaultLogger.debug('d');
    defaultLogger.info('i');
    defaultLogger.warn('w', { n: 1 });
    defaultLogger.error('e');
    noopLogger.error('never');
    expect(stdout).not.toHaveBeenCalled();
    expect(lines(stderr).map((line) => [line.level, line.message])).toEqual([
      ['warn', 'w'],
      ['error', 'e'],
    ]);
    expect(lines(stderr)[0]).toMatchObject({ n: 1 });
  });
});
