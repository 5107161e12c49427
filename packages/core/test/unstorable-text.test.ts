import { describe, expect, it } from 'vitest';
import { ConfigError, SerializationError, decodeEnvelope, defineMessage, serializePayload } from '@courier/core';
import { harness } from './support/harness.js';

const Note = defineMessage('notes.NoteTaken', { version: 1 });

function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

describe('text no database can store (U+0000, lone surrogates)', () => {
  it('publish refuses it in the key, ids and headers with a ConfigError naming the field and where', async () => {
    await using h = harness();
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      const error = thrown(() => outbox.publish(Note, {}, { key: 'a\u0000b', correlationId: 'c\uD800', headers: { 'x-\uDC00': 'v\u0000' } }));
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems).toEqual([
        `publish 'notes.NoteTaken': 'correlationId' holds a lone surrogate U+D800 at index 1, which databases cannot store`,
        `publish 'notes.NoteTaken': 'key' holds U+0000 (NUL) at index 1, which databases cannot store`,
        `publish 'notes.NoteTaken': header name 'x-\uDC00' holds a lone surrogate U+DC00 at index 2, which databases cannot store`,
        `publish 'notes.NoteTaken': header 'x-\uDC00' holds U+0000 (NUL) at index 1, which databases cannot store`,
      ]);
      // Paired surrogates (an emoji) are fine.
      outbox.publish(Note, {}, { key: 'k😀' });
    });
  });

  it('the payload escapes them: JSON text holds neither', () => {
    const text = serializePayload({ nul: 'a\u0000b', lone: 'x\uD800y' });
    expect(text).toBe('{"nul":"a\\u0000b","lone":"x\\ud800y"}');
    expect(text.includes('\u0000') || /[\uD800-\uDFFF]/.test(text)).toBe(false);
  });

  it('decodeEnvelope refuses them in text fields', () => {
    const base = {
      messageId: 'm1',
      type: 'notes.NoteTaken',
      version: 1,
      topic: 'notes',
      occurredAt: new Date().toISOString(),
      correlationId: 'm1',
      payload: '{}',
    };
    expect(() => decodeEnvelope({ ...base, key: 'a\u0000' })).toThrow(SerializationError);
    expect(() => decodeEnvelope({ ...base, key: 'a\u0000' })).toThrow(`'key' holds U+0000 (NUL) at index 1`);
    expect(() => decodeEnvelope({ ...base, headers: { h: '\uDBFF' } })).toThrow(`header 'h' holds a lone surrogate U+DBFF`);
    expect(decodeEnvelope({ ...base, key: 'k😀' }).key).toBe('k😀');
  });
});
