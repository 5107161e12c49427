// A handler that still holds its message when the lease runs out (a stalled process, renewals
// that did not reach the database) and settles afterwards, once another instance of the group
// has claimed the row: the late settle must change nothing of that instance's claim — an ack
// must not delete the row the other instance is handling (issue 29, a blind spot of the suite).
import type { Delivery } from '@courier/core';
import { deferred, eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterEach, describe, expect, it } from 'vitest';
import type { MikroORM } from '@mikro-orm/core';
import { SqlTransport, type SqlTransportConfig } from '../src/index.js';
import { createSqlTransportFixture, FIXTURE_LEASE_MS, openOrm, sharedSqliteOrm } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/**
 * The ORM as an instance whose lease renewals stop reaching the database (a stalled process,
 * a renewal lost on the way) sees it: every renewal statement rejects, everything else runs.
 */
function withoutRenewals(orm: MikroORM): SqlTransportConfig['orm'] {
  const connection = orm.em.getConnection('write');
  const view = new Proxy(connection, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (property !== 'execute') return typeof value === 'function' ? value.bind(target) : value;
      return (...args: unknown[]) => {
        // The renewal is the one statement that pushes leases of several owners forward.
        if (typeof args[0] === 'string' && /SET available_at = .* lease_owner IN \(/s.test(args[0])) return Promise.reject(new Error('the renewal did not reach the database'));
        return (value as (...rest: unknown[]) => Promise<unknown>).apply(target, args);
      };
    },
  });
  const em = new Proxy(orm.em, {
    get(target, property, receiver) {
      if (property === 'getConnection') return () => view;
      const value: unknown = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { em };
}

describe.each(['postgresql', 'mariadb', 'sqlite'] as const)('sql transport on %s: a settle after the lease ran out', (dialect) => {
  it.each(['ack', 'retry', 'deadLetter'] as const)(
    "a late %s by the first holder leaves the row another instance claimed meanwhile untouched; that instance's ack completes it",
    async (late) => {
      const testId = uniqueId();
      const fixture = await createSqlTransportFixture(dialect)({ testId });
      closers.push(() => fixture.close());
      const sql = dialect === 'sqlite' ? await sharedSqliteOrm(testId) : { orm: await openOrm(dialect, testId), release: async () => undefined };
      closers.push(async () => {
        await sql.release();
        if (dialect !== 'sqlite') await sql.orm.close(true);
      });
      const count = async (messageId: string): Promise<number> => {
        const rows = (await sql.orm.em
          .getConnection('write')
          .execute(`SELECT COUNT(*) AS n FROM ${dialect === 'mariadb' ? `\`${testId}_queue\`` : `"${testId}_queue"`} WHERE message_id = ? AND state = 'pending'`, [messageId], 'all')) as { n: unknown }[];
        return Number(rows[0]!.n);
      };
      const topic = 'orders.placed';
      const consumer = 'late-settle';
      // The first instance's renewals never reach the database, so its lease runs out while
      // its handler holds the message; the second instance then claims the row.
      const first = new SqlTransport({ orm: withoutRenewals(sql.orm), tablePrefix: `${testId}_`, leaseMs: FIXTURE_LEASE_MS, pollIntervalMs: 100 });
      closers.push(() => first.close());
      const second = await fixture.connect();
      let firstHeld: Delivery | undefined;
      let secondHeld: Delivery | undefined;
      // One slot each, and the first handler does not return until the end: the first instance,
      // holding the message, claims nothing more (a handler that returned would free its slot,
      // and the first instance could re-claim the row itself once its lease ran out).
      const releaseFirst = deferred<void>();
      closers.push(async () => releaseFirst.resolve());
      await first.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async (delivery) => {
        firstHeld ??= delivery;
        await releaseFirst.promise;
      });
      const message = makeEnvelope({ topic, key: null });
      expect((await fixture.transport.publish([message]))[0]?.ok).toBe(true);
      await eventually(() => expect(firstHeld?.envelope.messageId, 'the first instance holds the message').toBe(message.messageId), { timeoutMs: 20_000 });
      await second.subscribe({ consumer, topics: [topic], ordered: false, concurrency: 1 }, async (delivery) => {
        secondHeld ??= delivery;
      });
      await eventually(() => expect(secondHeld?.envelope.messageId, 'the second instance claims the row once the lease ran out').toBe(message.messageId), {
        timeoutMs: 20_000,
      });
      expect(secondHeld!.redelivered).toBe(true);

      // The first holder settles late: nothing of the second instance's claim changes.
      if (late === 'ack') await firstHeld!.ack();
      else if (late === 'retry') await firstHeld!.retry(0, { code: 'LATE', message: 'late retry' });
      else await firstHeld!.deadLetter({ code: 'LATE', message: 'late dead letter' });
      expect(await count(message.messageId), `the row the second instance holds after a late ${late}`).toBe(1);
      if (late === 'deadLetter') expect(await first.deadLetters!.list(consumer)).toEqual([]);

      releaseFirst.resolve();
      await secondHeld!.ack();
      await eventually(async () => expect(await count(message.messageId)).toBe(0), { timeoutMs: 10_000 });
    },
    60_000,
  );
});
