import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  ENVELOPE_LIMITS,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  SCHEDULE_LIMITS,
  SerializationError,
  createBus,
  decodeEnvelope,
  defineMessage,
  type InMemoryTransaction,
  type PortLimits,
  type PublishOptions,
  type Transport,
} from '@courier/core';
import { eventually, harness, spyTransport } from './support/harness.js';

const Note = defineMessage('notes.NoteTaken', { version: 1 });
const Reply = defineMessage('notes.NoteAnswered', { version: 1 });

/** Returns what `act` threw, failing the test when it did not throw. */
function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

/** The ConfigError's problems joined by newlines, failing the test when `error` is something else. */
function problemsOf(error: unknown): string {
  expect(error).toBeInstanceOf(ConfigError);
  return (error as ConfigError).problems.join('\n');
}

/** Wraps a transport so it declares `limits`, as RabbitMQ's does. */
function declaring(limits: PortLimits): (transport: Transport) => Transport {
  return (transport) => Object.assign(spyTransport(transport), { limits });
}

/** An in-memory outbox store that declares column sizes, as the SQL stores do. */
class LimitedOutboxStore extends InMemoryOutboxStore {
  readonly limits: PortLimits = { id: { chars: 50 }, key: { chars: 10 }, type: { chars: 20 }, topic: { chars: 5 } };
}

/** An in-memory inbox store that declares the MikroORM inbox's column sizes. */
class LimitedInboxStore extends InMemoryInboxStore {
  readonly limits: PortLimits = { id: { chars: 200 }, consumer: { chars: 200 } };
}

/** Pending rows' messageIds (claimed under a throwaway lease; no relay runs). */
async function pendingIds(outbox: InMemoryOutboxStore): Promise<string[]> {
  const batch = await outbox.claim({ owner: 'inspector', limit: 1_000, leaseMs: 60_000, perKey: 1_000 });
  return batch.records.map((record) => record.envelope.messageId);
}

describe('envelope limits count UTF-8 bytes where the limit is in bytes', () => {
  const euro = '€'; // 1 character, 3 UTF-8 bytes

  it('refuses at publish a header name of 100 multibyte characters (300 bytes), accepts one of exactly 200 bytes', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const error = thrown(() => outbox.publish(Note, {}, { headers: { [euro.repeat(100)]: 'v' } }));
      expect(problemsOf(error)).toContain(`is 300 UTF-8 bytes; at most ${ENVELOPE_LIMITS.headerNameBytes} are allowed`);
      outbox.publish(Note, {}, { headers: { [`${euro.repeat(66)}ab`]: 'v' } }); // 198 + 2 = 200 bytes
    });
    expect(await pendingIds(h.outbox)).toHaveLength(1);
  });

  it('refuses at publish a header value over 4096 UTF-8 bytes even when it has fewer characters', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const error = thrown(() => h.bus.outbox(tx).publish(Note, {}, { headers: { note: euro.repeat(1_400) } }));
      expect(problemsOf(error)).toContain(`header 'note' is 4200 UTF-8 bytes; at most ${ENVELOPE_LIMITS.headerValueBytes} are allowed`);
    });
    expect(await pendingIds(h.outbox)).toEqual([]);
  });

  it('decodeEnvelope applies the same byte limits, so what publish accepts a consumer decodes', () => {
    const base = {
      messageId: 'm-1',
      type: 'notes.NoteTaken',
      version: 1,
      topic: 'notes',
      occurredAt: '2024-01-01T00:00:00.000Z',
      key: null,
      correlationId: 'm-1',
      payload: '{}',
    };
    expect(() => decodeEnvelope({ ...base, headers: { [euro.repeat(100)]: 'v' } })).toThrowError(SerializationError);
    expect(decodeEnvelope({ ...base, headers: { [`${euro.repeat(66)}ab`]: 'v' } }).headers).toHaveProperty(`${euro.repeat(66)}ab`, 'v');
  });
});

describe('limits declared by the ports, checked at publish', () => {
  it('refuses a messageId over the transport-declared 255 bytes though it is under 200 characters, and appends nothing', async () => {
    await using h = harness({ transport: declaring({ id: { bytes: 255 }, headerName: { bytes: 255 } }) });
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const error = thrown(() => outbox.publish(Note, {}, { messageId: 'é'.repeat(150) }));
      const problems = problemsOf(error);
      expect(problems).toMatch(/^publish 'notes.NoteTaken': 'messageId' 'é+…' is 300 UTF-8 bytes; the transport holds at most 255$/);
      // Exactly at the limit is fine.
      outbox.publish(Note, {}, { messageId: `${'é'.repeat(127)}x` });
    });
    expect(await pendingIds(h.outbox)).toEqual([`${'é'.repeat(127)}x`]);
  });

  it('lists every field over any port limit at once: ids, key, type, topic, header names and values', async () => {
    await using h = harness({ transport: declaring({ headerName: { bytes: 8 }, headerValue: { chars: 3 }, id: { bytes: 40 } }) });
    const outbox = new LimitedOutboxStore({ database: h.db });
    const bus = h.another({ outbox });
    const Long = defineMessage('orders.OrderPlacedWithAVeryLongName', { version: 1 });
    await h.commit((tx) => {
      const error = thrown(() =>
        bus.outbox(tx).publish(Long, {}, {
          messageId: 'm'.repeat(45),
          correlationId: 'c'.repeat(51),
          causationId: 'fine',
          key: 'k'.repeat(11),
          headers: { 'header-name-9': 'v', ok: 'long' },
        }),
      );
      const problems = (error as ConfigError).problems;
      expect(problemsOf(error)).toBeTruthy();
      expect(problems).toHaveLength(7);
      const text = problems.join('\n');
      expect(text).toContain(`'messageId' '${'m'.repeat(40)}…' is 45 UTF-8 bytes; the transport holds at most 40`);
      expect(text).toContain(`'correlationId' '${'c'.repeat(40)}…' is 51 characters; the outbox store holds at most 50`);
      expect(text).toContain(`'key' 'kkkkkkkkkkk' is 11 characters; the outbox store holds at most 10`);
      expect(text).toContain(`type 'orders.OrderPlacedWithAVeryLongName' is 35 characters; the outbox store holds at most 20`);
      expect(text).toContain(`topic 'orders' is 6 characters; the outbox store holds at most 5`);
      expect(text).toContain(`header name 'header-name-9' is 13 UTF-8 bytes; the transport holds at most 8`);
      expect(text).toContain(`header 'ok' is 4 characters; the transport holds at most 3`);
    });
    expect(await pendingIds(outbox)).toEqual([]);
  });

  it('checks ctx.publish inside a handler too, including the correlationId it inherits', async () => {
    await using h = harness({ transport: declaring({ id: { bytes: 40 } }) });
    const errors: unknown[] = [];
    h.bus.subscribe('answers', Note, async (_message, ctx) => {
      errors.push(thrown(() => ctx.publish(Reply, {}, { key: 'fine' })));
    });
    await h.bus.start();
    // A message from a producer with larger limits: its correlationId does not fit this transport.
    const other = h.another({ transport: h.broker.connect() });
    await h.commit((tx) => {
      other.outbox(tx).publish(Note, {}, { correlationId: 'c'.repeat(41) });
    });
    await other.start({ consumers: false });
    await eventually(() => expect(errors).toHaveLength(1));
    expect(problemsOf(errors[0])).toContain(`publish 'notes.NoteAnswered': 'correlationId' '${'c'.repeat(40)}…' is 41 UTF-8 bytes; the transport holds at most 40`);
  });
});

describe('consumer names checked against the inbox and transport limits at subscribe', () => {
  it('refuses synchronously a name that fits the inbox column only without the suffixes Courier appends', async () => {
    await using h = harness();
    const bus = h.another({ inbox: new LimitedInboxStore({ database: h.db }) });
    const error = thrown(() => bus.subscribe('c'.repeat(198), Note, async () => undefined));
    expect(problemsOf(error)).toContain(
      `consumer name '${'c'.repeat(198)}' is 198 characters; the inbox store (its limit less the 6 characters of Courier's suffix '~alone') holds at most 194`,
    );
    expect((error as ConfigError).problems).toHaveLength(1);
    bus.subscribe('c'.repeat(194), Note, async () => undefined);
  });

  it('lists the inbox and the transport problems of one name together', async () => {
    await using h = harness({ transport: declaring({ consumer: { bytes: 100 } }) });
    const bus = h.another({ inbox: new LimitedInboxStore({ database: h.db }), transport: declaring({ consumer: { bytes: 100 } })(h.broker.connect()) });
    const error = thrown(() => bus.subscribe('c'.repeat(195), Note, async () => undefined));
    const problems = problemsOf(error);
    expect(problems).toContain('holds at most 194');
    expect(problems).toContain(`is 195 UTF-8 bytes; the transport holds at most 100`);
    expect((error as ConfigError).problems).toHaveLength(2);
    bus.subscribe('c'.repeat(100), Note, async () => undefined);
  });

  it('refuses a subscription to a topic the transport cannot hold', async () => {
    await using h = harness({ transport: declaring({ topic: { bytes: 4 } }) });
    expect(problemsOf(thrown(() => h.bus.subscribe('notes-reader', Note, async () => undefined)))).toContain(
      `subscribe 'notes-reader': topic 'notes' is 5 UTF-8 bytes; the transport holds at most 4`,
    );
  });
});

describe('port limit declarations are checked by createBus', () => {
  it('lists every malformed declaration', async () => {
    await using h = harness();
    const outbox = Object.assign(new InMemoryOutboxStore({ database: h.db }), { limits: { id: { chars: 0 }, colour: { chars: 1 } } });
    const inbox = Object.assign(new InMemoryInboxStore({ database: h.db }), { limits: { consumer: { characters: 5 } } });
    const transport = Object.assign(h.broker.connect(), { limits: 'small' });
    const error = thrown(() => createBus<InMemoryTransaction>({ outbox, inbox, transport } as never));
    const problems = problemsOf(error);
    expect(problems).toContain("'outbox.limits.id.chars' must be an integer of 1 or more, got number 0");
    expect(problems).toContain("'outbox.limits.colour' is not a known limit");
    expect(problems).toContain("'inbox.limits.consumer.characters' is not a known unit (chars, bytes)");
    expect(problems).toContain("'transport.limits' must be an object");
    expect((error as ConfigError).problems).toHaveLength(4);
  });
});

describe('schedules are range-checked at publish, the same for every store', () => {
  const cases: [string, PublishOptions, string][] = [
    ['delay: 1e17', { delay: 1e17 }, `'delay' is 100000000000000000 ms; at most ${SCHEDULE_LIMITS.maxDelayMs} (100 years) is allowed`],
    ['a notBefore in year 10000', { notBefore: new Date('+010000-01-01T00:00:00.000Z') }, `'notBefore' is +010000-01-01T00:00:00.000Z; it must be from 1970-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z`],
    ['a notBefore in year 1', { notBefore: new Date('0001-01-01T00:00:00.000Z') }, `'notBefore' is 0001-01-01T00:00:00.000Z`],
    ['a notBefore just before 1970', { notBefore: new Date(-1) }, `'notBefore' is 1969-12-31T23:59:59.999Z`],
    ['an occurredAt in year 10000', { occurredAt: new Date('+010000-01-01T00:00:00.000Z') }, `'occurredAt' is +010000-01-01T00:00:00.000Z; it must be from 0000-01-01T00:00:00.000Z`],
  ];

  it.each(cases)('refuses %s with a ConfigError naming the option, appending nothing', async (_name, options, message) => {
    await using h = harness();
    await h.commit((tx) => {
      const error = thrown(() => h.bus.outbox(tx).publish(Note, {}, options));
      expect(problemsOf(error)).toContain(`publish 'notes.NoteTaken': ${message}`);
    });
    expect(await pendingIds(h.outbox)).toEqual([]);
  });

  it('accepts the bounds themselves', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      outbox.publish(Note, {}, { messageId: 'max-delay', delay: SCHEDULE_LIMITS.maxDelayMs });
      outbox.publish(Note, {}, { messageId: 'earliest', notBefore: new Date(SCHEDULE_LIMITS.earliestMs) });
      outbox.publish(Note, {}, { messageId: 'latest', notBefore: new Date(SCHEDULE_LIMITS.latestMs) });
      outbox.publish(Note, {}, { messageId: 'old-fact', occurredAt: new Date('0001-01-01T00:00:00.000Z') });
    });
    // Only the rows due now are claimable; the far-future ones are pending, not lost.
    expect((await pendingIds(h.outbox)).sort()).toEqual(['earliest', 'old-fact']);
    expect((await h.outbox.stats()).pending).toBe(4);
  });
});
