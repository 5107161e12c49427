// The store takes an envelope core's publish built without validating it again
// (acceptEnvelope); every other envelope — hand-made, copied, changed, proxied — is still
// validated in full. These tests hold both halves, and that the shortcut accepts nothing
// decodeEnvelope would refuse.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  InMemoryBroker,
  InMemoryDatabase,
  InMemoryOutboxStore,
  SerializationError,
  acceptEnvelope,
  createBus,
  decodeEnvelope,
  defineMessage,
  type Envelope,
  type InMemoryTransaction,
  type MessageDefinition,
  type OutboxAppend,
  type PublishOptions,
} from '@courier/core';

const Note = defineMessage('notes.NoteTaken', { version: 1 });

/** A bus on the in-memory store whose appends are recorded as the store received them. */
function recordingBus(config: { newId?: () => string } = {}) {
  const db = new InMemoryDatabase();
  const outbox = new InMemoryOutboxStore({ database: db });
  const appended: OutboxAppend[] = [];
  const append = outbox.append.bind(outbox);
  outbox.append = (tx, messages) => {
    append(tx, messages);
    appended.push(...messages);
  };
  const bus = createBus<InMemoryTransaction>({ outbox, transport: new InMemoryBroker().connect(), ...config });
  const publish = (definition: MessageDefinition<unknown, unknown>, payload: unknown, options?: PublishOptions): Envelope => {
    const tx = db.begin();
    try {
      bus.outbox(tx).publish(definition as never, payload as never, options);
    } finally {
      // Nothing here is ever committed: the rollback only ends the unit of work, and a
      // publish that throws must throw synchronously to the caller, so it is not awaited.
      void tx.rollback();
    }
    return appended.at(-1)!.envelope;
  };
  return { publish, appended };
}

function problemOf(act: () => unknown): SerializationError {
  try {
    act();
  } catch (error) {
    expect(error).toBeInstanceOf(SerializationError);
    expect((error as SerializationError).code).toBe('ENVELOPE_INVALID');
    return error as SerializationError;
  }
  return expect.unreachable('expected ENVELOPE_INVALID');
}

describe('acceptEnvelope', () => {
  it('takes an envelope publish built as it is: frozen, headers too, and valid', () => {
    const { publish } = recordingBus();
    const envelope = publish(Note, { text: 'hi' }, { key: 'k-1', headers: { tenant: 'acme' } });
    expect(acceptEnvelope(envelope)).toBe(envelope);
    expect(Object.isFrozen(envelope)).toBe(true);
    expect(Object.isFrozen(envelope.headers)).toBe(true);
    expect(decodeEnvelope(envelope)).toEqual(envelope);
    expect(() => {
      (envelope as { type: string }).type = 'bad type';
    }).toThrowError(TypeError);
    expect(acceptEnvelope(envelope).type).toBe('notes.NoteTaken');
  });

  it('validates a copy of a published envelope, and refuses a changed one naming the field', () => {
    const { publish } = recordingBus();
    const envelope = publish(Note, { text: 'hi' }, { key: 'k-1' });
    const copy = acceptEnvelope({ ...envelope });
    expect(copy).not.toBe(envelope);
    expect(copy).toEqual(envelope);
    expect(acceptEnvelope(structuredClone(envelope))).not.toBe(envelope);
    expect(problemOf(() => acceptEnvelope({ ...envelope, type: 'bad type' })).message).toContain("'type' is malformed");
    expect(problemOf(() => acceptEnvelope({ ...envelope, version: 0 })).message).toContain("'version'");
    expect(problemOf(() => acceptEnvelope({ ...envelope, headers: { 'courier-x': '1' } })).message).toContain('reserved');
    expect(problemOf(() => acceptEnvelope({ ...envelope, payload: 42 })).message).toContain("'payload'");
  });

  it('validates a proxy of a published envelope, and a hand-made object that looks like one', () => {
    const { publish } = recordingBus();
    const envelope = publish(Note, { text: 'hi' });
    // A proxy is another object: validated, and a fresh copy is returned (a proxy of the
    // frozen envelope cannot answer other values; one of a copy is just a copy).
    const proxy = new Proxy(envelope, {});
    expect(acceptEnvelope(proxy)).not.toBe(proxy);
    expect(acceptEnvelope(proxy)).toEqual(envelope);
    const lying = new Proxy({ ...envelope }, { get: (target, field, receiver) => (field === 'messageId' ? '' : Reflect.get(target, field, receiver)) });
    expect(problemOf(() => acceptEnvelope(lying)).message).toContain("'messageId'");
    const forged = Object.freeze({ ...envelope, headers: Object.freeze({}) });
    expect(acceptEnvelope(forged)).not.toBe(forged);
    expect(problemOf(() => acceptEnvelope(Object.freeze({ ...envelope, occurredAt: 'yesterday' }))).message).toContain("'occurredAt'");
    expect(problemOf(() => acceptEnvelope(null)).message).toContain('must be an object');
  });

  it('leaves unsealed what publish did not check itself, so the store still refuses it', () => {
    // A definition not made by defineMessage with a type or topic no definition could have is
    // refused by publish itself (the caller's input); a custom newId's id is not checked there.
    const handMade = Object.freeze({ type: 'bad type', topic: 'notes', version: 1, schema: undefined, upcasters: {} });
    const bad = recordingBus();
    expect(() => bad.publish(handMade, {})).toThrow(ConfigError);
    expect(() => bad.publish(handMade, {})).toThrow('type "bad type" is not a valid message type');
    expect(bad.appended).toEqual([]);
    const blankIds = recordingBus({ newId: () => '' });
    expect(problemOf(() => blankIds.publish(Note, {})).message).toContain("'messageId'");
    expect(blankIds.appended).toEqual([]);
  });

  it('reads each option once: the envelope carries what was checked', () => {
    const { publish } = recordingBus();
    let keyReads = 0;
    let valueReads = 0;
    const options = {
      get key() {
        keyReads += 1;
        return keyReads === 1 ? 'k-1' : (42 as unknown as string);
      },
      headers: {
        get tenant() {
          valueReads += 1;
          return valueReads === 1 ? 'acme' : (7 as unknown as string);
        },
      },
    };
    const envelope = publish(Note, {}, options);
    expect(envelope.key).toBe('k-1');
    expect(envelope.headers).toEqual({ tenant: 'acme' });
    expect(acceptEnvelope(envelope)).toBe(envelope);
    expect(decodeEnvelope(envelope)).toEqual(envelope);
  });

  it('accepts as it is only envelopes decodeEnvelope accepts, for generated publish options', () => {
    const { publish } = recordingBus();
    const text = fc.string({ minLength: 1, maxLength: 40 });
    const options = fc.record(
      {
        key: fc.string({ minLength: 1, maxLength: 60 }),
        messageId: fc.oneof(fc.uuid(), text),
        correlationId: text,
        causationId: text,
        occurredAt: fc.date({ min: new Date('0000-01-01T00:00:00.000Z'), max: new Date('9999-12-31T23:59:59.999Z'), noInvalidDate: true }),
        headers: fc.dictionary(fc.string({ minLength: 1, maxLength: 20 }).filter((name) => !name.toLowerCase().startsWith('courier-')), fc.string({ maxLength: 40 }), { maxKeys: 5 }),
        delay: fc.nat(1_000_000),
      },
      { requiredKeys: [] },
    );
    const payload = fc.jsonValue().map((value) => JSON.parse(JSON.stringify(value)) as unknown);
    fc.assert(
      fc.property(options, payload, (given, body) => {
        const envelope = publish(Note, body, given);
        expect(acceptEnvelope(envelope)).toBe(envelope);
        expect(decodeEnvelope(envelope)).toEqual(envelope);
      }),
      { numRuns: 300 },
    );
  });
});
