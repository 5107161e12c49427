import { describe, expect, it } from 'vitest';
import {
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  UnrecoverableError,
  createBus,
  defineMessage,
  newMessageId,
  type Envelope,
} from '@courier/core';
import { eventually } from './support/harness.js';

const Charged = defineMessage('billing.Charged', { version: 1 });

function envelope(messageId: string): Envelope {
  return {
    messageId,
    type: Charged.type,
    version: 1,
    topic: Charged.topic,
    occurredAt: new Date().toISOString(),
    key: 'k',
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
  };
}

describe('copies of a dead-lettered message', () => {
  it('a later copy (the relay publishes at least once) is acknowledged, not dead-lettered again; a replay runs it', async () => {
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const connection = broker.connect();
    const bus = createBus({
      outbox: new InMemoryOutboxStore({ database }),
      inbox: new InMemoryInboxStore({ database }),
      transport: connection,
      relay: { pollIntervalMs: 20 },
    });
    let broken = true;
    const runs: string[] = [];
    bus.subscribe('billing', Charged, async (message) => {
      runs.push(message.messageId);
      if (broken) throw new UnrecoverableError('card declined');
    });
    await bus.start();
    const id = newMessageId();
    await connection.publish([envelope(id)]);
    await eventually(() => expect(bus.health().counters.deadLettered).toBe(1));

    await connection.publish([envelope(id)]);
    await eventually(() => expect(bus.health().counters.duplicates).toBe(1));
    expect(bus.health().counters.deadLettered).toBe(1);
    expect(runs).toEqual([id]);
    const letters = await connection.deadLetters.list('billing');
    expect(letters.map((letter) => [letter.envelope.messageId, letter.reason.code])).toEqual([[id, 'UNRECOVERABLE']]);

    broken = false;
    expect(await connection.deadLetters.replay('billing', letters.map((letter) => letter.id))).toBe(1);
    await eventually(() => expect(bus.health().counters.processed).toBe(1));
    expect(runs).toEqual([id, id]);
    expect(await connection.deadLetters.list('billing')).toEqual([]);
    await bus.stop();
    await broker.close();
  });
});
