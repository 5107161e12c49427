// Operator reads of dead letters (`courier dead list`, `stats`, `/metrics` go through them):
// they create nothing, and a consumer name no Kafka topic can hold is bad input, not an
// unreachable broker.
import { uniqueId } from '@courier/conformance';
import { ConfigError, CourierError } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { createKafkaFixture, deleteTestObjects, plainClient } from './support/fixture.js';
import type { TransportFixture } from '@courier/conformance';

let fixture: TransportFixture | undefined;
let testId = '';
afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
  await deleteTestObjects(testId);
});

describe('KafkaTransport dead-letter reads', () => {
  it("lists, replays and purges nothing for a consumer that never subscribed, and creates no topic for it", async () => {
    testId = uniqueId();
    fixture = await createKafkaFixture({ testId });
    const deadLetters = fixture.transport.deadLetters!;
    expect(await deadLetters.list('no-such-consumer')).toEqual([]);
    expect(await deadLetters.replay('no-such-consumer', ['x:0:0'])).toBe(0);
    expect(await deadLetters.purge('no-such-consumer', ['x:0:0'])).toBe(0);
    const admin = plainClient(`${testId}-topics`).admin();
    await admin.connect();
    try {
      expect((await admin.listTopics()).filter((topic) => topic.startsWith(`${testId}.`))).toEqual([]);
    } finally {
      await admin.disconnect();
    }
  });

  it('refuses a consumer name no Kafka topic can hold with a ConfigError that is not retriable', async () => {
    testId = uniqueId();
    fixture = await createKafkaFixture({ testId });
    const deadLetters = fixture.transport.deadLetters!;
    for (const name of ['orders workers', 'a/b', '', 'x'.repeat(300)]) {
      const error: unknown = await deadLetters.list(name).then(() => undefined, (failure: unknown) => failure);
      expect(error, `list('${name.slice(0, 20)}')`).toBeInstanceOf(ConfigError);
      expect((error as CourierError).retriable).toBe(false);
    }
  });
});
