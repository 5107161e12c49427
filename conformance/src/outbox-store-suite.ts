import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError, CourierError, ENVELOPE_LIMITS, InMemoryBroker, createBus, defineMessage, type ClaimedBatch, type PublishOptions, type Envelope, type OutboxAppend, type OutboxStore } from '@courier/core';
import { expect } from 'vitest';
import type { StoreFixture, StoreFixtureFactory } from './fixtures.js';
import { atLimit, tighter } from './support/at-limit.js';
import { deferred } from './support/deferred.js';
import { eventually } from './support/eventually.js';
import { idVariants } from './support/id-variants.js';
import { comparableEnvelope, makeEnvelope, protoHeaders } from './support/make-envelope.js';
import { caseTimeoutMs, describeCases, type CaseControls, type CaseSetup, type SuiteCase } from './support/run-cases.js';
import { uniqueId } from './support/unique-id.js';

/** Per-suite settings of {@link describeOutboxStore}. */
export interface OutboxStoreSuiteOptions {
  /** Lease used by cases that wait for a lease to expire. Default 300 ms. */
  readonly shortLeaseMs?: number;
  /** Delay used by the delay, notBefore and retry cases. Default 300 ms. */
  readonly delayMs?: number;
  /** How far the database clock may run ahead of the test's clock when delays are checked. Default 100 ms. */
  readonly clockToleranceMs?: number;
  /** Bound of every `eventually` wait. Default 10 s. */
  readonly timeoutMs?: number;
  /** Concurrent claimers in the no-overlap case. Default 8. */
  readonly claimers?: number;
  /** Rows in the no-overlap case. Default 200. */
  readonly rows?: number;
  /** Payload size of the large round-trip message, in characters. Default 256 KiB. */
  readonly largePayloadChars?: number;
}

/** What an outbox case works with. */
export interface OutboxCaseEnv<Tx> extends CaseControls {
  readonly fixture: StoreFixture<Tx>;
  readonly outbox: OutboxStore<Tx>;
  /** The case's topic, derived from its test id. */
  readonly topic: string;
  readonly options: Required<OutboxStoreSuiteOptions>;
}

/** One outbox case; generic in the store's unit-of-work type. */
export interface OutboxStoreCase {
  readonly name: string;
  run<Tx>(env: OutboxCaseEnv<Tx>): Promise<void>;
}

const DEFAULTS: Required<OutboxStoreSuiteOptions> = {
  shortLeaseMs: 300,
  delayMs: 300,
  clockToleranceMs: 100,
  timeoutMs: 10_000,
  claimers: 8,
  rows: 200,
  largePayloadChars: 256 * 1024,
};

const LONG_LEASE_MS = 60_000;

/**
 * Registers the outbox store conformance suite: a vitest `describe` with every case of
 * {@link outboxStoreCases}, each against a fresh fixture from `factory` (unique test id)
 * that is closed afterwards. Call it from the store's own test file.
 */
export function describeOutboxStore<Tx>(name: string, factory: StoreFixtureFactory<Tx>, options: OutboxStoreSuiteOptions = {}): void {
  const settings = { ...DEFAULTS, ...options };
  const cases: SuiteCase<OutboxCaseEnv<Tx>>[] = outboxStoreCases.map((testCase) => ({ name: testCase.name, run: (env) => testCase.run(env) }));
  const unknown = outboxOperationsCaseNames.filter((caseName) => !cases.some((testCase) => testCase.name === caseName));
  if (unknown.length > 0) throw new Error(`outboxOperationsCaseNames names no case: ${unknown.map((caseName) => `'${caseName}'`).join(', ')}`);
  const operations = new Set(outboxOperationsCaseNames);
  const setup: CaseSetup<OutboxCaseEnv<Tx>> = async (context, controls) => {
    const fixture = await factory(context);
    const env: OutboxCaseEnv<Tx> = { ...controls, fixture, outbox: fixture.outbox, topic: `${context.testId}.outbox`, options: settings };
    return { env, close: () => fixture.close() };
  };
  // Two groups, so a store author certifies the engine (what the relay needs) before the operations.
  describeCases(`outbox-store(${name}) engine`, cases.filter((testCase) => !operations.has(testCase.name)), setup, caseTimeoutMs(settings.timeoutMs));
  describeCases(`outbox-store(${name}) operations`, cases.filter((testCase) => operations.has(testCase.name)), setup, caseTimeoutMs(settings.timeoutMs));
}

/**
 * Registers only the named cases of {@link outboxStoreCases}, as {@link describeOutboxStore}
 * registers them all (fresh fixture per case, the same settings), so an adapter can hold a
 * fixture built for one check — a driver with its statement log on, say — to the kit's
 * own case. A name that matches no case is an error, not an empty suite.
 */
export function describeOutboxStoreCases<Tx>(name: string, factory: StoreFixtureFactory<Tx>, caseNames: readonly string[], options: OutboxStoreSuiteOptions = {}): void {
  const settings = { ...DEFAULTS, ...options };
  const unknown = caseNames.filter((caseName) => !outboxStoreCases.some((testCase) => testCase.name === caseName));
  if (unknown.length > 0 || caseNames.length === 0) throw new Error(`describeOutboxStoreCases: no outbox case is named ${unknown.map((caseName) => `'${caseName}'`).join(', ') || '(no names given)'}`);
  const cases: SuiteCase<OutboxCaseEnv<Tx>>[] = outboxStoreCases.filter((testCase) => caseNames.includes(testCase.name)).map((testCase) => ({ name: testCase.name, run: (env) => testCase.run(env) }));
  const setup: CaseSetup<OutboxCaseEnv<Tx>> = async (context, controls) => {
    const fixture = await factory(context);
    const env: OutboxCaseEnv<Tx> = { ...controls, fixture, outbox: fixture.outbox, topic: `${context.testId}.outbox`, options: settings };
    return { env, close: () => fixture.close() };
  };
  describeCases(`outbox-store(${name}) selected`, cases, setup, caseTimeoutMs(settings.timeoutMs));
}

/** The name of the case that counts an append's statements through the fixture's `statementLog`. */
export const outboxRoundTripCaseName =
  'a keyed publish, and an append of several keyed rows (one delayed, one scheduled), sends only the statements its database needs (one on PostgreSQL), keeps their order and still refuses a duplicate messageId';

/**
 * Names of the cases of {@link outboxStoreCases} that check the operator half of the port
 * (`OutboxOperations`: stats, prune, dead rows, halted keys); every other case checks the
 * engine (`OutboxEngine`). `describeOutboxStore` registers them as two groups.
 */
export const outboxOperationsCaseNames: readonly string[] = [
  'stats count pending (in flight included), in flight, dead and halted keys',
  'prune deletes only published rows older than the cutoff',
  'lists, replays and purges dead rows',
  'a failed-dead row lists its code, error name and first failure; a replay clears them',
  'lists halted keys and resumes them by retry or park',
  'a completion never deletes or changes dead or halted rows, even under the lease that failed them',
];

function message<Tx>(env: OutboxCaseEnv<Tx>, key: string | null, overrides: Partial<Envelope> = {}): Envelope {
  return makeEnvelope({ topic: env.topic, key, type: 'conformance.OutboxTested', ...overrides });
}

async function commit<Tx>(env: OutboxCaseEnv<Tx>, messages: readonly (Envelope | OutboxAppend)[]): Promise<void> {
  await env.fixture.transaction(async (tx) => {
    await env.outbox.append(
      tx,
      messages.map((item) => ('envelope' in item ? item : { envelope: item })),
    );
  });
}

function claim<Tx>(env: OutboxCaseEnv<Tx>, owner: string, overrides: { limit?: number; leaseMs?: number; perKey?: number } = {}): Promise<ClaimedBatch> {
  return env.outbox.claim({ owner, limit: overrides.limit ?? 1_000, leaseMs: overrides.leaseMs ?? LONG_LEASE_MS, perKey: overrides.perKey ?? 1 });
}

/**
 * What `run` threw, or what the promise it returned rejected with (a store that writes at
 * once reports through its promise); undefined when it did neither.
 */
async function failureOf(run: () => unknown): Promise<unknown> {
  try {
    await run();
  } catch (error) {
    return error;
  }
  return undefined;
}

/** Expects `publish` to throw a `ConfigError` whose message names `field` and no other error. */
async function expectConfigError(publish: () => unknown, field: string): Promise<void> {
  const thrown = await failureOf(publish);
  expect(thrown, `publish with an unstorable ${field} is refused`).toBeInstanceOf(ConfigError);
  expect((thrown as Error).message, `the error names the ${field}`).toContain(field);
}

function ids(batch: ClaimedBatch): string[] {
  return batch.records.map((record) => record.envelope.messageId);
}

function sequences(batch: ClaimedBatch, only?: readonly Envelope[]): bigint[] {
  const wanted = only ? new Set(only.map((envelope) => envelope.messageId)) : null;
  return batch.records.filter((record) => !wanted || wanted.has(record.envelope.messageId)).map((record) => record.sequence);
}

function sequenceOf(batch: ClaimedBatch, envelope: Envelope): bigint {
  const record = batch.records.find((candidate) => candidate.envelope.messageId === envelope.messageId);
  if (!record) throw new Error(`message '${envelope.messageId}' is not in the claimed batch (${ids(batch).join(', ') || 'empty'})`);
  return record.sequence;
}

/**
 * Claims for `owner` until `row` comes back, and returns that batch (`row` alone). The
 * first claim is also the check that `row` is not claimable before its time: it must find
 * nothing — asserted only when it ended less than `heldForMs` after `since`, because on a
 * loaded machine the step before it and the claim itself can outlast a short lease or
 * delay, and then the row is rightly claimable at once.
 */
async function claimWhenBack<Tx>(env: OutboxCaseEnv<Tx>, owner: string, row: Envelope, since: number, heldForMs: number): Promise<ClaimedBatch> {
  const early = await claim(env, owner);
  if (Date.now() - since < heldForMs) expect(ids(early)).toEqual([]);
  const batch =
    early.records.length > 0
      ? early
      : await eventually(
          async () => {
            const next = await claim(env, owner);
            expect(ids(next)).toEqual([row.messageId]);
            return next;
          },
          { timeoutMs: env.options.timeoutMs },
        );
  expect(ids(batch)).toEqual([row.messageId]);
  return batch;
}

/** Claims and completes until nothing is claimable; returns the messageIds in claim order. */
async function drain<Tx>(env: OutboxCaseEnv<Tx>, owner: string): Promise<string[]> {
  const drained: string[] = [];
  for (;;) {
    const batch = await claim(env, owner);
    if (batch.records.length === 0) return drained;
    expect(await env.outbox.complete(batch.lease, sequences(batch))).toBe(batch.records.length);
    drained.push(...ids(batch));
  }
}

/**
 * What `StatementLog.watch` may report besides the append's own statements: transaction
 * control (Prisma logs the driver's as `-- Implicit "COMMIT" query via underlying driver`)
 * and the wake-up a store may send relays when a transaction commits (PostgreSQL's
 * NOTIFY/pg_notify, which the watch case counts no more than BEGIN or COMMIT).
 */
const NOT_THE_APPEND = /^\s*(--\s*implicit\s+"?)?(begin|start transaction|commit|rollback|savepoint|release|notify|select pg_notify\()/i;

function sorted(values: readonly string[]): string[] {
  return [...values].sort();
}

async function expectCourierError(run: () => unknown, codes: readonly string[]): Promise<void> {
  const thrown = await failureOf(run);
  expect(thrown, 'expected a CourierError to be thrown').toBeInstanceOf(CourierError);
  expect(codes).toContain((thrown as CourierError).code);
}

/** Every outbox store case, in the order the suite runs them; a plugin may run one alone. */
export const outboxStoreCases: readonly OutboxStoreCase[] = [
  {
    name: 'round-trips every envelope field byte for byte',
    async run(env) {
      const unicode = 'héllo wörld ✓ 😀 \u2028 "quoted" \\ back \u0000-less';
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
          payload: JSON.stringify({ text: unicode, n: 1.5e-7, big: 12345678901234, nested: { a: [1, null, true, 'x'] } }),
        }),
        message(env, null, { headers: {}, payload: '{}', causationId: null, traceparent: null, tracestate: null }),
        message(env, 'large', { payload: JSON.stringify({ blob: 'ü😀a'.repeat(Math.ceil(env.options.largePayloadChars / 4)) }) }),
        message(env, 'proto', { headers: protoHeaders(), payload: '{"__proto__":{"polluted":true}}' }),
        // Not normalised JSON text: whitespace, key order and escapes must survive (no jsonb).
        message(env, 'spacing', { payload: '{ "b" : [1,2] , "a":"\\u00e9\\n" ,"c": 1.0 }' }),
        message(env, null, { payload: '[]' }),
        message(env, null, { payload: '"just a string"' }),
      ];
      await commit(env, envelopes);
      const batch = await claim(env, 'relay-a', { perKey: 10 });
      expect(sorted(ids(batch))).toEqual(sorted(envelopes.map((envelope) => envelope.messageId)));
      for (const expected of envelopes) {
        const record = batch.records.find((candidate) => candidate.envelope.messageId === expected.messageId)!;
        expect(typeof record.sequence).toBe('bigint');
        expect(record.attempts).toBe(0);
        expect(comparableEnvelope(record.envelope)).toEqual(comparableEnvelope(expected));
        expect(record.envelope.payload.length).toBe(expected.payload.length);
      }
      expect(({} as Record<string, unknown>)['polluted']).toBeUndefined();
    },
  },
  {
    name: 'holds every field at exactly its declared limit (or the core\'s), round-tripping it',
    async run(env) {
      // The bus refuses at publish only what exceeds the declared limits: everything up to
      // them must be stored, multibyte characters included (varchar counts characters).
      const limits = env.outbox.limits;
      const id = (tail: string) => atLimit(limits?.id, ENVELOPE_LIMITS.idLength, tail);
      const messageId = id(`-${uniqueId()}`);
      const long = message(env, atLimit(limits?.key, ENVELOPE_LIMITS.keyLength), {
        messageId,
        correlationId: id('-c'),
        causationId: id('-x'),
        type: `conformance.${atLimit(limits?.type, ENVELOPE_LIMITS.typeLength - 'conformance.'.length, '', 'T')}`,
        topic: `${env.topic}.${atLimit(limits?.topic, ENVELOPE_LIMITS.topicLength - env.topic.length - 1, '', 't')}`,
        headers: {
          [atLimit(tighter(limits?.headerName, ENVELOPE_LIMITS.headerNameBytes), ENVELOPE_LIMITS.headerNameBytes, '-n')]: atLimit(
            tighter(limits?.headerValue, ENVELOPE_LIMITS.headerValueBytes),
            ENVELOPE_LIMITS.headerValueBytes,
          ),
        },
      });
      await commit(env, [long]);
      const batch = await claim(env, 'relay-a');
      expect(ids(batch)).toEqual([messageId]);
      expect(comparableEnvelope(batch.records[0]!.envelope)).toEqual(comparableEnvelope(long));
    },
  },
  {
    // Issue 29, shared cause 3: PostgreSQL text cannot hold U+0000 and no database stores a
    // lone surrogate. Such a key passed publish and failed the producer's whole transaction
    // at commit, as a *retriable* StorageError that no retry could cure.
    name: "publish refuses U+0000 and lone surrogates in every envelope text field with a ConfigError naming it; nothing is written and the caller's unit of work stays usable",
    async run(env) {
      const bus = createBus({ outbox: env.outbox, transport: new InMemoryBroker().connect() });
      const definition = defineMessage('conformance.Unstorable', { version: 1, topic: env.topic });
      const badOptions: readonly (readonly [field: string, options: PublishOptions])[] = [
        ['key', { key: 'a\u0000b' }],
        ['key', { key: 'lone \uD800 surrogate' }],
        ['messageId', { messageId: `${uniqueId()}\u0000` }],
        ['correlationId', { correlationId: 'c\u0000' }],
        ['causationId', { causationId: 'x\uDC00' }],
        ['header name', { headers: { 'x-\u0000': 'v' } }],
        ['header \'x-value\'', { headers: { 'x-value': 'v\u0000' } }],
      ];
      const badDefinitions = [
        ['type', { ...definition, type: 'conformance.Bad\u0000' }],
        ['topic', { ...definition, topic: `${env.topic}\u0000` }],
      ] as const;
      const good = uniqueId();
      await env.fixture.transaction(async (tx) => {
        const outbox = bus.outbox(tx);
        for (const [field, options] of badOptions) {
          await expectConfigError(() => outbox.publish(definition, {}, options), field);
        }
        for (const [field, bad] of badDefinitions) {
          await expectConfigError(() => outbox.publish(bad, {}, {}), field);
        }
        // Still usable: what follows in the same unit of work commits.
        await outbox.publish(definition, { ok: true }, { key: 'k', messageId: good });
        await env.fixture.recordEffect(tx, 'after-refusals');
      });
      expect(ids(await claim(env, 'relay-a')), 'only the good message was written').toEqual([good]);
      expect(await env.fixture.readEffects()).toEqual(['after-refusals']);
    },
  },
  {
    name: 'an append that fails (a duplicate messageId) never lets its unit of work commit the business change without the message',
    async run(env) {
      // A store that writes at once must have its append awaited before the commit: a failed
      // INSERT left behind turns a PostgreSQL COMMIT into a silent ROLLBACK and, on MySQL or
      // SQLite, would commit the business change without the message. The caller here does
      // what the API asks (awaits, lets a failure end the unit of work); a store that queues
      // rows reports the duplicate at append or at commit instead. Either way the unit of
      // work must not commit: no effect, no other message of it.
      const first = message(env, 'k');
      await commit(env, [first]);
      const { outbox } = env;
      const bus = createBus({ outbox, transport: new InMemoryBroker().connect() });
      const definition = defineMessage('conformance.Duplicated', { version: 1, topic: env.topic });
      const sibling = uniqueId();
      const failure = await failureOf(() =>
        env.fixture.transaction(async (tx) => {
          await env.fixture.recordEffect(tx, 'effect-before-duplicate');
          await bus.outbox(tx).publish(definition, {}, { key: 'j', messageId: sibling });
          await bus.outbox(tx).publish(definition, {}, { key: 'k', messageId: first.messageId });
          await env.fixture.recordEffect(tx, 'effect-after-duplicate');
        }),
      );
      expect(failure, 'the unit of work with a duplicate messageId failed').toBeInstanceOf(CourierError);
      expect((failure as CourierError).code).toBe('DUPLICATE_MESSAGE_ID');
      // The same through the port, without the bus.
      const lone = message(env, null);
      const direct = await failureOf(() =>
        env.fixture.transaction(async (tx) => {
          await env.fixture.recordEffect(tx, 'effect-before-direct-duplicate');
          await env.outbox.append(tx, [{ envelope: lone }]);
          await env.outbox.append(tx, [{ envelope: message(env, 'k', { messageId: first.messageId }) }]);
        }),
      );
      expect((direct as CourierError | undefined)?.code, 'the append of a duplicate failed the unit of work').toBe('DUPLICATE_MESSAGE_ID');
      expect(await env.fixture.readEffects(), 'no business change committed').toEqual([]);
      expect(await drain(env, 'relay-a'), 'only the first message exists').toEqual([first.messageId]);
      // The store is still usable for the next unit of work.
      const next = message(env, 'k');
      await commit(env, [next]);
      expect(await drain(env, 'relay-a')).toEqual([next.messageId]);
    },
  },
  {
    name: outboxRoundTripCaseName,
    async run(env) {
      // Every statement of an append is a round trip inside the caller's transaction, while it
      // holds its own row locks: an adapter that splits the key locks from the INSERT where the
      // database could take them in one statement pays one round trip more per producing
      // transaction (issues 31 and 32 measured it as most of the gap to a hand-written insert).
      const log = env.fixture.statementLog;
      if (!log) return env.skip("the fixture declares no statementLog (it cannot report the statements its store sends, or does not say how many a keyed append needs on its database), so an append's round trips cannot be counted");
      const expected = log.keyedAppendStatements;
      const sent = async (work: () => Promise<void>) => (await log.watch(work)).filter((text) => !NOT_THE_APPEND.test(text));
      const bus = createBus({ outbox: env.outbox, transport: new InMemoryBroker().connect() });
      const definition = defineMessage('conformance.Counted', { version: 1, topic: env.topic });
      const single = uniqueId();
      const publishStatements = await sent(() =>
        env.fixture.transaction(async (tx) => {
          await bus.outbox(tx).publish(definition, {}, { key: 'b', messageId: single });
        }),
      );
      expect(publishStatements.length, `a keyed publish sent: ${publishStatements.join(' | ')}`).toBeLessThanOrEqual(expected);
      expect(publishStatements.at(-1), 'the last statement is the outbox INSERT').toMatch(/^\s*INSERT\b/i);

      const rows = [message(env, 'b'), message(env, 'a'), message(env, 'b')];
      const appendStatements = await sent(() =>
        env.fixture.transaction(async (tx) => {
          await env.outbox.append(tx, [
            { envelope: rows[0]! },
            { envelope: rows[1]!, delayMs: env.options.delayMs },
            { envelope: rows[2]!, notBefore: new Date(Date.now() + env.options.delayMs) },
          ]);
        }),
      );
      expect(appendStatements.length, `an append of three keyed rows sent: ${appendStatements.join(' | ')}`).toBeLessThanOrEqual(expected);
      expect(appendStatements.at(-1), 'the last statement is the outbox INSERT').toMatch(/^\s*INSERT\b/i);

      // Before anything is completed, so the row is still there to collide with (a store
      // that deletes published rows may take the id again afterwards).
      const duplicate = await failureOf(() =>
        env.fixture.transaction(async (tx) => {
          await bus.outbox(tx).publish(definition, {}, { key: 'b', messageId: rows[0]!.messageId });
        }),
      );
      expect((duplicate as CourierError | undefined)?.code, 'a duplicate messageId is refused').toBe('DUPLICATE_MESSAGE_ID');

      const claimed = new Map<string, bigint>();
      await eventually(
        async () => {
          const batch = await claim(env, 'relay-a');
          if (batch.records.length > 0) {
            expect(await env.outbox.complete(batch.lease, sequences(batch))).toBe(batch.records.length);
            for (const record of batch.records) claimed.set(record.envelope.messageId, record.sequence);
          }
          expect(claimed.size, 'every appended row is claimed once its time has come').toBe(4);
        },
        { timeoutMs: env.options.timeoutMs },
      );
      const order = [single, ...rows.map((row) => row.messageId)];
      expect([...order].sort((x, y) => Number(claimed.get(x)! - claimed.get(y)!)), 'sequences follow the order of publishing and of the append').toEqual(order);
    },
  },
  {
    name: 'writes nothing from a rolled-back unit of work, effects included',
    async run(env) {
      const lost = message(env, 'k');
      await expect(
        env.fixture.transaction(async (tx) => {
          await env.outbox.append(tx, [{ envelope: lost }]);
          await env.fixture.recordEffect(tx, 'rolled-back-effect');
          throw new Error('rollback probe');
        }),
      ).rejects.toThrow('rollback probe');
      expect(ids(await claim(env, 'relay-a'))).toEqual([]);
      expect((await env.outbox.stats()).pending).toBe(0);
      expect(await env.fixture.readEffects()).toEqual([]);
      const kept = message(env, 'k');
      await commit(env, [kept]);
      expect(ids(await claim(env, 'relay-a'))).toEqual([kept.messageId]);
    },
  },
  {
    name: 'a message appended in a unit of work that rolls back is never claimed, even after the same unit of work object is used again',
    async run(env) {
      const { reusableUnitOfWork: unitOfWork } = env.fixture;
      const lost = [message(env, 'k'), message(env, null)];
      const kept = message(env, 'k');
      const first = await unitOfWork.begin();
      // The unit of work writes something first (a flush, where the store has one), then
      // the message is appended and the transaction rolls back.
      await env.fixture.recordEffect(first, 'rolled-back-effect');
      await env.outbox.append(first, lost.map((envelope) => ({ envelope })));
      const again = await unitOfWork.rollback(first);
      await env.outbox.append(again, [{ envelope: kept }]);
      // A write of the reused object (its next flush) must not carry the rolled-back rows.
      await env.fixture.recordEffect(again, 'committed-effect');
      await unitOfWork.commit(again);
      expect(await drain(env, 'relay-a')).toEqual([kept.messageId]);
      expect((await env.outbox.stats()).pending).toBe(0);
      expect(await env.fixture.readEffects()).toEqual(['committed-effect']);
    },
  },
  {
    name: 'refuses an ended or foreign unit of work and keeps what was committed',
    async run(env) {
      const committed = message(env, 'k');
      let ended: unknown;
      await env.fixture.transaction(async (tx) => {
        await env.outbox.append(tx, [{ envelope: committed }]);
        ended = tx;
      });
      const late = message(env, 'k');
      await expectCourierError(() => env.outbox.append(ended as Parameters<typeof env.outbox.append>[0], [{ envelope: late }]), [
        'UNIT_OF_WORK_ENDED',
        'UNIT_OF_WORK_REQUIRED',
      ]);
      await expectCourierError(() => env.outbox.append({} as Parameters<typeof env.outbox.append>[0], [{ envelope: late }]), ['UNIT_OF_WORK_REQUIRED']);
      expect(ids(await claim(env, 'relay-a'))).toEqual([committed.messageId]);
    },
  },
  {
    name: 'refuses a duplicate messageId and keeps the earlier row intact',
    async run(env) {
      const original = message(env, 'k', { payload: '{"v":1}' });
      await commit(env, [original]);
      const bystander = message(env, 'other');
      await expect(commit(env, [bystander, { ...original, payload: '{"v":2}' }])).rejects.toThrow();
      const inOne = message(env, 'same-tx');
      await expect(commit(env, [inOne, inOne])).rejects.toThrow();
      const batch = await claim(env, 'relay-a');
      expect(ids(batch)).toEqual([original.messageId]);
      expect(batch.records[0]!.envelope.payload).toBe('{"v":1}');
    },
  },
  {
    name: 'messageIds and keys that differ only in trailing spaces, case or Unicode normalisation are different',
    async run(env) {
      const ids = idVariants(`${env.testId}-é`);
      const keys = idVariants('key-é');
      const rows = ids.map((messageId, index) => message(env, keys[index]!, { messageId, correlationId: messageId }));
      // One unit of work per row: a store that compares the ids as equal refuses the later ones.
      for (const row of rows) await commit(env, [row]);
      // Distinct keys: every row is the head of its own key.
      const batch = await claim(env, 'relay-a');
      expect(sorted(batch.records.map((record) => record.envelope.messageId))).toEqual(sorted(ids));
      for (const row of rows) {
        expect(batch.records.find((record) => record.envelope.messageId === row.messageId)?.envelope.key).toBe(row.key);
      }
      await env.outbox.fail(batch.lease, [{ sequence: sequenceOf(batch, rows[1]!), error: 'halted', outcome: 'halt' }]);
      expect(await env.outbox.resume(env.topic, keys[0]!, 'park')).toBe(0);
      expect(await env.outbox.resume(env.topic, keys[1]!, 'park')).toBe(1);
      expect((await env.outbox.listDead({ topic: env.topic })).map((record) => record.envelope.messageId)).toEqual([ids[1]]);
    },
  },
  {
    name: 'never hands one row to two concurrent claimers',
    async run(env) {
      const total = env.options.rows;
      const envelopes = Array.from({ length: total }, (_, index) => message(env, index % 5 === 0 ? null : `k${index % 17}`));
      for (let start = 0; start < total; start += 50) await commit(env, envelopes.slice(start, start + 50));
      const claims = new Map<string, number>();
      let completed = 0;
      // Bounds a store that stops handing rows out, not the machine's speed: the claimers give
      // up once none of them completed a row for timeoutMs (a total deadline failed a correct
      // store on a loaded machine, 189 of 200 rows done in 10 s).
      let progressedAt = Date.now();
      const claimer = async (index: number): Promise<void> => {
        while (completed < total) {
          if (Date.now() - progressedAt > env.options.timeoutMs) throw new Error(`claimers completed no row for ${env.options.timeoutMs} ms (${completed} of ${total} done)`);
          const batch = await claim(env, `relay-${index}`, { limit: 7 });
          if (batch.records.length === 0) {
            await sleep(2);
            continue;
          }
          for (const id of ids(batch)) claims.set(id, (claims.get(id) ?? 0) + 1);
          const done = await env.outbox.complete(batch.lease, sequences(batch));
          expect(done).toBe(batch.records.length);
          completed += done;
          progressedAt = Date.now();
        }
      };
      await Promise.all(Array.from({ length: env.options.claimers }, (_, index) => claimer(index)));
      expect(completed).toBe(total);
      expect(claims.size).toBe(total);
      expect([...claims.values()].filter((count) => count !== 1)).toEqual([]);
    },
  },
  {
    name: 'claims only the head of each key; dead heads let the key move on; keyless rows all flow',
    async run(env) {
      const [k1, k2, k3] = [message(env, 'k'), message(env, 'k'), message(env, 'k')];
      const j1 = message(env, 'j');
      const [n1, n2, n3] = [message(env, null), message(env, null), message(env, null)];
      await commit(env, [k1, k2, k3, j1, n1, n2, n3]);
      const first = await claim(env, 'relay-a');
      expect(sorted(ids(first))).toEqual(sorted([k1, j1, n1, n2, n3].map((envelope) => envelope.messageId)));
      expect(ids(await claim(env, 'relay-b'))).toEqual([]);
      expect(await env.outbox.complete(first.lease, [sequenceOf(first, k1)])).toBe(1);
      const second = await claim(env, 'relay-b');
      expect(ids(second)).toEqual([k2.messageId]);
      expect(await env.outbox.fail(second.lease, [{ sequence: sequenceOf(second, k2), error: 'poison', outcome: 'dead' }])).toBe(1);
      expect(ids(await claim(env, 'relay-c'))).toEqual([k3.messageId]);
    },
  },
  {
    name: 'a halted head blocks its key and only its key',
    async run(env) {
      const [h1, h2] = [message(env, 'h'), message(env, 'h')];
      const o1 = message(env, 'o');
      await commit(env, [h1, h2]);
      const first = await claim(env, 'relay-a');
      expect(ids(first)).toEqual([h1.messageId]);
      expect(await env.outbox.fail(first.lease, [{ sequence: sequenceOf(first, h1), error: 'poison', outcome: 'halt' }])).toBe(1);
      await commit(env, [o1]);
      expect(ids(await claim(env, 'relay-b'))).toEqual([o1.messageId]);
      expect(ids(await claim(env, 'relay-c', { leaseMs: 1 }))).toEqual([]);
    },
  },
  {
    name: 'perKey above 1 claims that many contiguous rows of a key, in order',
    async run(env) {
      const rows = [message(env, 'p'), message(env, 'p'), message(env, 'p')];
      await commit(env, rows);
      const batch = await claim(env, 'relay-a', { perKey: 2 });
      expect(ids(batch)).toEqual([rows[0]!.messageId, rows[1]!.messageId]);
      expect(batch.records[0]!.sequence < batch.records[1]!.sequence).toBe(true);
      expect(ids(await claim(env, 'relay-b', { perKey: 2 }))).toEqual([]);
    },
  },
  {
    name: 'does not skip rows committed out of order; per-key order is commit order',
    async run(env) {
      const [a1, a2] = [message(env, 'k'), message(env, 'j')];
      const [b1, b2] = [message(env, 'k'), message(env, 'm')];
      const gate = deferred();
      const appended = deferred();
      const commits: string[] = [];
      const txA = env.fixture
        .transaction(async (tx) => {
          await env.outbox.append(tx, [{ envelope: a1 }, { envelope: a2 }]);
          appended.resolve();
          await gate.promise;
        })
        .then(() => commits.push('A'));
      await appended.promise;
      const txB = commit(env, [b1, b2]).then(() => commits.push('B'));
      // A store that locks the key at append makes B wait for A; give B a bounded chance.
      const bCommittedFirst = await Promise.race([txB.then(() => true), sleep(1_000).then(() => false)]);
      if (bCommittedFirst) {
        expect(sorted(await drain(env, 'relay-a'))).toEqual(sorted([b1.messageId, b2.messageId]));
        gate.resolve();
        await txA;
        expect(sorted(await drain(env, 'relay-a'))).toEqual(sorted([a1.messageId, a2.messageId]));
      } else {
        gate.resolve();
        await Promise.all([txA, txB]);
        const drained = await drain(env, 'relay-a');
        expect(sorted(drained)).toEqual(sorted([a1, a2, b1, b2].map((envelope) => envelope.messageId)));
        const keyOrder = drained.filter((id) => id === a1.messageId || id === b1.messageId);
        expect(keyOrder).toEqual(commits[0] === 'A' ? [a1.messageId, b1.messageId] : [b1.messageId, a1.messageId]);
      }
      expect(commits).toHaveLength(2);
    },
  },
  {
    name: 'an earlier row of a key never becomes claimable while a later row of that key is in flight',
    async run(env) {
      // The harmful interleaving for a store whose producers do not take turns per key: A
      // has written its row (drawn its sequence) but not committed; B appends the same key,
      // commits, and its row is claimed; then A commits a row with the smaller sequence.
      const [a, b] = [message(env, 'k'), message(env, 'k')];
      const held = deferred();
      const gate = deferred();
      const commits: string[] = [];
      const txA = env.fixture
        .transactionHeldBeforeCommit(
          async (tx) => {
            await env.outbox.append(tx, [{ envelope: a }]);
          },
          async () => {
            held.resolve();
            await gate.promise;
          },
        )
        .then(() => commits.push('A'));
      await held.promise;
      const txB = commit(env, [b]).then(() => commits.push('B'));
      // A store that serialises the producers of a key makes B wait for A; give B a
      // bounded chance to commit first (stores whose sequence is drawn at commit let it).
      const bCommittedFirst = await Promise.race([txB.then(() => true), sleep(Math.min(2_000, env.options.timeoutMs)).then(() => false)]);
      if (bCommittedFirst) {
        const inFlight = await claim(env, 'relay-a');
        expect(ids(inFlight)).toEqual([b.messageId]);
        gate.resolve();
        await txA;
        // A committed after B: its row comes after B's, whatever sequence it drew.
        expect(ids(await claim(env, 'relay-b'))).toEqual([]);
        expect(await env.outbox.complete(inFlight.lease, sequences(inFlight))).toBe(1);
        expect(ids(await claim(env, 'relay-b'))).toEqual([a.messageId]);
      } else {
        gate.resolve();
        await Promise.all([txA, txB]);
        expect(await drain(env, 'relay-a')).toEqual(commits[0] === 'A' ? [a.messageId, b.messageId] : [b.messageId, a.messageId]);
      }
      expect(commits).toHaveLength(2);
    },
  },
  {
    name: 'respects delayMs and notBefore: not claimed before, claimed promptly after; a delayed head holds its key',
    async run(env) {
      const { delayMs, clockToleranceMs, timeoutMs } = env.options;
      // Far: due long after any claim of this case, however slow the machine, so "not
      // before" is checked strictly on every run. Near: due after `delayMs`, so "promptly
      // after" is checked; where the store gives ageMs (counted from when a row became due,
      // database clock), "not before" is checked for these too, from the claim's own data.
      const farMs = 10 * 60_000;
      const far = message(env, 'far');
      const behindFar = message(env, 'far');
      const farScheduled = message(env, null);
      const delayed = message(env, 'd');
      const behind = message(env, 'd');
      const scheduled = message(env, null);
      const now = message(env, null);
      const committing = Date.now();
      await commit(env, [
        { envelope: far, delayMs: farMs },
        { envelope: behindFar },
        { envelope: farScheduled, notBefore: new Date(Date.now() + farMs) },
        { envelope: delayed, delayMs },
        { envelope: behind },
        { envelope: scheduled, notBefore: new Date(Date.now() + delayMs) },
        { envelope: now },
      ]);
      const notYet = [far, behindFar, farScheduled].map((envelope) => envelope.messageId);
      const first = await claim(env, 'relay-a');
      expect(ids(first)).toContain(now.messageId);
      expect(ids(first).filter((id) => notYet.includes(id)), 'a row was claimed before its delay or notBefore, or a delayed head let its key overtake it').toEqual([]);
      // Whenever the claim ran, `behind` waits for its delayed head.
      expect(ids(first)).not.toContain(behind.messageId);
      const due = new Map<string, ClaimedBatch['records'][number] & { claimEnd: number }>();
      const note = (batch: ClaimedBatch, claimEnd: number) => {
        for (const record of batch.records) if (!due.has(record.envelope.messageId)) due.set(record.envelope.messageId, { ...record, claimEnd });
      };
      note(first, Date.now());
      await eventually(
        async () => {
          const batch = await claim(env, 'relay-b', { perKey: 2 });
          note(batch, Date.now());
          expect(due.has(delayed.messageId) && due.has(scheduled.messageId)).toBe(true);
        },
        { timeoutMs },
      );
      for (const envelope of [delayed, scheduled]) {
        const record = due.get(envelope.messageId)!;
        // Due no earlier than delayMs after the commit began: its age at the claim cannot
        // exceed the time since then less the delay.
        if (record.ageMs !== undefined) expect(record.ageMs, `'${envelope.messageId}' was claimable before its delay`).toBeLessThanOrEqual(record.claimEnd - committing - delayMs + clockToleranceMs);
      }
      expect(notYet.filter((id) => due.has(id)), 'a far row was claimed before its delay or notBefore').toEqual([]);
    },
  },
  {
    name: "a claimed row's ageMs, where the store gives one, counts from when it became due: never negative, grows with the wait, never includes its delay",
    async run(env) {
      const { delayMs, clockToleranceMs, timeoutMs } = env.options;
      const waiting = message(env, null);
      const delayed = message(env, null);
      const committing = Date.now();
      await commit(env, [{ envelope: waiting }, { envelope: delayed, delayMs: 2 * delayMs }]);
      const committed = Date.now();
      // Bounds from the test's clock around each step; the store's age is on the database's.
      const check = (batch: ClaimedBatch, claimStart: number, claimEnd: number): void => {
        for (const record of batch.records) {
          if (record.ageMs === undefined) continue;
          expect(record.ageMs).toBeGreaterThanOrEqual(0);
          if (record.envelope.messageId === waiting.messageId) {
            // Due at its insert, inside the commit: at least the wait since the commit.
            expect(record.ageMs).toBeGreaterThanOrEqual(claimStart - committed - clockToleranceMs);
            expect(record.ageMs).toBeLessThanOrEqual(claimEnd - committing + clockToleranceMs);
          } else {
            // Due no earlier than 2 × delayMs after the commit began: the delay is not in it.
            expect(record.ageMs).toBeLessThanOrEqual(claimEnd - committing - 2 * delayMs + clockToleranceMs);
          }
        }
      };
      await sleep(delayMs);
      let claimStart = Date.now();
      const first = await claim(env, 'relay-a');
      check(first, claimStart, Date.now());
      expect(ids(first)).toContain(waiting.messageId);
      if (!ids(first).includes(delayed.messageId)) {
        await eventually(
          async () => {
            claimStart = Date.now();
            // perKey 2: the pipelined claim's path too, where a store has one.
            const batch = await claim(env, 'relay-b', { perKey: 2 });
            check(batch, claimStart, Date.now());
            expect(ids(batch)).toEqual([delayed.messageId]);
          },
          { timeoutMs },
        );
      }
    },
  },
  {
    name: 'an expired lease is claimed again with a greater fencing token',
    async run(env) {
      const { shortLeaseMs } = env.options;
      const row = message(env, 'k');
      await commit(env, [row]);
      const leasing = Date.now();
      const first = await claim(env, 'relay-a', { leaseMs: shortLeaseMs });
      expect(ids(first)).toEqual([row.messageId]);
      // Within the lease nobody else gets the row.
      const second = await claimWhenBack(env, 'relay-b', row, leasing, shortLeaseMs);
      expect(second.lease.token > first.lease.token).toBe(true);
      expect(second.lease.owner).toBe('relay-b');
      expect(second.records[0]!.attempts).toBe(0);
    },
  },
  {
    name: 'fences a stale relay: complete, fail and release with an old or forged lease change nothing',
    async run(env) {
      const row = message(env, 'k');
      await commit(env, [row]);
      const stale = await claim(env, 'relay-a', { leaseMs: env.options.shortLeaseMs });
      const forged = { owner: 'relay-a', token: stale.lease.token + 1_000_000n };
      expect(await env.outbox.complete(forged, sequences(stale))).toBe(0);
      const fresh = await eventually(
        async () => {
          const batch = await claim(env, 'relay-b');
          expect(ids(batch)).toEqual([row.messageId]);
          return batch;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await env.outbox.complete(stale.lease, sequences(stale))).toBe(0);
      expect(await env.outbox.fail(stale.lease, [{ sequence: sequences(stale)[0]!, error: 'stale', outcome: 'dead' }])).toBe(0);
      expect(await env.outbox.release(stale.lease, sequences(stale))).toBe(0);
      expect(await env.outbox.complete(fresh.lease, sequences(fresh))).toBe(1);
      expect(await env.outbox.listDead()).toEqual([]);
      expect(ids(await claim(env, 'relay-c', { leaseMs: 1 }))).toEqual([]);
    },
  },
  {
    name: 'completeAndClaim completes only rows its lease holds, together with a claim; a stale lease or refused claim completes nothing',
    async run(env) {
      const done = env.outbox.completeAndClaim?.bind(env.outbox);
      if (!done) return env.skip('the store has no completeAndClaim(): it is optional and the relay then completes and claims separately');
      const [a, b, c, d] = [message(env, 'k1'), message(env, 'k2'), message(env, null), message(env, 'k1')];
      await commit(env, [a, b, c, d]);
      const first = await claim(env, 'relay-a');
      expect(sorted(ids(first))).toEqual(sorted([a, b, c].map((row) => row.messageId)));
      const options = { owner: 'relay-a', limit: 1_000, leaseMs: LONG_LEASE_MS, perKey: 1 };
      // A forged lease completes nothing; its claim finds nothing due (`d` waits behind `a`).
      const forged = await done({ lease: { owner: 'relay-a', token: first.lease.token + 1_000_000n }, sequences: sequences(first) }, options);
      expect(forged.completed).toBe(0);
      expect(ids(forged)).toEqual([]);
      // A claim refused for its options throws before anything is completed.
      await expect(done({ lease: first.lease, sequences: sequences(first, [a]) }, { ...options, limit: 0 })).rejects.toBeInstanceOf(CourierError);
      const both = await done({ lease: first.lease, sequences: sequences(first, [a, b]) }, options);
      expect(both.completed).toBe(2);
      expect(both.lease.token).toBeGreaterThan(forged.lease.token);
      // `d` (behind the completed `a`) comes in this claim or the next one, never before `a` was published.
      const next = both.records.length > 0 ? both : await claim(env, 'relay-b');
      expect(ids(next)).toEqual([d.messageId]);
      // `c` is still held by the first lease; completing twice changes nothing the second time.
      expect(await env.outbox.complete(first.lease, sequences(first, [c]))).toBe(1);
      const last = await done({ lease: next.lease, sequences: sequences(next) }, { ...options, perKey: 2 });
      expect(last.completed).toBe(1);
      expect(ids(last)).toEqual([]);
      expect((await done({ lease: next.lease, sequences: sequences(next) }, options)).completed).toBe(0);
      expect(await env.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0 });
      expect(await env.outbox.listDead()).toEqual([]);
    },
  },
  {
    name: 'completeAndClaim calls beforeCommit with the completed rows after both halves ran; a throw there commits neither',
    async run(env) {
      const done = env.outbox.completeAndClaim?.bind(env.outbox);
      if (!done) return env.skip('the store has no completeAndClaim(): it is optional and the relay then completes and claims separately');
      const [a, b] = [message(env, 'k1'), message(env, 'k2')];
      await commit(env, [a]);
      const first = await claim(env, 'relay-a');
      expect(ids(first)).toEqual([a.messageId]);
      await commit(env, [b]);
      const options = { owner: 'relay-a', limit: 1_000, leaseMs: LONG_LEASE_MS, perKey: 1 };
      const seen: { point: string; messageIds: readonly string[] }[] = [];
      await expect(
        done(
          { lease: first.lease, sequences: sequences(first) },
          {
            ...options,
            beforeCommit: (point, context) => {
              seen.push({ point, messageIds: context.messageIds });
              throw new Error('injected before the combined commit');
            },
          },
        ),
      ).rejects.toThrow('injected before the combined commit');
      expect(seen).toEqual([{ point: 'complete-before-commit', messageIds: [a.messageId] }]);
      // Neither half committed: `a` is still pending under the first lease, `b` unclaimed.
      expect(await env.outbox.stats()).toMatchObject({ pending: 2, inFlight: 1 });
      const again = await done({ lease: first.lease, sequences: sequences(first) }, { ...options, beforeCommit: () => undefined });
      expect(again.completed).toBe(1);
      expect(ids(again)).toEqual([b.messageId]);
      expect(await env.outbox.complete(again.lease, sequences(again))).toBe(1);
      expect(await env.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0 });
    },
  },
  {
    name: 'a completion still fences: a stale lease completes nothing of rows another relay re-claimed, and their key stays blocked behind them',
    async run(env) {
      // With a store that deletes rows at completion, a stale completion that got through
      // would not only mark a row twice: it would remove a row another relay is publishing,
      // and the key's next row would be claimed before that one was confirmed.
      const [a, b] = [message(env, 'k'), message(env, 'k')];
      const c = message(env, null);
      await commit(env, [a, b, c]);
      const stale = await claim(env, 'relay-a', { leaseMs: env.options.shortLeaseMs });
      expect(sorted(ids(stale))).toEqual(sorted([a.messageId, c.messageId]));
      const fresh = await eventually(
        async () => {
          const batch = await claim(env, 'relay-b');
          expect(sorted(ids(batch))).toEqual(sorted([a.messageId, c.messageId]));
          return batch;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await env.outbox.complete(stale.lease, sequences(stale))).toBe(0);
      const done = env.outbox.completeAndClaim?.bind(env.outbox);
      if (done) {
        const combined = await done({ lease: stale.lease, sequences: sequences(stale) }, { owner: 'relay-a', limit: 1_000, leaseMs: LONG_LEASE_MS, perKey: 1 });
        expect(combined.completed).toBe(0);
        // `b` waits behind `a`, which relay-b still holds.
        expect(ids(combined)).toEqual([]);
      }
      expect(ids(await claim(env, 'relay-c'))).toEqual([]);
      // The rows are still there for the relay that holds them, and only its completion frees `b`.
      expect(await env.outbox.complete(fresh.lease, sequences(fresh))).toBe(2);
      expect(await env.outbox.complete(fresh.lease, sequences(fresh))).toBe(0);
      expect(ids(await claim(env, 'relay-c'))).toEqual([b.messageId]);
    },
  },
  {
    name: "per-key order holds across completions: a key's next row is claimable only once its predecessor was completed, on every path",
    async run(env) {
      const rows = [message(env, 'k'), message(env, 'k'), message(env, 'k'), message(env, 'k'), message(env, 'k')];
      const [k1, k2, k3, k4, k5] = rows;
      await commit(env, rows);
      const first = await claim(env, 'relay-a');
      expect(ids(first)).toEqual([k1!.messageId]);
      expect(ids(await claim(env, 'relay-b', { perKey: 3 }))).toEqual([]);
      // A retry is not a completion: the key still waits for `k1`.
      expect(await env.outbox.fail(first.lease, [{ sequence: sequenceOf(first, k1!), error: 'again', outcome: 'retry', delayMs: 0 }])).toBe(1);
      const retried = await eventually(
        async () => {
          const batch = await claim(env, 'relay-a');
          expect(ids(batch)).toEqual([k1!.messageId]);
          return batch;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await env.outbox.complete(retried.lease, sequences(retried))).toBe(1);
      const second = await claim(env, 'relay-b');
      expect(ids(second)).toEqual([k2!.messageId]);
      // The combined path: `k3` comes in this claim or the next one, never `k4` before it.
      const options = { owner: 'relay-b', limit: 1_000, leaseMs: LONG_LEASE_MS, perKey: 1 };
      const done = env.outbox.completeAndClaim?.bind(env.outbox);
      let third: ClaimedBatch;
      if (done) {
        const combined = await done({ lease: second.lease, sequences: sequences(second) }, options);
        expect(combined.completed).toBe(1);
        third = combined.records.length > 0 ? combined : await claim(env, 'relay-b');
      } else {
        expect(await env.outbox.complete(second.lease, sequences(second))).toBe(1);
        third = await claim(env, 'relay-b');
      }
      expect(ids(third)).toEqual([k3!.messageId]);
      expect(ids(await claim(env, 'relay-c', { perKey: 2 }))).toEqual([]);
      // A pipelined claim after the completion takes the rows right behind, in order.
      expect(await env.outbox.complete(third.lease, sequences(third))).toBe(1);
      const rest = await claim(env, 'relay-c', { perKey: 2 });
      expect(ids(rest)).toEqual([k4!.messageId, k5!.messageId]);
      expect(await env.outbox.complete(rest.lease, sequences(rest))).toBe(2);
      expect(ids(await claim(env, 'relay-c', { perKey: 2 }))).toEqual([]);
      expect(await env.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0, haltedKeys: 0 });
    },
  },
  {
    name: 'a published messageId is refused again while the store keeps its row, and accepted once its completion deleted it',
    async run(env) {
      // The messageId's uniqueness lasts as long as its row: until prune for a store that
      // keeps published rows, until publication for one that deletes them (the window the
      // store documents). Either way the earlier copy was published exactly once.
      const original = message(env, 'k', { payload: '{"v":1}' });
      await commit(env, [original]);
      const batch = await claim(env, 'relay-a');
      expect(await env.outbox.complete(batch.lease, sequences(batch))).toBe(1);
      const again = { ...original, payload: '{"v":2}' };
      if (env.fixture.outboxPublishedRows === 'delete') {
        await commit(env, [again]);
        const next = await claim(env, 'relay-b');
        expect(ids(next)).toEqual([original.messageId]);
        expect(next.records[0]!.envelope.payload).toBe('{"v":2}');
        expect(next.records[0]!.sequence > batch.records[0]!.sequence).toBe(true);
      } else {
        await expect(commit(env, [again])).rejects.toThrow();
        expect(ids(await claim(env, 'relay-b'))).toEqual([]);
      }
    },
  },
  {
    name: 'renew extends only the rows still held by the lease; a stale lease renews nothing',
    async run(env) {
      if (!env.outbox.renew) return env.skip('the store has no renew(): renewals are optional and the relay keeps one long lease');
      const [a, b, c] = [message(env, 'a'), message(env, 'b'), message(env, 'c')];
      await commit(env, [a, b, c]);
      const first = await claim(env, 'relay-a', { leaseMs: env.options.shortLeaseMs });
      expect(sorted(ids(first))).toEqual(sorted([a.messageId, b.messageId, c.messageId]));
      // `a` is completed and `b` released: only `c` is still held by the lease.
      expect(await env.outbox.complete(first.lease, [sequenceOf(first, a)])).toBe(1);
      expect(await env.outbox.release(first.lease, [sequenceOf(first, b)])).toBe(1);
      expect(await env.outbox.renew(first.lease, sequences(first), LONG_LEASE_MS)).toBe(1);
      const forged = { owner: 'relay-a', token: first.lease.token + 1_000_000n };
      expect(await env.outbox.renew(forged, [sequenceOf(first, c)], LONG_LEASE_MS)).toBe(0);
      // `b` (released) is claimable by anyone; `c` (renewed) is not, long after the first lease.
      const second = await claim(env, 'relay-b', { leaseMs: env.options.shortLeaseMs });
      expect(ids(second)).toEqual([b.messageId]);
      await eventually(
        async () => {
          const batch = await claim(env, 'relay-c');
          expect(ids(batch)).toEqual([b.messageId]);
        },
        { timeoutMs: env.options.timeoutMs },
      );
      // The stale lease of relay-b (expired, re-claimed by relay-c) renews nothing.
      expect(await env.outbox.renew(second.lease, sequences(second), LONG_LEASE_MS)).toBe(0);
      expect(await env.outbox.complete(first.lease, [sequenceOf(first, c)])).toBe(1);
    },
  },
  {
    name: 'a renewal after another relay re-claimed part of the batch counts and extends only the rows the lease still holds, never the re-claimed ones',
    async run(env) {
      if (!env.outbox.renew) return env.skip('the store has no renew(): renewals are optional and the relay keeps one long lease');
      const rows = [message(env, 'a'), message(env, 'b'), message(env, 'c')];
      await commit(env, rows);
      const first = await claim(env, 'relay-a', { leaseMs: env.options.shortLeaseMs });
      expect(first.records).toHaveLength(3);
      // The lease runs out; another relay re-claims two of the three rows.
      const second = await eventually(
        async () => {
          const batch = await claim(env, 'relay-b', { limit: 2 });
          expect(batch.records).toHaveLength(2);
          return batch;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      const [rest] = rows.filter((row) => !ids(second).includes(row.messageId));
      // The relay compares the count with its batch: fewer means it was fenced (it stops
      // sending). The row not re-claimed may be renewed (still held by the lease) or not.
      const renewed = await env.outbox.renew(first.lease, sequences(first), LONG_LEASE_MS);
      expect(renewed, 'a renewal counted rows another relay had re-claimed').toBeLessThanOrEqual(1);
      // The re-claimed rows stay relay-b's: the first lease can neither complete them nor did it extend them away.
      expect(await env.outbox.complete(first.lease, sequences(first, second.records.map((record) => record.envelope)))).toBe(0);
      expect(await env.outbox.complete(second.lease, sequences(second))).toBe(2);
      const third = await claim(env, 'relay-c');
      expect(ids(third)).toEqual(renewed === 1 ? [] : [rest!.messageId]);
    },
  },
  {
    name: 'renewed rows are re-claimable only after the renewed lease expires',
    async run(env) {
      if (!env.outbox.renew) return env.skip('the store has no renew(): renewals are optional and the relay keeps one long lease');
      const { shortLeaseMs, timeoutMs } = env.options;
      // Renewed a few times, each before the lease runs out: nobody else gets the row for
      // several leases in a row. A machine that stalls for longer than the short lease
      // between a renewal and the next claim lets relay-b take the row, rightly; then the
      // attempt proves nothing, and a fresh row is tried (at most three times).
      let row: Envelope | undefined;
      let held: ClaimedBatch | undefined;
      for (let attempt = 1; held === undefined; attempt += 1) {
        row = message(env, `k${attempt}`);
        await commit(env, [row]);
        const claimed = await claim(env, 'relay-a', { leaseMs: shortLeaseMs });
        expect(ids(claimed)).toEqual([row.messageId]);
        let stalled = false;
        const heldUntil = Date.now() + shortLeaseMs * 3;
        while (Date.now() < heldUntil && !stalled) {
          const renewing = Date.now();
          expect(await env.outbox.renew(claimed.lease, sequences(claimed), shortLeaseMs)).toBe(1);
          const other = await claim(env, 'relay-b');
          if (Date.now() - renewing < shortLeaseMs) {
            expect(ids(other)).toEqual([]);
          } else if (other.records.length > 0) {
            stalled = true;
            expect(await env.outbox.complete(other.lease, sequences(other))).toBe(1);
          }
          await sleep(shortLeaseMs / 4);
        }
        if (!stalled) held = claimed;
        else if (attempt === 3) throw new Error(`the machine stalled for longer than the ${shortLeaseMs} ms lease in each of 3 attempts; raise shortLeaseMs`);
      }
      // Taken before the renewal: the lease runs from when the store renewed it, which may be
      // long before the renewal's answer reaches a loaded machine.
      const renewedAt = Date.now();
      expect(await env.outbox.renew(held.lease, sequences(held), shortLeaseMs)).toBe(1);
      // Renewals stop: the row comes back once the last renewed lease has run out.
      const taken = await eventually(
        async () => {
          const batch = await claim(env, 'relay-b');
          expect(ids(batch)).toEqual([row!.messageId]);
          return batch;
        },
        { timeoutMs },
      );
      expect(Date.now() - renewedAt).toBeGreaterThanOrEqual(shortLeaseMs - env.options.clockToleranceMs);
      expect(taken.lease.token > held.lease.token).toBe(true);
      expect(await env.outbox.renew(held.lease, sequences(held), shortLeaseMs)).toBe(0);
      expect(await env.outbox.complete(held.lease, sequences(held))).toBe(0);
      expect(await env.outbox.complete(taken.lease, sequences(taken))).toBe(1);
    },
  },
  {
    name: 'fail records attempts, the last error and the failure time',
    async run(env) {
      const row = message(env, 'k');
      await commit(env, [row]);
      for (let attempt = 1; attempt <= 2; attempt += 1) {
        const batch = await claim(env, 'relay-a');
        expect(batch.records.map((record) => record.attempts)).toEqual([attempt - 1]);
        expect(await env.outbox.fail(batch.lease, [{ sequence: sequences(batch)[0]!, error: `boom ${attempt}`, outcome: 'retry', delayMs: 0 }])).toBe(1);
      }
      const last = await claim(env, 'relay-a');
      expect(last.records[0]!.attempts).toBe(2);
      const before = Date.now();
      expect(await env.outbox.fail(last.lease, [{ sequence: sequences(last)[0]!, error: 'final: ü😀', outcome: 'dead' }])).toBe(1);
      const dead = await env.outbox.listDead();
      expect(dead).toHaveLength(1);
      expect(dead[0]!.envelope.messageId).toBe(row.messageId);
      expect(dead[0]!.state).toBe('dead');
      expect(dead[0]!.attempts).toBe(3);
      expect(dead[0]!.lastError).toBe('final: ü😀');
      expect(dead[0]!.failedAt).toBeInstanceOf(Date);
      expect(Math.abs(dead[0]!.failedAt!.getTime() - before)).toBeLessThan(60_000);
    },
  },
  {
    name: 'a failed-dead row lists its code, error name and first failure; a replay clears them',
    async run(env) {
      const row = message(env, 'k');
      const unknown = message(env, 'u');
      await commit(env, [row, unknown]);
      const first = await claim(env, 'relay-a');
      const firstFailedAt = Date.now();
      const failed = first.records.find((record) => record.envelope.messageId === row.messageId)!;
      const plain = first.records.find((record) => record.envelope.messageId === unknown.messageId)!;
      expect(
        await env.outbox.fail(first.lease, [
          { sequence: failed.sequence, error: 'TransportError [PUBLISH_REJECTED]: nack', outcome: 'retry', delayMs: 0, code: 'PUBLISH_REJECTED', errorName: 'TransportError' },
          // A failure recorded without a code or name (a caller that does not know) lists them as unknown.
          { sequence: plain.sequence, error: 'no code', outcome: 'dead' },
        ]),
      ).toBe(2);
      // The first failure's time survives a later one; code and name are the last failure's.
      await sleep(env.options.clockToleranceMs + 20);
      const again = await claim(env, 'relay-b');
      expect(ids(again)).toEqual([row.messageId]);
      const lastFailedAt = Date.now();
      expect(
        await env.outbox.fail(again.lease, [
          { sequence: sequences(again)[0]!, error: 'TransportError [PUBLISH_UNROUTABLE]: no queue', outcome: 'dead', code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' },
        ]),
      ).toBe(1);
      const dead = await env.outbox.listDead();
      const listed = dead.find((record) => record.envelope.messageId === row.messageId)!;
      expect(listed).toMatchObject({ state: 'dead', attempts: 2, code: 'PUBLISH_UNROUTABLE', errorName: 'TransportError' });
      expect(Math.abs(listed.firstFailedAt!.getTime() - firstFailedAt)).toBeLessThan(env.options.clockToleranceMs + 5_000);
      expect(Math.abs(listed.failedAt!.getTime() - lastFailedAt)).toBeLessThan(env.options.clockToleranceMs + 5_000);
      expect(listed.failedAt!.getTime()).toBeGreaterThan(listed.firstFailedAt!.getTime());
      expect(dead.find((record) => record.envelope.messageId === unknown.messageId)).toMatchObject({ code: null, errorName: null, lastError: 'no code' });
      // A replay starts the row over: its next failure is a first failure again.
      expect(await env.outbox.replay([listed.sequence])).toBe(1);
      const replayed = await claim(env, 'relay-c');
      expect(ids(replayed)).toEqual([row.messageId]);
      const replayFailedAt = Date.now();
      expect(await env.outbox.fail(replayed.lease, [{ sequence: sequences(replayed)[0]!, error: 'again', outcome: 'dead' }])).toBe(1);
      const after = (await env.outbox.listDead()).find((record) => record.envelope.messageId === row.messageId)!;
      expect(after).toMatchObject({ attempts: 1, code: null, errorName: null, lastError: 'again' });
      expect(Math.abs(after.firstFailedAt!.getTime() - replayFailedAt)).toBeLessThan(env.options.clockToleranceMs + 5_000);
    },
  },
  {
    name: 'a retry is claimable again only after its delay',
    async run(env) {
      const { delayMs, clockToleranceMs } = env.options;
      const row = message(env, 'k');
      await commit(env, [row]);
      const batch = await claim(env, 'relay-a');
      const failedAt = Date.now();
      expect(await env.outbox.fail(batch.lease, [{ sequence: sequences(batch)[0]!, error: 'later', outcome: 'retry', delayMs }])).toBe(1);
      // Within the delay nobody gets the row.
      const again = await claimWhenBack(env, 'relay-b', row, failedAt, delayMs - clockToleranceMs);
      expect(Date.now() - failedAt).toBeGreaterThanOrEqual(delayMs - clockToleranceMs);
      expect(again.records[0]!.attempts).toBe(1);
    },
  },
  {
    name: 'never claims dead rows',
    async run(env) {
      const dead = message(env, null);
      await commit(env, [dead]);
      const batch = await claim(env, 'relay-a');
      expect(await env.outbox.fail(batch.lease, [{ sequence: sequences(batch)[0]!, error: 'dead', outcome: 'dead' }])).toBe(1);
      const alive = message(env, null);
      await commit(env, [alive]);
      expect(ids(await claim(env, 'relay-b'))).toEqual([alive.messageId]);
      expect(ids(await claim(env, 'relay-c'))).toEqual([]);
      expect((await env.outbox.stats()).dead).toBe(1);
    },
  },
  {
    name: 'release gives rows back without counting an attempt, after an optional delay',
    async run(env) {
      const { delayMs, clockToleranceMs } = env.options;
      const row = message(env, 'k');
      await commit(env, [row]);
      const first = await claim(env, 'relay-a');
      expect(await env.outbox.release(first.lease, sequences(first))).toBe(1);
      const second = await claim(env, 'relay-b');
      expect(ids(second)).toEqual([row.messageId]);
      expect(second.records[0]!.attempts).toBe(0);
      expect(second.lease.token > first.lease.token).toBe(true);
      const releasing = Date.now();
      expect(await env.outbox.release(second.lease, sequences(second), delayMs)).toBe(1);
      // Not before the delay.
      const third = await claimWhenBack(env, 'relay-c', row, releasing, delayMs - clockToleranceMs);
      expect(Date.now() - releasing).toBeGreaterThanOrEqual(delayMs - clockToleranceMs);
      expect(third.records[0]!.attempts).toBe(0);
    },
  },
  {
    name: 'complete applies nothing when beforeCommit throws; the row is re-claimed after its lease',
    async run(env) {
      const row = message(env, 'k');
      await commit(env, [row]);
      const first = await claim(env, 'relay-a', { leaseMs: env.options.shortLeaseMs });
      const seen: { point: string; messageIds: readonly string[] }[] = [];
      await expect(
        env.outbox.complete(first.lease, sequences(first), {
          beforeCommit: (point, context) => {
            seen.push({ point, messageIds: context.messageIds });
            throw new Error('injected before commit');
          },
        }),
      ).rejects.toThrow('injected before commit');
      expect(seen).toEqual([{ point: 'complete-before-commit', messageIds: [row.messageId] }]);
      expect((await env.outbox.stats()).pending).toBe(1);
      const second = await eventually(
        async () => {
          const batch = await claim(env, 'relay-b');
          expect(ids(batch)).toEqual([row.messageId]);
          return batch;
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await env.outbox.complete(second.lease, sequences(second))).toBe(1);
      expect((await env.outbox.stats()).pending).toBe(0);
    },
  },
  {
    name: 'stats count pending (in flight included), in flight, dead and halted keys',
    async run(env) {
      expect(await env.outbox.stats()).toEqual({ pending: 0, oldestPendingAgeMs: 0, inFlight: 0, dead: 0, haltedKeys: 0 });
      const [a1, a2, b1, c1] = [message(env, 'a'), message(env, 'a'), message(env, 'b'), message(env, 'c')];
      await commit(env, [a1, a2, b1, c1]);
      const waiting = await env.outbox.stats();
      expect(waiting).toMatchObject({ pending: 4, inFlight: 0, dead: 0, haltedKeys: 0 });
      expect(waiting.oldestPendingAgeMs).toBeGreaterThanOrEqual(0);
      const batch = await claim(env, 'relay-a', { limit: 2 });
      expect(sorted(ids(batch))).toEqual(sorted([a1.messageId, b1.messageId]));
      expect(await env.outbox.stats()).toMatchObject({ pending: 4, inFlight: 2 });
      await env.outbox.fail(batch.lease, [
        { sequence: sequenceOf(batch, a1), error: 'dead', outcome: 'dead' },
        { sequence: sequenceOf(batch, b1), error: 'halt', outcome: 'halt' },
      ]);
      expect(await env.outbox.stats()).toMatchObject({ pending: 2, inFlight: 0, dead: 1, haltedKeys: 1 });
    },
  },
  {
    // Issue 35: a SQL store counted a row waiting out a retry's backoff as age 0 (its
    // available_at is in the future), so the backlog-age alert could not fire for a message
    // failing for hours. Every store counts it from when it first became due.
    name: "stats' oldest pending age counts a row in a retry's backoff from when it first became due, not as 0",
    async run(env) {
      const waitedMs = 700;
      const failing = message(env, 'a');
      await commit(env, [failing]);
      await sleep(waitedMs);
      const batch = await claim(env, 'relay-a');
      // A first attempt in flight is inFlight, not backlog.
      expect(await env.outbox.stats()).toMatchObject({ pending: 1, inFlight: 1, oldestPendingAgeMs: 0 });
      expect(await env.outbox.fail(batch.lease, [{ sequence: sequenceOf(batch, failing), error: 'later', outcome: 'retry', delayMs: 600_000 }])).toBe(1);
      const backingOff = await env.outbox.stats();
      expect(backingOff).toMatchObject({ pending: 1, inFlight: 0 });
      // Both instants are the database's: the interval holds whatever its clock's offset.
      expect(backingOff.oldestPendingAgeMs).toBeGreaterThanOrEqual(waitedMs - env.options.clockToleranceMs);
      expect(backingOff.oldestPendingAgeMs).toBeLessThan(600_000);
      // A row delayed past now counts nothing, and does not hide the failing one.
      await commit(env, [{ envelope: message(env, 'b'), delayMs: 600_000 }]);
      expect((await env.outbox.stats()).oldestPendingAgeMs).toBeGreaterThanOrEqual(backingOff.oldestPendingAgeMs);
    },
  },
  {
    name: 'prune deletes only published rows older than the cutoff',
    async run(env) {
      const published = [message(env, null), message(env, null), message(env, null)];
      const dead = message(env, null);
      const pending = message(env, null);
      await commit(env, [...published, dead, pending]);
      const batch = await claim(env, 'relay-a');
      expect(await env.outbox.complete(batch.lease, sequences(batch, published))).toBe(published.length);
      await env.outbox.fail(batch.lease, [{ sequence: sequenceOf(batch, dead), error: 'dead', outcome: 'dead' }]);
      await env.outbox.release(batch.lease, [sequenceOf(batch, pending)]);
      expect(await env.outbox.prune(3_600_000)).toBe(0);
      if (env.fixture.outboxPublishedRows === 'delete') {
        // The completion deleted the published rows: nothing is left for prune, and it must
        // not take the dead or the pending row instead.
        expect(await env.outbox.prune(0, { batchSize: 1 })).toBe(0);
      } else {
        let pruned = 0;
        await eventually(
          async () => {
            pruned += await env.outbox.prune(0, { batchSize: 1 });
            expect(pruned).toBe(published.length);
          },
          { timeoutMs: env.options.timeoutMs },
        );
      }
      expect((await env.outbox.listDead()).map((record) => record.envelope.messageId)).toEqual([dead.messageId]);
      expect(ids(await claim(env, 'relay-b'))).toEqual([pending.messageId]);
    },
  },
  {
    name: 'lists, replays and purges dead rows',
    async run(env) {
      const rows = [message(env, 'x'), message(env, 'y'), message(env, 'z')];
      const elsewhere = message(env, null, { topic: `${env.testId}.elsewhere` });
      await commit(env, [...rows, elsewhere]);
      const batch = await claim(env, 'relay-a');
      await env.outbox.fail(
        batch.lease,
        batch.records.map((record) => ({ sequence: record.sequence, error: `dead ${record.envelope.messageId}`, outcome: 'dead' as const })),
      );
      const listed = await env.outbox.listDead({ topic: env.topic });
      expect(listed.map((record) => record.envelope.messageId)).toEqual(rows.map((row) => row.messageId));
      expect(listed.every((record) => record.state === 'dead' && record.attempts === 1)).toBe(true);
      expect(listed[1]!.lastError).toBe(`dead ${rows[1]!.messageId}`);
      expect(await env.outbox.listDead()).toHaveLength(4);
      const page = await env.outbox.listDead({ topic: env.topic, limit: 2 });
      expect(page.map((record) => record.sequence)).toEqual([listed[0]!.sequence, listed[1]!.sequence]);
      const rest = await env.outbox.listDead({ topic: env.topic, after: page[1]!.sequence });
      expect(rest.map((record) => record.sequence)).toEqual([listed[2]!.sequence]);

      expect(await env.outbox.replay([listed[0]!.sequence])).toBe(1);
      const replayed = await claim(env, 'relay-b');
      expect(ids(replayed)).toEqual([rows[0]!.messageId]);
      expect(replayed.records[0]!.attempts).toBe(0);
      expect(await env.outbox.replay([listed[0]!.sequence])).toBe(0);
      expect(await env.outbox.purge([listed[0]!.sequence])).toBe(0);
      expect(await env.outbox.purge([listed[1]!.sequence])).toBe(1);
      expect((await env.outbox.listDead({ topic: env.topic })).map((record) => record.envelope.messageId)).toEqual([rows[2]!.messageId]);
    },
  },
  {
    name: 'lists halted keys and resumes them by retry or park',
    async run(env) {
      const [h1, h2, h3] = [message(env, 'h'), message(env, 'h'), message(env, 'h')];
      await commit(env, [h1, h2, h3]);
      const first = await claim(env, 'relay-a');
      await env.outbox.fail(first.lease, [{ sequence: sequenceOf(first, h1), error: 'halted once', outcome: 'halt' }]);
      const halted = await env.outbox.listHalted();
      expect(halted).toHaveLength(1);
      expect(halted[0]).toMatchObject({ topic: env.topic, key: 'h', held: 2 });
      expect(halted[0]!.head).toMatchObject({ state: 'halted', attempts: 1, lastError: 'halted once' });
      expect(halted[0]!.head.envelope.messageId).toBe(h1.messageId);
      expect(await env.outbox.listHalted({ topic: `${env.testId}.elsewhere` })).toEqual([]);
      expect(await env.outbox.purge([halted[0]!.head.sequence])).toBe(0);
      expect(ids(await claim(env, 'relay-b'))).toEqual([]);

      expect(await env.outbox.resume(env.topic, 'h', 'retry')).toBe(1);
      const retried = await claim(env, 'relay-b');
      expect(ids(retried)).toEqual([h1.messageId]);
      expect(retried.records[0]!.attempts).toBe(0);
      await env.outbox.fail(retried.lease, [{ sequence: sequenceOf(retried, h1), error: 'halted twice', outcome: 'halt' }]);

      expect(await env.outbox.resume(env.topic, 'h', 'park')).toBe(1);
      expect(await env.outbox.listHalted()).toEqual([]);
      expect((await env.outbox.listDead()).map((record) => record.envelope.messageId)).toEqual([h1.messageId]);
      expect(ids(await claim(env, 'relay-c'))).toEqual([h2.messageId]);
      expect(await env.outbox.resume(env.topic, 'h', 'retry')).toBe(0);
    },
  },
  {
    name: 'a completion never deletes or changes dead or halted rows, even under the lease that failed them',
    async run(env) {
      const dead = message(env, 'd');
      const [h1, h2] = [message(env, 'h'), message(env, 'h')];
      const ok = message(env, 'o');
      await commit(env, [dead, h1, h2, ok]);
      const batch = await claim(env, 'relay-a');
      expect(sorted(ids(batch))).toEqual(sorted([dead.messageId, h1.messageId, ok.messageId]));
      expect(
        await env.outbox.fail(batch.lease, [
          { sequence: sequenceOf(batch, dead), error: 'dead', outcome: 'dead' },
          { sequence: sequenceOf(batch, h1), error: 'halted', outcome: 'halt' },
        ]),
      ).toBe(2);
      // The lease that failed them completes only the row it still holds.
      expect(await env.outbox.complete(batch.lease, sequences(batch))).toBe(1);
      const done = env.outbox.completeAndClaim?.bind(env.outbox);
      if (done) {
        const combined = await done({ lease: batch.lease, sequences: sequences(batch, [dead, h1]) }, { owner: 'relay-a', limit: 1_000, leaseMs: LONG_LEASE_MS, perKey: 1 });
        expect(combined.completed).toBe(0);
        // `h2` stays held behind its halted head.
        expect(ids(combined)).toEqual([]);
      }
      expect((await env.outbox.listDead()).map((record) => record.envelope.messageId)).toEqual([dead.messageId]);
      const halted = await env.outbox.listHalted();
      expect(halted.map((key) => [key.head.envelope.messageId, key.held])).toEqual([[h1.messageId, 1]]);
      expect(await env.outbox.stats()).toMatchObject({ pending: 1, inFlight: 0, dead: 1, haltedKeys: 1 });
      // Both can still be repaired, then flow as any row.
      expect(await env.outbox.replay([sequenceOf(batch, dead)])).toBe(1);
      expect(await env.outbox.resume(env.topic, 'h', 'retry')).toBe(1);
      const repaired = await claim(env, 'relay-b');
      expect(sorted(ids(repaired))).toEqual(sorted([dead.messageId, h1.messageId]));
      expect(await env.outbox.complete(repaired.lease, sequences(repaired))).toBe(2);
      const last = await claim(env, 'relay-b');
      expect(ids(last)).toEqual([h2.messageId]);
      expect(await env.outbox.complete(last.lease, sequences(last))).toBe(1);
      expect(await env.outbox.stats()).toMatchObject({ pending: 0, inFlight: 0, dead: 0, haltedKeys: 0 });
    },
  },
  {
    name: 'watch calls its listener after a commit appended rows',
    async run(env) {
      const watch = env.outbox.watch?.bind(env.outbox);
      if (!watch) return env.skip('the store has no watch(): the wake-up signal is optional and the relay polls');
      let calls = 0;
      const stop = await watch(() => {
        calls += 1;
      });
      try {
        await commit(env, [message(env, 'k')]);
        await eventually(() => expect(calls).toBeGreaterThan(0), { timeoutMs: env.options.timeoutMs });
      } finally {
        await stop();
      }
    },
  },
];
