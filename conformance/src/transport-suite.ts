import { setTimeout as sleep } from 'node:timers/promises';
import { CONNECTIVITY_CODES, CourierError, REASON_LIMITS, TransportError, isRetriable, type Delivery, type Endpoint, type Envelope, type Subscription, type Transport } from '@courier/core';
import { expect } from 'vitest';
import type { TransportFixture, TransportFixtureFactory } from './fixtures.js';
import { deferred } from './support/deferred.js';
import { eventually } from './support/eventually.js';
import { comparableEnvelope, makeEnvelope, protoHeaders } from './support/make-envelope.js';
import { caseTimeoutMs, describeCases, type CaseControls, type SuiteCase } from './support/run-cases.js';

/** Per-suite settings of {@link describeTransport}. */
export interface TransportSuiteOptions {
  /** Bound of every `eventually` wait (redelivery after a killed connection can take a while on some brokers). Default 15 s. */
  readonly timeoutMs?: number;
  /** Delay passed to `retry` in the retry case. Default 500 ms. */
  readonly retryDelayMs?: number;
  /** How much earlier than the delay a redelivery may arrive (clock granularity). Default 50 ms. */
  readonly delayToleranceMs?: number;
  /** Keys and messages per key in the ordering case (delivered with concurrency 8). Default 4 × 12. */
  readonly orderedKeys?: number;
  readonly messagesPerKey?: number;
  /** Largest `maxMessageBytes` the oversize case will exceed; above it the case is skipped. Default 16 MiB. */
  readonly maxOversizeBytes?: number;
  /** Payload size of the large round-trip message, in characters (capped below `maxMessageBytes`). Default 128 KiB. */
  readonly largePayloadChars?: number;
}

/** What a transport case works with. */
export interface TransportCaseEnv extends CaseControls {
  readonly fixture: TransportFixture;
  readonly transport: Transport;
  /** The case's topic, derived from its test id. */
  readonly topic: string;
  /** A consumer (group) name private to the case. */
  consumer(name: string): string;
  readonly options: Required<TransportSuiteOptions>;
}

/** One transport case. */
export type TransportCase = SuiteCase<TransportCaseEnv>;

const DEFAULTS: Required<TransportSuiteOptions> = {
  timeoutMs: 15_000,
  retryDelayMs: 500,
  delayToleranceMs: 50,
  orderedKeys: 4,
  messagesPerKey: 12,
  maxOversizeBytes: 16 * 1024 * 1024,
  largePayloadChars: 128 * 1024,
};

/**
 * Registers the transport conformance suite: a vitest `describe` with every case of
 * {@link transportCases}, each against a fresh fixture from `factory` (unique test id)
 * that is closed afterwards. Cases a transport's declared capabilities or its fixture
 * cannot support are skipped, with the reason in the report. Each case's vitest timeout is
 * set from `timeoutMs` (six of its waits, at least 60 s): no vitest setting is needed.
 */
export function describeTransport(name: string, factory: TransportFixtureFactory, options: TransportSuiteOptions = {}): void {
  const settings = { ...DEFAULTS, ...options };
  describeCases(`transport(${name})`, transportCases, async (context, controls) => {
    const fixture = await factory(context);
    const env: TransportCaseEnv = {
      ...controls,
      fixture,
      transport: fixture.transport,
      topic: `${context.testId}.transport`,
      consumer: (consumerName) => `${context.testId}-${consumerName}`,
      options: settings,
    };
    return { env, close: () => fixture.close() };
  }, caseTimeoutMs(settings.timeoutMs));
}

interface Received {
  readonly delivery: Delivery;
  readonly at: number;
}

interface Collector {
  readonly received: Received[];
  readonly subscription: Subscription;
  ids(): string[];
}

type Handle = (delivery: Delivery) => Promise<void>;

const ack: Handle = (delivery) => delivery.ack();

/** Two instances of one consumer group, each on its own connection (`other` is the second's, closed by the caller), acknowledging slowly so both get work. */
async function competingInstances(env: TransportCaseEnv): Promise<{ first: Collector; second: Collector; other: Transport }> {
  const group = env.consumer('shared');
  const slowAck: Handle = async (delivery) => {
    await sleep(5);
    await delivery.ack();
  };
  const other = await env.fixture.connect();
  const first = await collect(env, { consumer: group, concurrency: 1 }, slowAck);
  const second = await collect(env, { consumer: group, concurrency: 1 }, slowAck, other);
  return { first, second, other };
}

/** What `DeadLetter.id` must look like: one non-empty token without whitespace or control characters. */
const DEAD_LETTER_ID = /^[^\s\p{C}]+$/u;

async function collect(
  env: TransportCaseEnv,
  endpoint: Partial<Endpoint> & { consumer: string },
  handle: Handle = ack,
  transport: Transport = env.transport,
): Promise<Collector> {
  const received: Received[] = [];
  const subscription = await transport.subscribe(
    { topics: [env.topic], ordered: false, concurrency: 4, ...endpoint },
    async (delivery) => {
      received.push({ delivery, at: Date.now() });
      await handle(delivery);
    },
  );
  return { received, subscription, ids: () => received.map((item) => item.delivery.envelope.messageId) };
}

function message(env: TransportCaseEnv, key: string | null, overrides: Partial<Envelope> = {}): Envelope {
  return makeEnvelope({ topic: env.topic, key, type: 'conformance.TransportTested', ...overrides });
}

/** A string of exactly `bytes` UTF-8 bytes: `repeated` over and over, padded with the one-byte `pad`. */
function atByteLimit(pad: string, repeated: string, bytes: number): string {
  const unit = Buffer.byteLength(repeated, 'utf8');
  const body = repeated.repeat(Math.floor(bytes / unit));
  return body + pad.repeat(bytes - Buffer.byteLength(body, 'utf8'));
}

function sorted(values: Iterable<string>): string[] {
  return [...values].sort();
}

function unique(values: readonly string[]): string[] {
  return sorted(new Set(values));
}

async function publishOk(transport: Transport, envelopes: readonly Envelope[]): Promise<void> {
  const results = await transport.publish(envelopes);
  expect(results.map((result) => [result.messageId, result.ok])).toEqual(envelopes.map((envelope) => [envelope.messageId, true]));
}

/**
 * Collects Node's MaxListenersExceededWarning messages until `stop()`: the process-wide
 * 'warning' event is the one place the eleventh listener on any signal shows up, whoever
 * owns the signal.
 */
function watchListenerWarnings(): { readonly seen: string[]; stop(): void } {
  const seen: string[] = [];
  const onWarning = (warning: Error) => void (warning.name === 'MaxListenersExceededWarning' && seen.push(warning.message));
  process.on('warning', onWarning);
  return { seen, stop: () => void process.off('warning', onWarning) };
}

/** Every transport case, in the order the suite runs them; a plugin may run one alone. */
export const transportCases: readonly TransportCase[] = [
  {
    name: 'publish answers one result per message, in input order',
    async run(env) {
      await collect(env, { consumer: env.consumer('results') });
      const envelopes = Array.from({ length: 10 }, (_, index) => message(env, index % 2 === 0 ? `k${index % 3}` : null));
      const results = await env.transport.publish(envelopes);
      expect(results.map((result) => result.messageId)).toEqual(envelopes.map((envelope) => envelope.messageId));
      expect(results.every((result) => result.ok)).toBe(true);
      expect(await env.transport.publish([])).toEqual([]);
    },
  },
  {
    name: 'every envelope field round-trips losslessly',
    async run(env) {
      const inbox = await collect(env, { consumer: env.consumer('round-trip') });
      const largeChars = Math.min(env.options.largePayloadChars, Math.floor(env.transport.capabilities.maxMessageBytes / 8));
      const envelopes = [
        message(env, 'key-ü-😀', {
          type: 'conformance.Round_Trip-1',
          version: 7,
          occurredAt: '2024-02-29T23:59:59.999Z',
          correlationId: 'corr-😀-ü',
          causationId: 'cause-1',
          traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
          tracestate: 'vendor=a1,other=b2',
          headers: { 'x-unicode': 'ü😀✓', 'x-empty': '', 'X-Mixed-Case': 'Value' },
          payload: JSON.stringify({ text: 'héllo wörld ✓ 😀 \u2028 "quoted" \\ back', n: 1.5e-7, nested: { a: [1, null, true] } }),
        }),
        message(env, null, { headers: {}, payload: '{}' }),
        message(env, 'large', { payload: JSON.stringify({ blob: 'ü😀a'.repeat(Math.ceil(largeChars / 4)) }) }),
        message(env, 'proto', { headers: protoHeaders(), payload: '{"__proto__":{"polluted":true}}' }),
        message(env, 'spacing', { payload: '{ "b" : [1,2] , "a":"\\u00e9\\n" ,"c": 1.0 }' }),
        message(env, null, { occurredAt: '1999-12-31T23:59:59.001Z', payload: '"just a string"' }),
      ];
      await publishOk(env.transport, envelopes);
      await eventually(() => expect(unique(inbox.ids())).toEqual(sorted(envelopes.map((envelope) => envelope.messageId))), {
        timeoutMs: env.options.timeoutMs,
      });
      for (const expected of envelopes) {
        const got = inbox.received.find((item) => item.delivery.envelope.messageId === expected.messageId)!;
        expect(comparableEnvelope(got.delivery.envelope)).toEqual(comparableEnvelope(expected));
        expect(got.delivery.attempt).toBe(1);
      }
      expect(({} as Record<string, unknown>)['polluted']).toBeUndefined();
    },
  },
  {
    name: 'an ordered endpoint gets each key in publish order, one at a time, with concurrency 8',
    async run(env) {
      if (!env.transport.capabilities.orderingByKey) return env.skip('transport declares orderingByKey: false');
      const { orderedKeys, messagesPerKey } = env.options;
      const seen = new Map<string, string[]>();
      const active = new Set<string>();
      let overlaps = 0;
      await collect(env, { consumer: env.consumer('ordered'), ordered: true, concurrency: 8 }, async (delivery) => {
        const key = delivery.envelope.key ?? '';
        if (active.has(key)) overlaps += 1;
        active.add(key);
        await sleep(Math.floor(Math.random() * 3));
        const list = seen.get(key) ?? [];
        list.push(delivery.envelope.messageId);
        seen.set(key, list);
        active.delete(key);
        await delivery.ack();
      });
      const expected = new Map<string, string[]>();
      const envelopes: Envelope[] = [];
      // Runs of three messages per key, keys interleaved: neighbours in the queue share a key.
      for (let index = 0; index < messagesPerKey; index += 3) {
        for (let key = 0; key < orderedKeys; key += 1) {
          for (let run = index; run < Math.min(index + 3, messagesPerKey); run += 1) {
            const envelope = message(env, `key-${key}`);
            envelopes.push(envelope);
            expected.set(`key-${key}`, [...(expected.get(`key-${key}`) ?? []), envelope.messageId]);
          }
        }
      }
      const batch = Math.ceil(envelopes.length / 4);
      for (let start = 0; start < envelopes.length; start += batch) await publishOk(env.transport, envelopes.slice(start, start + batch));
      await eventually(
        () => {
          for (const [key, ids] of expected) expect(seen.get(key)).toEqual(ids);
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(overlaps).toBe(0);
    },
  },
  {
    name: "a killed connection's unsettled deliveries are redelivered to another connection, flagged redelivered",
    async run(env) {
      const consumer = env.consumer('crash');
      const doomed = await env.fixture.connect();
      const never = deferred();
      const held = await collect(env, { consumer, concurrency: 8 }, () => never.promise, doomed);
      const envelopes = [message(env, 'a'), message(env, 'b'), message(env, null)];
      await publishOk(env.transport, envelopes);
      const expected = sorted(envelopes.map((envelope) => envelope.messageId));
      await eventually(() => expect(unique(held.ids())).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      await env.fixture.kill(doomed);
      const survivor = await collect(env, { consumer });
      await eventually(() => expect(unique(survivor.ids())).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      expect(survivor.received.every((item) => item.delivery.attempt === 1)).toBe(true);
      // The consumer writes nothing before a handler's transaction unless a delivery is
      // flagged: a first delivery must say false, a copy whose holder died must say true.
      expect(held.received.map((item) => item.delivery.redelivered)).toEqual(held.received.map(() => false));
      expect(survivor.received.map((item) => item.delivery.redelivered)).toEqual(survivor.received.map(() => true));
    },
  },
  {
    name: "an ordered endpoint: a killed holder's unsettled deliveries reach the next holder flagged redelivered, in key order",
    async run(env) {
      if (!env.transport.capabilities.orderingByKey) return env.skip('transport declares orderingByKey: false');
      const consumer = env.consumer('crash-ordered');
      const doomed = await env.fixture.connect();
      const never = deferred();
      const held = await collect(env, { consumer, ordered: true, concurrency: 8 }, () => never.promise, doomed);
      const envelopes = [message(env, 'a'), message(env, 'b'), message(env, 'a')];
      await publishOk(env.transport, envelopes);
      // One at a time per key: the holder has the head of each key in hand.
      const heads = sorted([envelopes[0]!.messageId, envelopes[1]!.messageId]);
      await eventually(() => expect(sorted(unique(held.ids()))).toEqual(heads), { timeoutMs: env.options.timeoutMs });
      expect(held.received.map((item) => item.delivery.redelivered)).toEqual(held.received.map(() => false));
      await env.fixture.kill(doomed);
      const survivor = await collect(env, { consumer, ordered: true, concurrency: 8 });
      const expected = sorted(envelopes.map((envelope) => envelope.messageId));
      await eventually(() => expect(sorted(unique(survivor.ids()))).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      // Whatever the dead holder had in hand comes flagged (a transport that re-creates its
      // consumer on takeover must still say so); key order holds.
      for (const head of heads) {
        const first = survivor.received.find((item) => item.delivery.envelope.messageId === head);
        expect(first?.delivery.redelivered, `the held head ${head} must come back flagged redelivered`).toBe(true);
      }
      const ofA = survivor.ids().filter((id) => id === envelopes[0]!.messageId || id === envelopes[2]!.messageId);
      expect(ofA.indexOf(envelopes[0]!.messageId)).toBeLessThan(ofA.indexOf(envelopes[2]!.messageId));
    },
  },
  {
    name: 'two live instances of one ordered group: a key is never in two handlers at once and keeps its order; the survivor takes over when one dies',
    async run(env) {
      if (!env.transport.capabilities.orderingByKey) return env.skip('transport declares orderingByKey: false');
      // The ordered case above has one instance; services run several. Whatever the broker
      // does with two (one active consumer, partitions split, head-of-key claims), the key
      // must not be handled by both at once, and neither may see a key out of order.
      const consumer = env.consumer('two-live');
      const seen = new Map<string, string[]>();
      const active = new Set<string>();
      let overlaps = 0;
      const handle: Handle = async (delivery) => {
        const key = delivery.envelope.key ?? '';
        if (active.has(key)) overlaps += 1;
        active.add(key);
        await sleep(Math.floor(Math.random() * 4));
        seen.set(key, [...(seen.get(key) ?? []), delivery.envelope.messageId]);
        active.delete(key);
        await delivery.ack();
      };
      // Two connections of their own: the case's transport only publishes, so either may die.
      const connections = [await env.fixture.connect(), await env.fixture.connect()] as const;
      const instances = [
        await collect(env, { consumer, ordered: true, concurrency: 8 }, handle, connections[0]),
        await collect(env, { consumer, ordered: true, concurrency: 8 }, handle, connections[1]),
      ] as const;
      const expected = new Map<string, string[]>();
      const publishRound = async (round: number): Promise<void> => {
        const envelopes: Envelope[] = [];
        for (let index = 0; index < 6; index += 1) {
          for (let key = 0; key < 6; key += 1) {
            const envelope = message(env, `key-${key}`, { headers: { round: String(round) } });
            envelopes.push(envelope);
            expected.set(`key-${key}`, [...(expected.get(`key-${key}`) ?? []), envelope.messageId]);
          }
        }
        for (let start = 0; start < envelopes.length; start += 12) await publishOk(env.transport, envelopes.slice(start, start + 12));
      };
      // First occurrences: a broker may hand a message over again after a rebalance
      // (at least once), but never a later message of its key before it.
      const firstSeen = (key: string): string[] => [...new Set(seen.get(key) ?? [])];
      const arrived = async (): Promise<void> =>
        eventually(
          () => {
            for (const [key, ids] of expected) expect(firstSeen(key), `key ${key}`).toEqual(ids);
          },
          { timeoutMs: env.options.timeoutMs },
        );
      await publishRound(1);
      await arrived();
      expect(overlaps, 'a key was in two handlers at once across the two instances').toBe(0);
      // The instance that took most of the work dies; the live one takes over, no restart.
      const dying = instances[1].received.length >= instances[0].received.length ? 1 : 0;
      const survivor = instances[1 - dying]!;
      const before = survivor.received.length;
      await env.fixture.kill(connections[dying]);
      await publishRound(2);
      await arrived();
      expect(overlaps, 'a key was in two handlers at once during the takeover').toBe(0);
      expect(survivor.received.length, 'the live instance took over the group').toBeGreaterThan(before);
      await connections[1 - dying]!.close();
    },
  },
  {
    name: 'retry(delay) redelivers with attempt + 1 after about the delay, without blocking other messages',
    async run(env) {
      const { retryDelayMs, delayToleranceMs, timeoutMs } = env.options;
      const slow = message(env, null);
      let retriedAt = 0;
      const inbox = await collect(env, { consumer: env.consumer('retry') }, async (delivery) => {
        if (delivery.envelope.messageId === slow.messageId && delivery.attempt === 1) {
          retriedAt = Date.now();
          await delivery.retry(retryDelayMs, { code: 'CONFORMANCE_RETRY', message: 'try again later' });
          return;
        }
        await delivery.ack();
      });
      await publishOk(env.transport, [slow]);
      await eventually(() => expect(retriedAt).toBeGreaterThan(0), { timeoutMs });
      const others = [message(env, null), message(env, 'k'), message(env, null)];
      await publishOk(env.transport, others);
      const sent = Date.now();
      const redelivered = await eventually(
        () => {
          const found = inbox.received.find((item) => item.delivery.envelope.messageId === slow.messageId && item.delivery.attempt === 2);
          expect(found).toBeDefined();
          return found!;
        },
        { timeoutMs },
      );
      const arrivals = await eventually(
        () => {
          const found = others.map((other) => inbox.received.find((item) => item.delivery.envelope.messageId === other.messageId)?.at);
          expect(found.every((at) => at !== undefined)).toBe(true);
          return found as number[];
        },
        { timeoutMs },
      );
      // The others overtake the waiting retry. Only others the broker had confirmed before
      // the retry could come due can prove it: on a loaded machine their publish can take
      // longer than the delay, and then the redelivery may rightly come first.
      if (sent < retriedAt + retryDelayMs - delayToleranceMs) expect(Math.max(...arrivals)).toBeLessThanOrEqual(redelivered.at);
      if (env.transport.capabilities.nativeDelay) expect(redelivered.at - retriedAt).toBeGreaterThanOrEqual(retryDelayMs - delayToleranceMs);
    },
  },
  {
    name: 'retry on an ordered endpoint keeps the message in front of its key, frees its handler slot, and lets other keys flow',
    async run(env) {
      if (!env.transport.capabilities.orderingByKey) return env.skip('transport declares orderingByKey: false');
      const { timeoutMs } = env.options;
      // Long enough that, on a loaded machine, the other key is surely delivered within it.
      const delayMs = Math.max(env.options.retryDelayMs, 2_000);
      const first = message(env, 'k');
      const second = message(env, 'k');
      const other = message(env, 'other');
      const names = new Map([
        [first.messageId, 'first'],
        [second.messageId, 'second'],
        [other.messageId, 'other'],
      ]);
      // Concurrency 1: if the retried delivery kept its slot during the delay, nothing could run.
      const inbox = await collect(env, { consumer: env.consumer('ordered-retry'), ordered: true, concurrency: 1 }, async (delivery) => {
        if (delivery.envelope.messageId === first.messageId && delivery.attempt === 1) {
          await delivery.retry(delayMs, { code: 'CONFORMANCE_RETRY', message: 'keep my place' });
          return;
        }
        await delivery.ack();
      });
      await publishOk(env.transport, [first, second, other]);
      const seen = () => inbox.received.map((item) => `${names.get(item.delivery.envelope.messageId)}@${item.delivery.attempt}`);
      await eventually(() => expect(seen()).toEqual(expect.arrayContaining(['first@2', 'second@1', 'other@1'])), { timeoutMs: timeoutMs + delayMs });
      const ofKey = seen().filter((name) => !name.startsWith('other'));
      expect(ofKey).toEqual(['first@1', 'first@2', 'second@1']);
      // A retry in place is no redelivery: nothing died with the message in hand.
      expect(inbox.received.map((item) => item.delivery.redelivered)).toEqual(inbox.received.map(() => false));
      expect(seen().indexOf('other@1')).toBeLessThan(seen().indexOf('first@2'));
    },
  },
  {
    // A subscription lives for days; anything it adds per retry to a long-lived object (an
    // 'abort' listener on its stop signal, left behind by a sleep that ended by its timer)
    // grows without end. Node reports the eleventh listener on one signal as a
    // MaxListenersExceededWarning, so fifteen retries one after another show a leak.
    name: 'retries one after another leave nothing behind on the subscription (no listener piles up)',
    async run(env) {
      const ordered = env.transport.capabilities.orderingByKey;
      const warnings = watchListenerWarnings();
      try {
        const count = 15;
        const inbox = await collect(env, { consumer: env.consumer('sequential-retries'), ordered, concurrency: 1 }, async (delivery) => {
          if (delivery.attempt === 1) await delivery.retry(10, { code: 'CONFORMANCE_RETRY', message: 'again' });
          else await delivery.ack();
        });
        const retried = () => inbox.received.filter((item) => item.delivery.attempt === 2).length;
        // One message at a time, the next published once the last came back: a transport may
        // (and should) run a retry's delay outside the handler slot, so messages published
        // together would have their retries pending at once — that is the next case.
        for (let index = 0; index < count; index += 1) {
          await publishOk(env.transport, [message(env, 'one-key')]);
          await eventually(() => expect(retried()).toBe(index + 1), { timeoutMs: env.options.timeoutMs });
        }
        // Node emits the warning on the tick after the listener that crossed the limit.
        await new Promise((resolve) => setImmediate(resolve));
        expect(warnings.seen).toEqual([]);
      } finally {
        warnings.stop();
      }
    },
  },
  {
    // Many retries pending at once is the normal state of a busy consumer whose downstream
    // is down. Each pending retry may hold something while it waits; what it must not do is
    // hang a listener per retry on one long-lived signal: past ten, Node prints "Possible
    // EventTarget memory leak detected" into the user's logs for a consumer that leaks nothing.
    name: 'many retries pending at once print no listener-leak warning',
    async run(env) {
      const warnings = watchListenerWarnings();
      try {
        const count = 24;
        const inbox = await collect(env, { consumer: env.consumer('concurrent-retries'), ordered: false, concurrency: count }, async (delivery) => {
          if (delivery.attempt === 1) await delivery.retry(500, { code: 'CONFORMANCE_RETRY', message: 'downstream away' });
          else await delivery.ack();
        });
        await publishOk(
          env.transport,
          Array.from({ length: count }, () => message(env, null)),
        );
        const retried = () => inbox.received.filter((item) => item.delivery.attempt === 2).length;
        await eventually(() => expect(retried()).toBe(count), { timeoutMs: env.options.timeoutMs * 2 });
        await new Promise((resolve) => setImmediate(resolve));
        expect(warnings.seen).toEqual([]);
      } finally {
        warnings.stop();
      }
    },
  },
  {
    name: 'deadLetter keeps the reason and the attempt; dead letters replay and purge',
    async run(env) {
      const deadLetters = env.transport.deadLetters;
      if (!env.transport.capabilities.nativeDeadLetter || !deadLetters) {
        return env.skip('transport declares nativeDeadLetter: false (the core keeps dead letters elsewhere)');
      }
      const consumer = env.consumer('dead');
      const poison = message(env, 'p');
      let accepting = false;
      const accepted: Delivery[] = [];
      await collect(env, { consumer }, async (delivery) => {
        if (accepting) {
          accepted.push(delivery);
          await delivery.ack();
        } else if (delivery.attempt === 1) {
          await delivery.retry(0, { code: 'CONFORMANCE_RETRY', message: 'once more' });
        } else {
          await delivery.deadLetter({ code: 'CONFORMANCE_POISON', message: 'poison ü😀' });
        }
      });
      const before = Date.now();
      await publishOk(env.transport, [poison]);
      const letter = await eventually(
        async () => {
          const list = await deadLetters.list(consumer);
          expect(list).toHaveLength(1);
          return list[0]!;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(letter.consumer).toBe(consumer);
      // Operators copy the id into `courier dead show|replay|purge dlq:<consumer>:<id>`: a
      // newline in it (Service Bus ids were `<topic>\n<sequence>`) made every reference invalid.
      expect(letter.id, 'a dead letter id is one printable token (no whitespace or control characters)').toMatch(DEAD_LETTER_ID);
      expect(comparableEnvelope(letter.envelope)).toEqual(comparableEnvelope(poison));
      expect(letter.reason).toEqual({ code: 'CONFORMANCE_POISON', message: 'poison ü😀' });
      expect(letter.attempt).toBe(2);
      expect(letter.deadAt.getTime()).toBeGreaterThanOrEqual(before - 60_000);
      if (deadLetters.count) {
        // A depth the broker keeps, read without taking the letter: the listing still has it.
        await eventually(async () => expect(await deadLetters.count!(consumer)).toBe(1), { timeoutMs: env.options.timeoutMs });
        expect((await deadLetters.list(consumer)).map((item) => item.id)).toEqual([letter.id]);
      }

      accepting = true;
      expect(await deadLetters.replay(consumer, [letter.id])).toBe(1);
      await eventually(() => expect(accepted.map((delivery) => delivery.envelope.messageId)).toEqual([poison.messageId]), {
        timeoutMs: env.options.timeoutMs,
      });
      expect(accepted[0]!.attempt).toBe(1);
      await eventually(async () => expect(await deadLetters.list(consumer)).toEqual([]), { timeoutMs: env.options.timeoutMs });

      accepting = false;
      const second = message(env, 'q');
      await publishOk(env.transport, [second]);
      const again = await eventually(
        async () => {
          const list = await deadLetters.list(consumer);
          expect(list.map((item) => item.envelope.messageId)).toEqual([second.messageId]);
          return list[0]!;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await deadLetters.purge(consumer, [again.id])).toBe(1);
      await eventually(async () => expect(await deadLetters.list(consumer)).toEqual([]), { timeoutMs: env.options.timeoutMs });
    },
  },
  {
    // Operator commands ask before they read (packages/cli requireDeadLetterPlaces): without
    // it a mistyped prefix or consumer name reads as "no dead letters", exit 0.
    name: 'deadLetters.exists is false for a consumer that never subscribed, true once it has, and asking creates nothing',
    async run(env) {
      const exists = env.transport.deadLetters?.exists?.bind(env.transport.deadLetters);
      if (!env.transport.capabilities.nativeDeadLetter || !exists) {
        return env.skip('transport has no deadLetters.exists (the CLI cannot tell a mistyped name from an empty dead-letter place)');
      }
      const never = env.consumer('never');
      expect(await exists(never)).toBe(false);
      // The first question declared nothing that would make the second one true.
      expect(await exists(never)).toBe(false);
      if (env.transport.deadLetters!.count) expect(await env.transport.deadLetters!.count(never)).toBe(0);
      expect(await exists(never)).toBe(false);
      const consumer = env.consumer('known');
      await collect(env, { consumer });
      await eventually(async () => expect(await exists(consumer)).toBe(true), { timeoutMs: env.options.timeoutMs });
      expect(await exists(never)).toBe(false);
    },
  },
  {
    // Issue 36: `courier stats` and the console show a consumer's lag at the broker where
    // the transport can read it without consuming; the read must not take or create anything.
    name: 'consumerLag counts what waits for a consumer while it is away, and reading it takes and creates nothing',
    async run(env) {
      const lag = env.transport.consumerLag?.bind(env.transport);
      if (!lag) return env.skip('transport has no consumerLag (operator tools show its lag at the broker as not available)');
      const never = env.consumer('never-lagging');
      expect(await lag(never)).toBeNull();
      // The first question declared nothing that would answer the second.
      expect(await lag(never)).toBeNull();
      const consumer = env.consumer('away');
      const first = await collect(env, { consumer });
      await first.subscription.close();
      const waiting = [message(env, null), message(env, null), message(env, null)];
      expect((await env.transport.publish(waiting)).every((result) => result.ok)).toBe(true);
      await eventually(async () => expect(await lag(consumer)).toBe(waiting.length), { timeoutMs: env.options.timeoutMs });
      expect(await lag(consumer)).toBe(waiting.length);
      // The count follows what is published meanwhile.
      const later = [message(env, null), message(env, null)];
      expect((await env.transport.publish(later)).every((result) => result.ok)).toBe(true);
      waiting.push(...later);
      await eventually(async () => expect(await lag(consumer)).toBe(waiting.length), { timeoutMs: env.options.timeoutMs });
      // Reading took nothing: back, the consumer receives all five, and then nothing waits.
      const back = await collect(env, { consumer });
      await eventually(() => expect(sorted(back.ids())).toEqual(sorted(waiting.map((item) => item.messageId))), { timeoutMs: env.options.timeoutMs });
      await eventually(async () => expect(await lag(consumer)).toBe(0), { timeoutMs: env.options.timeoutMs });
      await back.subscription.close();
      expect(await lag(never)).toBeNull();
    },
  },
  {
    // The core hands every transport reasons of at most REASON_LIMITS (and the port doc says
    // so): a transport must keep one at exactly the limit whole — multi-byte characters
    // counted in UTF-8 bytes, as a TEXT column, a header or a frame counts them.
    name: 'deadLetter with a reason at exactly REASON_LIMITS (multi-byte characters) is accepted and listed with that reason',
    async run(env) {
      const deadLetters = env.transport.deadLetters;
      if (!env.transport.capabilities.nativeDeadLetter || !deadLetters) {
        return env.skip('transport declares nativeDeadLetter: false (the core keeps dead letters elsewhere)');
      }
      const consumer = env.consumer('dead-at-limit');
      const reason = { code: atByteLimit('C', 'é', REASON_LIMITS.codeBytes), message: atByteLimit('m', 'ü😀€', REASON_LIMITS.messageBytes) };
      expect(Buffer.byteLength(reason.code, 'utf8')).toBe(REASON_LIMITS.codeBytes);
      expect(Buffer.byteLength(reason.message, 'utf8')).toBe(REASON_LIMITS.messageBytes);
      await collect(env, { consumer }, (delivery) => delivery.deadLetter(reason));
      const poison = message(env, 'limit');
      await publishOk(env.transport, [poison]);
      const letter = await eventually(
        async () => {
          const list = await deadLetters.list(consumer);
          expect(list).toHaveLength(1);
          return list[0]!;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(letter.envelope.messageId).toBe(poison.messageId);
      expect(letter.reason.code === reason.code, 'the code is kept whole').toBe(true);
      expect(letter.reason.message === reason.message, `the message is kept whole (listed ${Buffer.byteLength(letter.reason.message, 'utf8')} bytes)`).toBe(true);
    },
  },
  {
    // The consumer runs a replay under the replay's own inbox key and takes an unmarked copy
    // of a message it dead-lettered for a relay duplicate: a retry that dropped the mark
    // would be acknowledged without running, and the replay lost.
    name: 'a replayed delivery stays marked replayed on the copies its retries produce',
    async run(env) {
      const deadLetters = env.transport.deadLetters;
      if (!env.transport.capabilities.nativeDeadLetter || !deadLetters) {
        return env.skip('transport declares nativeDeadLetter: false (nothing can be replayed)');
      }
      const consumer = env.consumer('replay-retry');
      const parked = message(env, 'r');
      let replaying = false;
      const runs: Delivery[] = [];
      await collect(env, { consumer }, async (delivery) => {
        if (!replaying) return delivery.deadLetter({ code: 'CONFORMANCE_POISON', message: 'park it' });
        runs.push(delivery);
        if (delivery.attempt < 3) return delivery.retry(0, { code: 'CONFORMANCE_RETRY', message: 'once more' });
        return delivery.ack();
      });
      await publishOk(env.transport, [parked]);
      const letter = await eventually(
        async () => {
          const list = await deadLetters.list(consumer);
          expect(list).toHaveLength(1);
          return list[0]!;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      replaying = true;
      expect(await deadLetters.replay(consumer, [letter.id])).toBe(1);
      await eventually(() => expect(runs.map((delivery) => delivery.attempt)).toEqual([1, 2, 3]), { timeoutMs: env.options.timeoutMs * 2 });
      expect(runs.map((delivery) => delivery.replayed === true)).toEqual([true, true, true]);
    },
  },
  {
    // The operations guide promises a replay reaches the one consumer it is replayed for. A
    // copy handed to every group of the topic is run again by any group whose inbox record
    // was pruned (issue 29: Service Bus published replays to the topic).
    name: "a replay reaches only the consumer it was replayed for, not the topic's other groups",
    async run(env) {
      const deadLetters = env.transport.deadLetters;
      if (!env.transport.capabilities.nativeDeadLetter || !deadLetters) {
        return env.skip('transport declares nativeDeadLetter: false (nothing can be replayed)');
      }
      if (env.transport.capabilities.fanOut === false) {
        return env.skip('transport declares fanOut: false (a topic has one group, so there is no other group to keep the replay from)');
      }
      const parking = env.consumer('replay-own');
      const bystander = env.consumer('replay-other');
      // Ordered where the transport keeps a key's order: the marker published after the
      // replay then reaches the bystander after any copy of the replay would have.
      const ordered = env.transport.capabilities.orderingByKey;
      const parked = message(env, 'replay-only');
      let replaying = false;
      const replays = await collect(env, { consumer: parking, ordered, concurrency: 1 }, async (delivery) =>
        replaying ? delivery.ack() : delivery.deadLetter({ code: 'CONFORMANCE_POISON', message: 'park it' }),
      );
      const other = await collect(env, { consumer: bystander, ordered, concurrency: 1 });
      await publishOk(env.transport, [parked]);
      await eventually(() => expect(other.ids()).toEqual([parked.messageId]), { timeoutMs: env.options.timeoutMs });
      const letter = await eventually(
        async () => {
          const list = await deadLetters.list(parking);
          expect(list).toHaveLength(1);
          return list[0]!;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      replaying = true;
      expect(await deadLetters.replay(parking, [letter.id])).toBe(1);
      await eventually(() => expect(replays.received.filter((item) => item.delivery.replayed === true)).toHaveLength(1), { timeoutMs: env.options.timeoutMs });
      const marker = message(env, 'replay-only');
      await publishOk(env.transport, [marker]);
      await eventually(() => expect(other.ids()).toContain(marker.messageId), { timeoutMs: env.options.timeoutMs });
      expect(
        other.received.map((item) => [item.delivery.envelope.messageId, item.delivery.replayed === true]),
        `consumer ${bystander} must not be handed the replay meant for ${parking}`,
      ).toEqual([
        [parked.messageId, false],
        [marker.messageId, false],
      ]);
    },
  },
  {
    name: 'competing consumers of one group split the work',
    async run(env) {
      const { first, second, other } = await competingInstances(env);
      const envelopes = Array.from({ length: 20 }, (_, index) => message(env, `k${index}`));
      await publishOk(env.transport, envelopes);
      const expected = sorted(envelopes.map((envelope) => envelope.messageId));
      await eventually(() => expect(unique([...first.ids(), ...second.ids()])).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      expect(first.received.length).toBeGreaterThan(0);
      expect(second.received.length).toBeGreaterThan(0);
      await other.close();
    },
  },
  {
    name: 'two groups each get everything, while the instances of one of them split the work',
    async run(env) {
      if (env.transport.capabilities.fanOut === false) {
        return env.skip('transport declares fanOut: false (one queue per topic: every receiver competes, whatever its group; the bus refuses a second group on a topic)');
      }
      const { first, second, other } = await competingInstances(env);
      const everything = await collect(env, { consumer: env.consumer('all') });
      const envelopes = Array.from({ length: 20 }, (_, index) => message(env, `k${index}`));
      await publishOk(env.transport, envelopes);
      const expected = sorted(envelopes.map((envelope) => envelope.messageId));
      await eventually(
        () => {
          expect(unique([...first.ids(), ...second.ids()])).toEqual(expected);
          expect(unique(everything.ids())).toEqual(expected);
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(first.received.length).toBeGreaterThan(0);
      expect(second.received.length).toBeGreaterThan(0);
      await other.close();
    },
  },
  {
    name: 'a message the broker refuses does not fail its neighbours',
    async run(env) {
      const rejectPublish = env.fixture.rejectPublish?.bind(env.fixture);
      if (!rejectPublish) return env.skip('the fixture offers no rejectPublish() to make the broker refuse one message');
      const inbox = await collect(env, { consumer: env.consumer('nack') });
      const [good, bad, alsoGood] = [message(env, 'k'), message(env, 'k'), message(env, null)];
      await rejectPublish((envelope) => envelope.messageId === bad.messageId);
      const results = await env.transport.publish([good, bad, alsoGood]);
      expect(results.map((result) => [result.messageId, result.ok])).toEqual([
        [good.messageId, true],
        [bad.messageId, false],
        [alsoGood.messageId, true],
      ]);
      const refused = results[1]!;
      expect(!refused.ok && refused.error).toBeInstanceOf(CourierError);
      await eventually(() => expect(unique(inbox.ids())).toEqual(sorted([good.messageId, alsoGood.messageId])), {
        timeoutMs: env.options.timeoutMs,
      });
    },
  },
  {
    name: 'a message the broker refuses for its content fails alone; its batch neighbours are confirmed',
    async run(env) {
      const refusable = env.fixture.refusable?.bind(env.fixture);
      if (!refusable) return env.skip('the fixture offers no refusable() to build a message the broker refuses for its content');
      const inbox = await collect(env, { consumer: env.consumer('refused') });
      const poison = refusable(message(env, 'b'));
      const batch = [message(env, 'a'), poison, message(env, 'c'), message(env, null)];
      const results = await env.transport.publish(batch);
      expect(results.map((result) => [result.messageId, result.ok])).toEqual(batch.map((envelope) => [envelope.messageId, envelope !== poison]));
      const refused = results[1]!;
      expect(!refused.ok && refused.error).toBeInstanceOf(CourierError);
      // A connectivity code would make the relay release it without counting an attempt and
      // pause: the message would be sent again and again, holding its batch back each time.
      const code = refused.ok ? '' : refused.error.code;
      expect(CONNECTIVITY_CODES.has(code), `refused with connectivity code '${code}'`).toBe(false);
      // Sent again, it still fails alone and the transport keeps working.
      const later = message(env, 'd');
      const again = await env.transport.publish([poison, later]);
      expect(again.map((result) => [result.messageId, result.ok])).toEqual([
        [poison.messageId, false],
        [later.messageId, true],
      ]);
      const expected = sorted([...batch.filter((envelope) => envelope !== poison), later].map((envelope) => envelope.messageId));
      await eventually(() => expect(unique(inbox.ids())).toEqual(expected), { timeoutMs: env.options.timeoutMs });
    },
  },
  {
    name: 'with ordered pipelining, a message refused for its content stops the later messages of its key in that call',
    async run(env) {
      if (!env.transport.capabilities.orderedPipelining) return env.skip('transport declares orderedPipelining: false (the relay sends one message per key at a time)');
      const refusable = env.fixture.refusable?.bind(env.fixture);
      if (!refusable) return env.skip('the fixture offers no refusable() to build a message the broker refuses for its content');
      const inbox = await collect(env, { consumer: env.consumer('pipelined') });
      const [first, poison, after, other] = [message(env, 'k'), refusable(message(env, 'k')), message(env, 'k'), message(env, 'o')];
      const results = await env.transport.publish([first, poison, after, other]);
      expect(results.map((result) => [result.messageId, result.ok])).toEqual([
        [first.messageId, true],
        [poison.messageId, false],
        [after.messageId, false],
        [other.messageId, true],
      ]);
      // A later message of the key arrives after anything of the call could have: `after` never does.
      const marker = message(env, 'k');
      await publishOk(env.transport, [marker]);
      await eventually(() => expect(unique(inbox.ids())).toEqual(sorted([first.messageId, other.messageId, marker.messageId])), { timeoutMs: env.options.timeoutMs });
      expect(inbox.ids()).not.toContain(after.messageId);
    },
  },
  {
    // The outbox calls `validate` at publish() and refuses there, so what it lets through
    // must be deliverable, and `publish` must refuse what it names (an envelope written
    // before validate existed, or by another producer) alone, never sending it.
    name: 'validate names no problem for a plain envelope; an envelope refused by validate is refused by publish alone',
    async run(env) {
      const validate = env.transport.validate?.bind(env.transport);
      if (!validate) return env.skip('transport has no validate() (nothing it refuses whatever its state)');
      const plain = [
        message(env, 'k'),
        message(env, null, { headers: { 'x-courier-test': 'value', Plain: '' }, correlationId: 'corr', causationId: 'cause' }),
      ];
      for (const envelope of plain) expect(validate(envelope), `validate(${JSON.stringify(envelope.headers)})`).toEqual([]);
      const refusedByValidate = env.fixture.refusedByValidate?.bind(env.fixture);
      if (!refusedByValidate) return env.skip('the fixture offers no refusedByValidate() to build an envelope validate refuses');
      const ordered = env.transport.capabilities.orderingByKey;
      const inbox = await collect(env, { consumer: env.consumer('validate'), ordered, concurrency: 1 });
      const invalid = refusedByValidate(message(env, 'k'));
      const problems = validate(invalid);
      expect(problems.length, 'validate must name a problem with the fixture\'s refusedByValidate() copy').toBeGreaterThan(0);
      for (const problem of problems) expect(problem.trim(), 'each problem is a sentence, not empty').not.toBe('');
      const [before, after] = plain;
      const results = await env.transport.publish([before!, invalid, after!]);
      expect(results.map((result) => [result.messageId, result.ok])).toEqual([
        [before!.messageId, true],
        [invalid.messageId, false],
        [after!.messageId, true],
      ]);
      const refused = results[1]!;
      const error = refused.ok ? undefined : refused.error;
      expect(error).toBeInstanceOf(CourierError);
      // Sending it again never helps: not retriable, not a connectivity code (the relay would
      // release it without an attempt and send it again for ever), and it names the problems.
      expect(error?.retriable, `refused with retriable ${String(error?.retriable)}`).toBe(false);
      expect(CONNECTIVITY_CODES.has(error?.code ?? ''), `refused with connectivity code '${error?.code}'`).toBe(false);
      for (const problem of problems) expect(error?.message).toContain(problem);
      const marker = message(env, 'k');
      await publishOk(env.transport, [marker]);
      const expected = sorted([before!.messageId, after!.messageId, marker.messageId]);
      await eventually(() => expect(unique(inbox.ids())).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      expect(inbox.ids()).not.toContain(invalid.messageId);
    },
  },
  {
    // Anything may be on a topic (another producer, a client of an older release). The
    // Transport contract: a message that is not an envelope never reaches a handler; it is
    // dead-lettered with ENVELOPE_INVALID (or kept aside), and an operator's list of dead
    // letters still answers (it may leave out an entry that has no envelope to show).
    name: 'a message that is not a valid envelope never reaches a handler, does not hold back the messages after it, and the dead-letter list still answers',
    async run(env) {
      const publishMalformed = env.fixture.publishMalformed?.bind(env.fixture);
      if (!publishMalformed) return env.skip('the fixture offers no publishMalformed() to put a message that is not an envelope on the broker');
      const consumer = env.consumer('malformed');
      const inbox = await collect(env, { consumer, concurrency: 1 });
      await publishMalformed(env.topic);
      const after = [message(env, null), message(env, 'k')];
      await publishOk(env.transport, after);
      const expected = sorted(after.map((envelope) => envelope.messageId));
      await eventually(() => expect(unique(inbox.ids())).toEqual(expected), { timeoutMs: env.options.timeoutMs });
      // Later messages still flow: the malformed one is not put back in front of them.
      const marker = message(env, null);
      await publishOk(env.transport, [marker]);
      await eventually(() => expect(unique(inbox.ids())).toEqual(sorted([...expected, marker.messageId])), { timeoutMs: env.options.timeoutMs });
      const deadLetters = env.transport.deadLetters;
      if (deadLetters) {
        const listed = await deadLetters.list(consumer);
        expect(listed.map((letter) => letter.reason.code), 'what the list shows for the malformed message').toEqual(listed.map(() => 'ENVELOPE_INVALID'));
      }
    },
  },
  {
    // The relay aborts its publish signal when it stops or its sending deadline passes, and
    // releases what was not sent without counting an attempt. A transport that answers an
    // aborted call with results instead, or sends anyway, makes a stopping relay publish
    // after it gave the rows back (issue 30, guess 8: RabbitMQ answered with results).
    name: 'publish with an already-aborted signal rejects with ABORTED and sends nothing',
    async run(env) {
      const ordered = env.transport.capabilities.orderingByKey;
      const inbox = await collect(env, { consumer: env.consumer('aborted'), ordered, concurrency: 1 });
      const controller = new AbortController();
      controller.abort(new Error('the relay stopped'));
      const unsent = [message(env, 'k'), message(env, 'k')];
      const failure = await env.transport.publish(unsent, { signal: controller.signal }).then(
        (results) => ({ results }),
        (error: unknown) => error,
      );
      expect(failure, 'publish with an aborted signal must reject, not answer with results').toBeInstanceOf(TransportError);
      expect(failure, 'the Transport contract: code ABORTED, retriable (nothing about the messages was wrong)').toMatchObject({ code: 'ABORTED', retriable: true });
      // A later message of the same key arrives after anything of the aborted call could
      // have (where the transport keeps a key's order): neither unsent message ever does.
      const marker = message(env, 'k');
      await publishOk(env.transport, [marker]);
      await eventually(() => expect(inbox.ids()).toContain(marker.messageId), { timeoutMs: env.options.timeoutMs });
      expect(unique(inbox.ids()), 'a message of the aborted call was sent').toEqual([marker.messageId]);
    },
  },
  {
    name: 'during an outage publish rejects with a retriable error, and works again after',
    async run(env) {
      const outage = env.fixture.outage;
      if (!outage) return env.skip('the fixture offers no outage() to make the broker unavailable');
      const inbox = await collect(env, { consumer: env.consumer('outage') });
      const envelope = message(env, 'k');
      await outage.begin();
      let failure: unknown;
      try {
        await env.transport.publish([envelope]);
      } catch (error) {
        failure = error;
      } finally {
        await outage.end();
      }
      expect(failure, 'publish must reject while the broker is unavailable').toBeInstanceOf(Error);
      expect(isRetriable(failure)).toBe(true);
      await eventually(() => publishOk(env.transport, [envelope]), { timeoutMs: env.options.timeoutMs, intervalMs: 200 });
      await eventually(() => expect(unique(inbox.ids())).toEqual([envelope.messageId]), { timeoutMs: env.options.timeoutMs });
    },
  },
  {
    name: 'close is idempotent and waits for handlers in flight; publish after close rejects',
    async run(env) {
      const connection = await env.fixture.connect();
      const release = deferred();
      const started = deferred();
      const inbox = await collect(
        env,
        { consumer: env.consumer('close') },
        async (delivery) => {
          started.resolve();
          await release.promise;
          await delivery.ack();
        },
        connection,
      );
      await publishOk(env.transport, [message(env, null)]);
      await started.promise;
      let closed = false;
      const closing = connection.close().then(() => {
        closed = true;
      });
      const closingAgain = connection.close();
      await Promise.race([closing, sleep(100)]);
      expect(closed, 'close() resolved while a handler was still running').toBe(false);
      release.resolve();
      await Promise.all([closing, closingAgain]);
      await connection.close();
      await inbox.subscription.close();
      await expect(connection.publish([message(env, null)])).rejects.toThrow();
    },
  },
  {
    // A service shutting down while a consumer is still being subscribed (the bus retries a
    // subscribe in the background during an outage) must end with nothing receiving: a
    // subscription that comes alive after close() resolved would take messages of its group
    // on a connection nobody settles, or hold an ordered group's single active slot.
    name: 'a subscribe racing close leaves nothing receiving; publish and subscribe after close reject with ClosedError',
    async run(env) {
      const connection = await env.fixture.connect();
      const consumer = env.consumer('close-race');
      const zombie: string[] = [];
      // Its outcome is taken at once: a rejection that waited for the close would be unhandled.
      const racing = connection
        .subscribe({ topics: [env.topic], consumer, ordered: false, concurrency: 4 }, async (delivery) => {
          zombie.push(delivery.envelope.messageId);
          await delivery.ack();
        })
        .then(
          (subscription) => ({ subscription }),
          (error: unknown) => ({ error }),
        );
      await connection.close();
      const raced = await racing;
      if ('error' in raced) {
        expect(raced.error, 'a subscribe that close overtook rejects with ClosedError').toMatchObject({ code: 'CLOSED' });
      } else {
        // Resolved before the close took hold: the close must have ended it.
        await raced.subscription.close();
      }
      await expect(connection.publish([message(env, null)]), 'publish after close').rejects.toMatchObject({ code: 'CLOSED' });
      await expect(
        connection.subscribe({ topics: [env.topic], consumer, ordered: false, concurrency: 1 }, async (delivery) => delivery.ack()),
        'subscribe after close',
      ).rejects.toMatchObject({ code: 'CLOSED' });
      // Every message of the group reaches the live subscriber: nothing of the closed
      // connection is still in the group taking its share.
      const live = await collect(env, { consumer });
      const envelopes = Array.from({ length: 10 }, () => message(env, null));
      await publishOk(env.transport, envelopes);
      await eventually(() => expect(unique(live.ids())).toEqual(sorted(envelopes.map((envelope) => envelope.messageId))), { timeoutMs: env.options.timeoutMs });
      expect(zombie).toEqual([]);
    },
  },
  {
    name: 'a payload over maxMessageBytes is refused in its result, neighbours unaffected',
    async run(env) {
      const { maxMessageBytes } = env.transport.capabilities;
      if (maxMessageBytes > env.options.maxOversizeBytes) {
        return env.skip(`maxMessageBytes ${maxMessageBytes} is above maxOversizeBytes ${env.options.maxOversizeBytes}; too large to build in a test`);
      }
      await collect(env, { consumer: env.consumer('oversize') });
      const [small, big, alsoSmall] = [message(env, null), message(env, null, { payload: JSON.stringify('a'.repeat(maxMessageBytes)) }), message(env, null)];
      const results = await env.transport.publish([small, big, alsoSmall]);
      expect(results.map((result) => [result.messageId, result.ok])).toEqual([
        [small.messageId, true],
        [big.messageId, false],
        [alsoSmall.messageId, true],
      ]);
    },
  },
];
