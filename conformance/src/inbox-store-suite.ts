import { setTimeout as sleep } from 'node:timers/promises';
import { ENVELOPE_LIMITS, hasInboxHalts, type Envelope, type InboxHalts, type InboxStats, type InboxStore, type OutboxStore } from '@courier/core';
import { expect } from 'vitest';
import type { StoreFixture, StoreFixtureFactory } from './fixtures.js';
import { atLimit } from './support/at-limit.js';
import { deferred } from './support/deferred.js';
import { eventually } from './support/eventually.js';
import { idVariants } from './support/id-variants.js';
import { makeEnvelope } from './support/make-envelope.js';
import { caseTimeoutMs, describeCases, type CaseControls, type SuiteCase } from './support/run-cases.js';
import { uniqueId } from './support/unique-id.js';

/** Per-suite settings of {@link describeInboxStore}. */
export interface InboxStoreSuiteOptions {
  /** Runs racing in the concurrent-duplicate case. Default 8. */
  readonly concurrentRuns?: number;
  /** Bound of every `eventually` wait. Default 10 s. */
  readonly timeoutMs?: number;
}

/** What an inbox case works with. */
export interface InboxCaseEnv<Tx> extends CaseControls {
  readonly fixture: StoreFixture<Tx>;
  readonly inbox: InboxStore<Tx>;
  readonly outbox: OutboxStore<Tx>;
  /** The case's consumer name, derived from its test id. */
  readonly consumer: string;
  readonly options: Required<InboxStoreSuiteOptions>;
}

/** One inbox case; generic in the store's unit-of-work type. */
export interface InboxStoreCase {
  readonly name: string;
  run<Tx>(env: InboxCaseEnv<Tx>): Promise<void>;
}

const DEFAULTS: Required<InboxStoreSuiteOptions> = { concurrentRuns: 8, timeoutMs: 10_000 };

/**
 * Registers the inbox store conformance suite: a vitest `describe` with every case of
 * {@link inboxStoreCases}, each against a fresh fixture from `factory` (unique test id)
 * that is closed afterwards. Call it from the store's own test file.
 */
export function describeInboxStore<Tx>(name: string, factory: StoreFixtureFactory<Tx>, options: InboxStoreSuiteOptions = {}): void {
  const settings = { ...DEFAULTS, ...options };
  const cases: SuiteCase<InboxCaseEnv<Tx>>[] = inboxStoreCases.map((testCase) => ({ name: testCase.name, run: (env) => testCase.run(env) }));
  describeCases(`inbox-store(${name})`, cases, async (context, controls) => {
    const fixture = await factory(context);
    const env: InboxCaseEnv<Tx> = {
      ...controls,
      fixture,
      inbox: fixture.inbox,
      outbox: fixture.outbox,
      consumer: `${context.testId}-consumer`,
      options: settings,
    };
    return { env, close: () => fixture.close() };
  }, caseTimeoutMs(settings.timeoutMs));
}

/** Every inbox store case, in the order the suite runs them; a plugin may run one alone. */
export const inboxStoreCases: readonly InboxStoreCase[] = [
  {
    name: 'run commits the effects and the record together and returns the value',
    async run(env) {
      const id = uniqueId();
      const result = await env.inbox.run(id, env.consumer, async (tx) => {
        await env.fixture.recordEffect(tx, `effect-${id}`);
        return { answer: 42 };
      });
      expect(result).toEqual({ duplicate: false, value: { answer: 42 } });
      expect(await env.fixture.readEffects()).toEqual([`effect-${id}`]);
    },
  },
  {
    name: 'records, counts and forgets at exactly the declared limits (or the longest the core passes)',
    async run(env) {
      const limits = env.inbox.limits;
      const id = atLimit(limits?.id, ENVELOPE_LIMITS.idLength, `-${uniqueId()}`);
      // Consumer names are ASCII. Undeclared, the longest the core passes is a 249-character
      // name (the topic rule) with its '~alone' suffix.
      const consumer = atLimit(limits?.consumer, ENVELOPE_LIMITS.topicLength + '~alone'.length, '~alone', 'c');
      expect(await env.inbox.recordStart(id, consumer)).toBe(1);
      expect(await env.inbox.recordStart(id, consumer)).toBe(2);
      expect(await env.inbox.run(id, consumer, async (tx) => env.fixture.recordEffect(tx, 'at-limit'))).toEqual({ duplicate: false, value: undefined });
      expect(await env.inbox.run(id, consumer, async () => 'again')).toEqual({ duplicate: true });
      expect(await env.inbox.forget(id, consumer)).toBe(true);
      expect(await env.fixture.readEffects()).toEqual(['at-limit']);
    },
  },
  {
    name: 'a committed duplicate is reported without running work',
    async run(env) {
      const id = uniqueId();
      await env.inbox.run(id, env.consumer, (tx) => env.fixture.recordEffect(tx, 'first'));
      let ran = false;
      const again = await env.inbox.run(id, env.consumer, async (tx) => {
        ran = true;
        await env.fixture.recordEffect(tx, 'second');
      });
      expect(again).toEqual({ duplicate: true });
      expect(ran).toBe(false);
      expect(await env.fixture.readEffects()).toEqual(['first']);
    },
  },
  {
    name: 'records are per (messageId, consumer): another consumer runs the same message',
    async run(env) {
      const id = uniqueId();
      await env.inbox.run(id, env.consumer, (tx) => env.fixture.recordEffect(tx, 'one'));
      const other = await env.inbox.run(id, `${env.consumer}-other`, async (tx) => {
        await env.fixture.recordEffect(tx, 'two');
        return 'ran';
      });
      expect(other).toEqual({ duplicate: false, value: 'ran' });
      expect(await env.fixture.readEffects()).toEqual(['one', 'two']);
    },
  },
  {
    name: 'work that throws commits nothing, and a later run succeeds',
    async run(env) {
      const id = uniqueId();
      const failure = new Error('handler failed');
      await expect(
        env.inbox.run(id, env.consumer, async (tx) => {
          await env.fixture.recordEffect(tx, 'lost');
          throw failure;
        }),
      ).rejects.toBe(failure);
      expect(await env.fixture.readEffects()).toEqual([]);
      const retried = await env.inbox.run(id, env.consumer, async (tx) => {
        await env.fixture.recordEffect(tx, 'kept');
        return 'ok';
      });
      expect(retried).toEqual({ duplicate: false, value: 'ok' });
      expect(await env.fixture.readEffects()).toEqual(['kept']);
    },
  },
  {
    name: 'racing first runs of one message commit exactly one effect',
    async run(env) {
      const id = uniqueId();
      const runs = Array.from({ length: env.options.concurrentRuns }, (_, index) =>
        env.inbox.run(id, env.consumer, async (tx) => {
          await env.fixture.recordEffect(tx, `effect-${index}`);
          return index;
        }),
      );
      const results = await Promise.all(runs);
      const winners = results.filter((result) => !result.duplicate);
      expect(winners).toHaveLength(1);
      expect(results.filter((result) => result.duplicate)).toHaveLength(env.options.concurrentRuns - 1);
      const effects = await env.fixture.readEffects();
      expect(effects).toHaveLength(1);
      const winner = winners[0]!;
      expect(effects).toEqual([`effect-${'value' in winner ? winner.value : -1}`]);
      expect(await env.inbox.run(id, env.consumer, async () => 'late')).toEqual({ duplicate: true });
    },
  },
  {
    name: 'ids and consumers that differ only in trailing spaces, case or Unicode normalisation are different pairs',
    async run(env) {
      const variants = idVariants(`${uniqueId()}-é`);
      for (const [index, id] of variants.entries()) {
        expect(await env.inbox.run(id, env.consumer, async (tx) => env.fixture.recordEffect(tx, `id-${index}`).then(() => index))).toEqual({
          duplicate: false,
          value: index,
        });
      }
      const id = uniqueId();
      for (const [index, consumer] of idVariants(`${env.consumer}-é`).entries()) {
        expect(await env.inbox.run(id, consumer, async (tx) => env.fixture.recordEffect(tx, `consumer-${index}`).then(() => index))).toEqual({
          duplicate: false,
          value: index,
        });
        expect(await env.inbox.recordStart(id, consumer)).toBe(1);
      }
      expect(await env.fixture.readEffects()).toEqual([...variants.map((_, index) => `id-${index}`), ...variants.map((_, index) => `consumer-${index}`)]);
      for (const id of variants) expect(await env.inbox.run(id, env.consumer, async () => 'again')).toEqual({ duplicate: true });
      expect(await env.inbox.forget(variants[1]!, env.consumer)).toBe(true);
      expect(await env.inbox.run(variants[0]!, env.consumer, async () => 'again')).toEqual({ duplicate: true });
    },
  },
  {
    name: 'runs waiting on a first run whose work fails do not fail: one of them runs, the rest see the duplicate',
    async run(env) {
      const id = uniqueId();
      const failure = new Error('first handler failed');
      const started = deferred();
      const gate = deferred();
      const first = env.inbox.run(id, env.consumer, async (tx) => {
        await env.fixture.recordEffect(tx, 'first');
        started.resolve();
        await gate.promise;
        throw failure;
      });
      const firstOutcome = first.then(
        () => 'resolved',
        (error: unknown) => error,
      );
      await started.promise;
      const waiters = Array.from({ length: Math.max(3, env.options.concurrentRuns) }, (_, index) =>
        env.inbox.run(id, env.consumer, async (tx) => {
          await env.fixture.recordEffect(tx, `waiter-${index}`);
          return index;
        }),
      );
      // Not a synchronisation: a bounded chance for the waiters to queue behind the first
      // run's record (on stores that wait there); the assertions hold however far they got.
      await Promise.race([Promise.allSettled(waiters), sleep(500)]);
      gate.resolve();
      expect(await firstOutcome).toBe(failure);
      const settled = await Promise.allSettled(waiters);
      expect(settled.filter((outcome) => outcome.status === 'rejected').map((outcome) => String((outcome as PromiseRejectedResult).reason))).toEqual([]);
      const results = settled.map((outcome) => (outcome as PromiseFulfilledResult<{ duplicate: boolean; value?: number }>).value);
      const ran = results.filter((result) => !result.duplicate);
      expect(ran).toHaveLength(1);
      expect(await env.fixture.readEffects()).toEqual([`waiter-${ran[0]!.value}`]);
    },
  },
  {
    name: 'recordStart counts starts per (messageId, consumer)',
    async run(env) {
      const id = uniqueId();
      expect(await env.inbox.recordStart(id, env.consumer)).toBe(1);
      expect(await env.inbox.recordStart(id, env.consumer)).toBe(2);
      expect(await env.inbox.recordStart(id, env.consumer)).toBe(3);
      expect(await env.inbox.recordStart(id, `${env.consumer}-other`)).toBe(1);
      expect(await env.inbox.recordStart(uniqueId(), env.consumer)).toBe(1);
    },
  },
  {
    name: 'forget allows an explicit reprocess',
    async run(env) {
      const id = uniqueId();
      await env.inbox.run(id, env.consumer, (tx) => env.fixture.recordEffect(tx, 'first'));
      expect(await env.inbox.forget(id, env.consumer)).toBe(true);
      expect(await env.inbox.forget(id, env.consumer)).toBe(false);
      const again = await env.inbox.run(id, env.consumer, async (tx) => {
        await env.fixture.recordEffect(tx, 'reprocessed');
        return 'again';
      });
      expect(again).toEqual({ duplicate: false, value: 'again' });
      expect(await env.fixture.readEffects()).toEqual(['first', 'reprocessed']);
      expect(await env.inbox.forget(uniqueId(), env.consumer)).toBe(false);
    },
  },
  {
    name: 'prune removes records older than the cutoff only',
    async run(env) {
      const ids = [uniqueId(), uniqueId(), uniqueId()];
      for (const id of ids) await env.inbox.run(id, env.consumer, async () => undefined);
      expect(await env.inbox.prune(3_600_000)).toBe(0);
      expect(await env.inbox.run(ids[0]!, env.consumer, async () => undefined)).toEqual({ duplicate: true });
      let pruned = 0;
      await eventually(
        async () => {
          pruned += await env.inbox.prune(0, { batchSize: 2 });
          expect(pruned).toBe(ids.length);
        },
        { timeoutMs: env.options.timeoutMs },
      );
      expect(await env.inbox.run(ids[0]!, env.consumer, async () => 'again')).toEqual({ duplicate: false, value: 'again' });
    },
  },
  {
    name: 'outbox rows appended in the run commit with it, and roll back with it',
    async run(env) {
      const topic = `${env.testId}.inbox`;
      const kept = makeEnvelope({ topic, key: 'k' });
      const lost = makeEnvelope({ topic, key: 'k' });
      await env.inbox.run(uniqueId(), env.consumer, async (tx) => {
        await env.outbox.append(tx, [{ envelope: kept }]);
      });
      await expect(
        env.inbox.run(uniqueId(), env.consumer, async (tx) => {
          await env.outbox.append(tx, [{ envelope: lost }]);
          throw new Error('handler failed after publishing');
        }),
      ).rejects.toThrow('handler failed after publishing');
      const batch = await env.outbox.claim({ owner: 'relay', limit: 10, leaseMs: 60_000, perKey: 10 });
      expect(batch.records.map((record) => record.envelope.messageId)).toEqual([kept.messageId]);
    },
  },
  {
    name: 'stats (optional): per consumer its records, the oldest record\'s age (growing), dead-letter marks and replays; start markers and other consumers apart',
    async run(env) {
      const stats = statsOf(env);
      const { consumer } = env;
      const other = `${consumer}-other`;
      const mine = (result: InboxStats, name: string) => result.consumers.find((entry) => entry.consumer === name);
      expect(mine(await stats(), consumer)).toBeUndefined();
      const firstRun = Date.now();
      const [handled, dead] = [uniqueId(), uniqueId()];
      // What the consumer writes: a handled message, a dead-letter mark, the replay of that
      // dead letter under its own record, and a run-alone start marker.
      await env.inbox.run(handled, consumer, async () => undefined);
      await env.inbox.run(dead, `${consumer}~dead`, async () => undefined);
      await env.inbox.run(dead, `${consumer}~rerun`, async () => undefined);
      await env.inbox.run(uniqueId(), `${consumer}~alone`, async () => undefined);
      await env.inbox.run(handled, other, async () => undefined);
      const lastRun = Date.now();
      const first = await stats();
      expect(mine(first, consumer)).toMatchObject({ consumer, records: 2, deadLetters: 1, replayed: 1 });
      expect(mine(first, other)).toMatchObject({ consumer: other, records: 1, deadLetters: 0, replayed: 0 });
      expect(first.consumers.some((entry) => entry.consumer.includes('~'))).toBe(false);
      const firstAge = mine(first, consumer)!.oldestRecordAgeMs;
      expect(firstAge).toBeGreaterThanOrEqual(0);
      await sleep(250);
      const asked = Date.now();
      const second = await stats();
      const answered = Date.now();
      const age = mine(second, consumer)!.oldestRecordAgeMs;
      // Bounds from the test's clock around the runs (the store's age is on the database's, same machine).
      expect(age).toBeGreaterThanOrEqual(asked - lastRun - 20);
      expect(age).toBeLessThanOrEqual(answered - firstRun + 20);
      expect(age).toBeGreaterThan(firstAge);
    },
  },
  {
    name: 'halts: while a key is halted, runs with hold store the message as held (once) instead of running; other keys run',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      const head = makeEnvelope({ topic, key: 'k' });
      expect(await halts.halt(env.consumer, topic, 'k', head, 'E: broken')).toBe('halted');
      const later = [makeEnvelope({ topic, key: 'k' }), makeEnvelope({ topic, key: 'k' })];
      let ran = 0;
      for (const envelope of [...later, later[0]!]) {
        const result = await env.inbox.run(envelope.messageId, env.consumer, async (tx) => {
          ran += 1;
          await env.fixture.recordEffect(tx, envelope.messageId);
        }, { hold: { topic, key: 'k', envelope } });
        expect(result).toEqual({ duplicate: false, held: true });
      }
      expect(ran).toBe(0);
      // halt() on a halted key holds too (a message given up on before it could be held).
      const third = makeEnvelope({ topic, key: 'k' });
      expect(await halts.halt(env.consumer, topic, 'k', third, 'E: also')).toBe('held');
      const other = makeEnvelope({ topic, key: 'other' });
      const free = await env.inbox.run(other.messageId, env.consumer, async () => 'ran', { hold: { topic, key: 'other', envelope: other } });
      expect(free).toEqual({ duplicate: false, value: 'ran' });
      // Another consumer of the same key is not halted.
      const elsewhere = await env.inbox.run(later[0]!.messageId, `${env.consumer}-2`, async () => 'ran', { hold: { topic, key: 'k', envelope: later[0]! } });
      expect(elsewhere).toEqual({ duplicate: false, value: 'ran' });
      const [halt, ...rest] = await halts.listHalted({ consumer: env.consumer });
      expect(rest).toEqual([]);
      expect(halt).toMatchObject({ consumer: env.consumer, topic, key: 'k', held: 3, resumed: null, head: { error: 'E: broken' } });
      expect(halt!.head!.envelope).toEqual(head);
      expect(await env.fixture.readEffects()).toEqual([]);
    },
  },
  {
    name: 'halts: resume marks once; one drainer at a time holds the claim, which another takes after its lease ran out',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      const head = makeEnvelope({ topic, key: 'k' });
      await halts.halt(env.consumer, topic, 'k', head, 'E: broken');
      expect(await halts.claimResumed(env.consumer, 'a', 60_000)).toBeUndefined();
      expect(await halts.resumeHalted(env.consumer, topic, 'k', 'retry')).toBe(1);
      expect(await halts.resumeHalted(env.consumer, topic, 'k', 'park')).toBe(0);
      expect(await halts.resumeHalted(env.consumer, topic, 'missing', 'retry')).toBe(0);
      const claiming = Date.now();
      const claim = await halts.claimResumed(env.consumer, 'a', 300);
      expect(claim).toMatchObject({ consumer: env.consumer, topic, key: 'k', action: 'retry' });
      expect(claim!.head!.envelope).toEqual(head);
      // While a's claim lasts b gets nothing. Only a claim that ended before a's could have
      // run out proves that: on a loaded machine the two claims can take longer than 300 ms,
      // and then b may rightly take it over at once.
      const rival = await halts.claimResumed(env.consumer, 'b', 300);
      if (Date.now() - claiming < 300) expect(rival).toBeUndefined();
      else if (rival) expect(rival).toMatchObject({ key: 'k', action: 'retry' });
      expect(await halts.claimResumed(`${env.consumer}-2`, 'b', 300)).toBeUndefined();
      await sleep(700);
      const taken = await halts.claimResumed(env.consumer, 'b', 60_000);
      expect(taken).toMatchObject({ key: 'k', action: 'retry' });
      // The first drainer lost its claim: its steps change nothing.
      expect(await halts.settleHead(env.consumer, topic, 'k', 'a', { parked: false })).toBe(false);
      expect(await halts.lift(env.consumer, topic, 'k', 'a')).toBe(false);
      expect((await halts.listHalted({ consumer: env.consumer }))[0]!.head).not.toBeNull();
    },
  },
  {
    name: 'halts: renewDrain keeps a drainer\'s claim past its lease while it renews, and answers false once the claim is lost',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      await halts.halt(env.consumer, topic, 'k', makeEnvelope({ topic, key: 'k' }), 'E: broken');
      expect(await halts.renewDrain(env.consumer, topic, 'k', 'a')).toBe(false);
      await halts.resumeHalted(env.consumer, topic, 'k', 'retry');
      const leaseMs = 1_000;
      await halts.claimResumed(env.consumer, 'a', leaseMs);
      // Renewed for twice the lease: no one else may take the key meanwhile.
      const until = Date.now() + 2 * leaseMs;
      let renewedAt = Date.now();
      while (Date.now() < until) {
        await sleep(200);
        const asked = Date.now();
        expect(await halts.renewDrain(env.consumer, topic, 'k', 'a')).toBe(true);
        renewedAt = asked;
      }
      const rival = await halts.claimResumed(env.consumer, 'b', leaseMs);
      // Strict unless the machine stalled past the lease since the last renewal.
      if (Date.now() - renewedAt < leaseMs) expect(rival, 'the claim was taken although its drainer renewed it').toBeUndefined();
      expect(await halts.renewDrain(env.consumer, topic, 'k', 'b')).toBe(rival !== undefined);
      // Not renewed: the lease runs out, another drainer takes the key, the first learns it.
      await sleep(leaseMs + 500);
      expect(await halts.claimResumed(env.consumer, 'b', 60_000)).toMatchObject({ key: 'k' });
      expect(await halts.renewDrain(env.consumer, topic, 'k', 'a')).toBe(false);
      expect(await halts.renewDrain(env.consumer, topic, 'k', 'b')).toBe(true);
      expect(await halts.renewDrain(env.consumer, topic, 'other', 'b')).toBe(false);
      // A renewal changes nothing else.
      expect((await halts.listHalted({ consumer: env.consumer }))[0]).toMatchObject({ resumed: 'retry', head: { error: 'E: broken' } });
      // Halted again: no drainer holds it any more.
      await halts.rehalt(env.consumer, topic, 'k', makeEnvelope({ topic, key: 'k' }), 'E: again', 'b');
      expect(await halts.renewDrain(env.consumer, topic, 'k', 'b')).toBe(false);
    },
  },
  {
    name: 'halts: a run recorded under another name (a replay\'s record) with hold.consumer is held behind that consumer\'s halt',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      await halts.halt(env.consumer, topic, 'k', makeEnvelope({ topic, key: 'k' }), 'E: broken');
      const replay = makeEnvelope({ topic, key: 'k' });
      let ran = 0;
      const held = await env.inbox.run(replay.messageId, `${env.consumer}~rerun`, async () => void (ran += 1), { hold: { topic, key: 'k', envelope: replay, consumer: env.consumer } });
      expect(held).toEqual({ duplicate: false, held: true });
      expect(ran).toBe(0);
      expect((await halts.listHalted({ consumer: env.consumer }))[0]).toMatchObject({ held: 1 });
      expect(await halts.listHalted({ consumer: `${env.consumer}~rerun` })).toEqual([]);
      // Nothing was recorded under either name: the drain runs it later.
      expect(await env.inbox.run(replay.messageId, `${env.consumer}~rerun`, async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
      expect(await env.inbox.run(replay.messageId, env.consumer, async () => 'ran')).toEqual({ duplicate: false, value: 'ran' });
      await halts.resumeHalted(env.consumer, topic, 'k', 'retry');
      await halts.claimResumed(env.consumer, 'a', 60_000);
      expect(await halts.listHeld(env.consumer, topic, 'k', 'a', 10)).toEqual([replay]);
    },
  },
  {
    name: 'halts: replayParked makes a parked head the head of a halt resumed with retry, exactly once (also when two replay it at once); purgeParked deletes one, once',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.replay-parked`;
      const parked = await parkHeads(halts, env.consumer, topic, [
        ['k1', 'E: one'],
        ['k2', 'E: two'],
        ['k3', 'E: three'],
      ]);
      const [first, second, third] = parked as [Envelope, Envelope, Envelope];
      expect(await halts.replayParked(env.consumer, first.messageId)).toBe('resumed');
      expect(await halts.replayParked(env.consumer, first.messageId)).toBe(false);
      expect(await halts.replayParked(`${env.consumer}-other`, second.messageId)).toBe(false);
      expect(await halts.listHalted({ consumer: env.consumer })).toMatchObject([{ topic, key: 'k1', head: { envelope: first, error: 'E: one' }, held: 0, resumed: 'retry' }]);
      // A consumer instance drains it as any resumed halt: the head runs again.
      expect(await halts.claimResumed(env.consumer, 'drainer', 60_000)).toEqual({ consumer: env.consumer, topic, key: 'k1', action: 'retry', head: { envelope: first, error: 'E: one' } });
      expect(await halts.settleHead(env.consumer, topic, 'k1', 'drainer', { parked: false })).toBe(true);
      expect(await halts.lift(env.consumer, topic, 'k1', 'drainer')).toBe(true);

      // Two operators replay the same head at once: one of them does.
      const outcomes = await Promise.all([halts.replayParked(env.consumer, second.messageId), halts.replayParked(env.consumer, second.messageId)]);
      expect(outcomes.filter((outcome) => outcome !== false)).toEqual(['resumed']);
      expect((await halts.listHalted({ consumer: env.consumer })).map((halt) => [halt.key, halt.resumed])).toEqual([['k2', 'retry']]);

      expect(await halts.purgeParked(env.consumer, third.messageId)).toBe(true);
      expect(await halts.purgeParked(env.consumer, third.messageId)).toBe(false);
      expect(await halts.replayParked(env.consumer, third.messageId)).toBe(false);
      expect(await halts.purgeParked(env.consumer, first.messageId)).toBe(false);
      expect(await halts.listParked({ consumer: env.consumer })).toEqual([]);
    },
  },
  {
    name: 'halts: replayParked holds the head behind its key when the key is halted now',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.replay-held`;
      const [head] = (await parkHeads(halts, env.consumer, topic, [['k', 'E: parked']])) as [Envelope];
      const blocker = makeEnvelope({ topic, key: 'k' });
      expect(await halts.halt(env.consumer, topic, 'k', blocker, 'E: halted now')).toBe('halted');
      expect(await halts.replayParked(env.consumer, head.messageId)).toBe('held');
      expect(await halts.listHalted({ consumer: env.consumer })).toMatchObject([{ key: 'k', head: { envelope: blocker }, held: 1, resumed: null }]);
      expect(await halts.listParked({ consumer: env.consumer })).toEqual([]);
      await halts.resumeHalted(env.consumer, topic, 'k', 'retry');
      await halts.claimResumed(env.consumer, 'drainer', 60_000);
      expect(await halts.listHeld(env.consumer, topic, 'k', 'drainer', 10)).toEqual([head]);
    },
  },
  {
    name: 'halts: listParked pages by seq with after: a walk neither skips nor repeats a head when others are replayed or purged between pages; countParked agrees',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.parked-pages`;
      const heads = await parkHeads(halts, env.consumer, topic, [1, 2, 3, 4, 5].map((n) => [`k${n}`, `E: ${n}`] as const));
      const all = await halts.listParked({ consumer: env.consumer });
      expect(all.map((entry) => entry.envelope.messageId)).toEqual(heads.map((head) => head.messageId));
      const seqs = all.map((entry) => entry.seq);
      expect(seqs.every((seq) => typeof seq === 'bigint'), 'listParked gives every head its seq (the cursor)').toBe(true);
      expect([...seqs].sort((a, b) => (a! < b! ? -1 : a! > b! ? 1 : 0))).toEqual(seqs);
      const first = await halts.listParked({ consumer: env.consumer, limit: 2 });
      expect(first.map((entry) => entry.envelope.messageId)).toEqual(heads.slice(0, 2).map((head) => head.messageId));
      // Between pages: one already shown and one not yet shown leave the parked heads.
      expect(await halts.replayParked(env.consumer, heads[0]!.messageId)).toBe('resumed');
      expect(await halts.purgeParked(env.consumer, heads[3]!.messageId)).toBe(true);
      const rest: string[] = [];
      let after = first[first.length - 1]!.seq!;
      for (;;) {
        const page = await halts.listParked({ consumer: env.consumer, limit: 2, after });
        if (page.length === 0) break;
        rest.push(...page.map((entry) => entry.envelope.messageId));
        after = page[page.length - 1]!.seq!;
      }
      expect(rest).toEqual([heads[2]!.messageId, heads[4]!.messageId]);
      // The optional count agrees with the listing, per consumer and in all.
      if (halts.countParked) {
        expect(await halts.countParked({ consumer: env.consumer })).toBe(3);
        expect(await halts.countParked({ consumer: `${env.consumer}-none` })).toBe(0);
        expect(await halts.countParked()).toBeGreaterThanOrEqual(3);
      }
      expect(await halts.listParked({ consumer: env.consumer, after: seqs[4]! })).toEqual([]);
    },
  },
  {
    name: 'halts: a drain settles the head (parked is listed), reads held messages in arrival order, and lifts only when none is held',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      const head = makeEnvelope({ topic, key: 'k' });
      await halts.halt(env.consumer, topic, 'k', head, 'E: broken');
      const held = [1, 2, 3].map(() => makeEnvelope({ topic, key: 'k' }));
      for (const envelope of held) await env.inbox.run(envelope.messageId, env.consumer, async () => undefined, { hold: { topic, key: 'k', envelope } });
      await halts.resumeHalted(env.consumer, topic, 'k', 'park');
      expect(await halts.claimResumed(env.consumer, 'a', 60_000)).toMatchObject({ action: 'park' });
      expect(await halts.lift(env.consumer, topic, 'k', 'a')).toBe(false);
      expect(await halts.settleHead(env.consumer, topic, 'k', 'a', { parked: true })).toBe(true);
      const parked = await halts.listParked({ consumer: env.consumer });
      expect(parked.map((entry) => [entry.envelope, entry.error])).toEqual([[head, 'E: broken']]);
      expect((await halts.listHalted({ consumer: env.consumer }))[0]).toMatchObject({ head: null, held: 3, resumed: 'park' });
      expect(await halts.listHeld(env.consumer, topic, 'k', 'a', 2)).toEqual(held.slice(0, 2));
      expect(await halts.listHeld(env.consumer, topic, 'k', 'other-owner', 10)).toEqual([]);
      expect(await halts.drop(env.consumer, topic, 'k', held[0]!.messageId, 'a')).toBe(true);
      expect(await halts.lift(env.consumer, topic, 'k', 'a')).toBe(false);
      expect(await halts.drop(env.consumer, topic, 'k', held[1]!.messageId, 'a')).toBe(true);
      expect(await halts.drop(env.consumer, topic, 'k', held[2]!.messageId, 'a')).toBe(true);
      expect(await halts.listHeld(env.consumer, topic, 'k', 'a', 10)).toEqual([]);
      expect(await halts.lift(env.consumer, topic, 'k', 'a')).toBe(true);
      expect(await halts.listHalted({ consumer: env.consumer })).toEqual([]);
      const after = makeEnvelope({ topic, key: 'k' });
      expect(await env.inbox.run(after.messageId, env.consumer, async () => 'ran', { hold: { topic, key: 'k', envelope: after } })).toEqual({ duplicate: false, value: 'ran' });
    },
  },
  {
    name: 'halts: rehalt makes a held message the head again, halted and not claimable until resumed',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      const head = makeEnvelope({ topic, key: 'k' });
      await halts.halt(env.consumer, topic, 'k', head, 'E: broken');
      const held = [1, 2].map(() => makeEnvelope({ topic, key: 'k' }));
      for (const envelope of held) await env.inbox.run(envelope.messageId, env.consumer, async () => undefined, { hold: { topic, key: 'k', envelope } });
      await halts.resumeHalted(env.consumer, topic, 'k', 'retry');
      await halts.claimResumed(env.consumer, 'a', 60_000);
      await halts.settleHead(env.consumer, topic, 'k', 'a', { parked: false });
      expect(await halts.rehalt(env.consumer, topic, 'k', held[0]!, 'E: second', 'a')).toBe(true);
      const [halt] = await halts.listHalted({ consumer: env.consumer });
      expect(halt).toMatchObject({ held: 1, resumed: null, head: { error: 'E: second' } });
      expect(halt!.head!.envelope).toEqual(held[0]);
      expect(await halts.claimResumed(env.consumer, 'a', 60_000)).toBeUndefined();
      expect(await halts.resumeHalted(env.consumer, topic, 'k', 'retry')).toBe(1);
      expect(await halts.claimResumed(env.consumer, 'b', 60_000)).toMatchObject({ action: 'retry' });
      expect(await halts.listParked({ consumer: env.consumer })).toEqual([]);
    },
  },
  {
    name: 'halts: a hold racing the lift is never stranded — either the halt stays with the message held, or the message runs',
    async run(env) {
      const halts = haltsOf(env);
      const topic = `${env.testId}.halt`;
      for (let round = 0; round < 10; round += 1) {
        const key = `k${round}`;
        await halts.halt(env.consumer, topic, key, makeEnvelope({ topic, key }), 'E: broken');
        await halts.resumeHalted(env.consumer, topic, key, 'retry');
        await halts.claimResumed(env.consumer, 'a', 60_000);
        await halts.settleHead(env.consumer, topic, key, 'a', { parked: false });
        const envelope = makeEnvelope({ topic, key });
        const [lifted, result] = await Promise.all([
          halts.lift(env.consumer, topic, key, 'a'),
          env.inbox.run(envelope.messageId, env.consumer, async () => 'ran', { hold: { topic, key, envelope } }),
        ]);
        const remaining = (await halts.listHalted({ consumer: env.consumer })).filter((halt) => halt.key === key);
        if ('held' in result) {
          expect(lifted).toBe(false);
          expect(remaining).toMatchObject([{ held: 1 }]);
        } else {
          expect(result).toEqual({ duplicate: false, value: 'ran' });
          if (!lifted) expect(remaining).toMatchObject([{ held: 0 }]);
          else expect(remaining).toEqual([]);
        }
      }
    },
  },
];

/** The store's optional `stats()`, or a skip stating why. */
function statsOf<Tx>(env: InboxCaseEnv<Tx>): () => Promise<InboxStats> {
  const { inbox } = env;
  if (typeof inbox.stats !== 'function') return env.skip('the inbox store has no stats(): it is an optional operator member (courier stats and observeInbox use it)');
  return () => inbox.stats!();
}

/** The store's halts, or a skip stating why the halt cases do not apply. */
/** Halts each (key, error) of `topic` with a new head, resumes it with `park` and drains it as a consumer would: the heads end up parked, in order. */
async function parkHeads(halts: InboxHalts, consumer: string, topic: string, heads: readonly (readonly [string, string])[]): Promise<Envelope[]> {
  const parked: Envelope[] = [];
  for (const [key, error] of heads) {
    const head = makeEnvelope({ topic, key });
    await halts.halt(consumer, topic, key, head, error);
    await halts.resumeHalted(consumer, topic, key, 'park');
    expect(await halts.claimResumed(consumer, 'parker', 60_000)).toMatchObject({ key, action: 'park' });
    expect(await halts.settleHead(consumer, topic, key, 'parker', { parked: true })).toBe(true);
    expect(await halts.lift(consumer, topic, key, 'parker')).toBe(true);
    parked.push(head);
  }
  return parked;
}

function haltsOf<Tx>(env: InboxCaseEnv<Tx>): InboxHalts {
  if (!hasInboxHalts(env.inbox)) {
    return env.skip("the inbox store has no halts (InboxHalts): they are optional, and only ordered subscriptions with poison 'halt' need them");
  }
  return env.inbox;
}
