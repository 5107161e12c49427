// Errors of the SQL transport reach logs and the relay's `lastError` on `/health`: they name
// the operation and the driver's message, never the statement with its bound values (message
// bodies). Issue 29, "also noticed": the message was `<INSERT … with the body inlined> - …`.
import { makeEnvelope, uniqueId } from '@courier/conformance';
import { CourierError, describeError } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { SqlTransport } from '../src/index.js';
import { openOrm } from './support/fixture.js';

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

describe.each(['postgresql', 'mariadb'] as const)('sql transport error text on %s', (dialect) => {
  it('a failed publish names the operation and the driver message, not the statement or the body', async () => {
    const testId = uniqueId();
    const orm = await openOrm(dialect, testId);
    closers.push(() => orm.close(true));
    const transport = new SqlTransport({ orm, tablePrefix: `${testId}_` });
    closers.push(() => transport.close());
    await transport.ensureSchema();
    // A group for the topic, so that publish inserts a row (with the body) — into a table
    // that is gone.
    const subscription = await transport.subscribe({ consumer: 'reader', topics: ['orders'], ordered: false, concurrency: 1 }, (delivery) => delivery.ack());
    await subscription.close();
    await orm.em.getConnection().execute(`DROP TABLE ${testId}_queue`);
    const envelope = makeEnvelope({ topic: 'orders', payload: JSON.stringify({ card: 'secret-body-4111' }) });
    const failure = await transport.publish([envelope]).then(
      (results) => (results[0]?.ok === false ? results[0].error : undefined),
      (error: unknown) => error,
    );
    expect(failure, 'the publish failed').toBeInstanceOf(CourierError);
    const text = describeError(failure);
    expect(text).toContain("'publish' failed");
    expect(text, 'no bound value').not.toContain('secret-body');
    expect(text, 'no statement').not.toMatch(/INSERT INTO/i);
    expect(String(((failure as Error).cause as Error).message), 'the statement stays in the cause').toMatch(/INSERT INTO/i);
  });
});
