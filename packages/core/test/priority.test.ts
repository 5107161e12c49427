// Message priority (issue 39): set on the definition or per publish, carried in the envelope
// as the one Courier header (`courier-priority`), honoured by transports that declare it.
import { describe, expect, it } from 'vitest';
import { ConfigError, MAX_PRIORITY, PRIORITY_HEADER, SerializationError, decodeEnvelope, defineMessage, envelopePriority, type Envelope } from '@courier/core';
import { eventually, harness } from './support/harness.js';
import { scriptedTransport } from './support/relay-transports.js';

const Plain = defineMessage('jobs.Plain', { version: 1 });
const Urgent = defineMessage('jobs.Urgent', { version: 1, priority: 7 });

/** What `act` threw, failing the test when it did not throw. */
function thrown(act: () => unknown): unknown {
  try {
    act();
  } catch (error) {
    return error;
  }
  return expect.unreachable('expected a throw');
}

describe('message priority', () => {
  it('comes from the definition, a publish overrides it, and it reaches the transport in the envelope; handlers do not see the header', async () => {
    const sent: Envelope[] = [];
    await using h = harness({
      transport: (inner) =>
        scriptedTransport(inner, (messages) => {
          sent.push(...messages);
          return messages.map(() => undefined);
        }),
    });
    const seen: Record<string, string>[] = [];
    for (const definition of [Plain, Urgent]) {
      h.bus.subscribe('sink', definition, async (message) => {
        seen.push({ ...message.headers });
      });
    }
    await h.bus.start();
    await h.commit((tx) => {
      h.bus.outbox(tx).publish(Plain, {}, { messageId: 'none', headers: { tenant: 'a' } });
      h.bus.outbox(tx).publish(Plain, {}, { messageId: 'given', priority: 0 });
      h.bus.outbox(tx).publish(Urgent, {}, { messageId: 'default', headers: { tenant: 'b' } });
      h.bus.outbox(tx).publish(Urgent, {}, { messageId: 'override', priority: MAX_PRIORITY });
    });
    await eventually(() => expect(seen).toHaveLength(4));
    const byId = new Map(sent.map((envelope) => [envelope.messageId, envelope]));
    expect(['none', 'given', 'default', 'override'].map((id) => envelopePriority(byId.get(id)!))).toEqual([null, 0, 7, 9]);
    expect(byId.get('default')!.headers).toEqual({ tenant: 'b', [PRIORITY_HEADER]: '7' });
    expect(Object.isFrozen(byId.get('default')!.headers)).toBe(true);
    expect(seen.flatMap((headers) => Object.keys(headers)).sort()).toEqual(['tenant', 'tenant']);
  });

  it('refuses a bad priority on the definition or the publish, and the header among user headers', async () => {
    const definition = thrown(() => defineMessage('jobs.Bad', { version: 1, priority: 10 }));
    expect(definition).toBeInstanceOf(ConfigError);
    expect((definition as ConfigError).problems).toEqual([`priority of 'jobs.Bad' must be an integer from 0 to 9, got 10`]);
    await using h = harness();
    await h.commit((tx) => {
      for (const priority of [-1, 1.5, Number.NaN, '3' as unknown as number]) {
        const error = thrown(() => h.bus.outbox(tx).publish(Plain, {}, { priority }));
        expect(error).toBeInstanceOf(ConfigError);
        expect((error as ConfigError).message).toContain(`'priority' must be an integer from 0 to 9`);
      }
      const header = thrown(() => h.bus.outbox(tx).publish(Plain, {}, { headers: { [PRIORITY_HEADER]: '3' } }));
      expect((header as ConfigError).message).toContain(`header '${PRIORITY_HEADER}' uses the reserved 'courier-' prefix`);
    });
    expect((await h.outbox.stats()).pending).toBe(0);
  });

  it('a stored envelope may carry a valid priority header, nothing else reserved', () => {
    const base = { messageId: 'm', type: 'jobs.Plain', version: 1, topic: 'jobs', occurredAt: '2026-01-01T00:00:00.000Z', key: null, correlationId: 'm', causationId: null, traceparent: null, tracestate: null, payload: '{}' };
    expect(envelopePriority(decodeEnvelope({ ...base, headers: { [PRIORITY_HEADER]: '5' } }))).toBe(5);
    for (const headers of [{ [PRIORITY_HEADER]: '10' }, { [PRIORITY_HEADER]: 'high' }, { 'courier-other': '1' }]) {
      expect(() => decodeEnvelope({ ...base, headers })).toThrow(SerializationError);
    }
  });
});
