import { describe, expect, it } from 'vitest';
import { ConfigError, defineMessage, type Envelope, type Transport } from '@courier/core';
import { eventually, harness } from './support/harness.js';

const Note = defineMessage('notes.NoteTaken', { version: 1 });
const Reply = defineMessage('notes.NoteAnswered', { version: 1 });

/** The bus's transport with a `validate` that refuses the header names `cc` and `bcc` (as a broker might). */
function refusing(inner: Transport): Transport {
  return {
    capabilities: inner.capabilities,
    validate: (envelope: Envelope) =>
      Object.keys(envelope.headers)
        .filter((name) => name === 'cc' || name === 'bcc')
        .map((name) => `header '${name}' is refused by the broker`),
    publish: (messages, options) => inner.publish(messages, options),
    subscribe: (endpoint, handler) => inner.subscribe(endpoint, handler),
    close: () => inner.close(),
  };
}

async function pendingIds(h: ReturnType<typeof harness>): Promise<string[]> {
  const batch = await h.outbox.claim({ owner: 'inspector', limit: 1_000, leaseMs: 60_000, perKey: 1_000 });
  return batch.records.map((record) => record.envelope.messageId);
}

describe("the transport's validate at publish", () => {
  it('refuses at bus.outbox(tx).publish with a ConfigError naming the type and every problem; nothing is appended', async () => {
    await using h = harness({ transport: refusing });
    let kept = '';
    await h.commit((tx) => {
      const outbox = h.bus.outbox(tx);
      let error: unknown;
      try {
        outbox.publish(Note, { n: 1 }, { headers: { cc: 'x', bcc: 'y', fine: 'z' } });
      } catch (caught) {
        error = caught;
      }
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems).toEqual([
        "publish 'notes.NoteTaken': header 'cc' is refused by the broker",
        "publish 'notes.NoteTaken': header 'bcc' is refused by the broker",
      ]);
      kept = outbox.publish(Note, { n: 2 }, { headers: { fine: 'z' } });
    });
    expect(await pendingIds(h)).toEqual([kept]);
  });

  it('refuses at ctx.publish inside a handler the same way', async () => {
    await using h = harness({ transport: refusing });
    const errors: unknown[] = [];
    const published: string[] = [];
    h.bus.subscribe('answers', Note, async (_message, ctx) => {
      try {
        ctx.publish(Reply, { n: 1 }, { headers: { cc: 'x' } });
      } catch (error) {
        errors.push(error);
      }
      published.push(ctx.publish(Reply, { n: 2 }));
    });
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Note, { n: 0 });
    });
    await h.bus.start();
    await eventually(() => expect(published).toHaveLength(1));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toBeInstanceOf(ConfigError);
    expect((errors[0] as Error).message).toContain("publish 'notes.NoteAnswered': header 'cc' is refused by the broker");
  });
});
