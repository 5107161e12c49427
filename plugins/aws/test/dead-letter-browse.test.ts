// What `deadLetters.list` promises on SQS, which has no peek (issue 35): it receives with
// visibility 0, so a read never hides a dead letter from another reader or consumer, and it
// never takes one; but a server may keep returning the same first messages to such receives
// (ElasticMQ does), so a listing may show only some of the queue. `count` gives the depth the
// broker keeps without receiving, which is how the CLI says "read N of M"; replaying or
// purging what was shown brings the rest into view, so nothing stays out of reach.
import { GetQueueAttributesCommand, GetQueueUrlCommand } from '@aws-sdk/client-sqs';
import { eventually, makeEnvelope, uniqueId } from '@courier/conformance';
import { afterAll, describe, expect, it } from 'vitest';
import { SqsTransport } from '../src/index.js';
import { TEST_CONFIG, assertSqsAnswers, deleteTestQueues, sqsClient } from './support/fixture.js';

const client = sqsClient();
const id = uniqueId();
afterAll(async () => {
  await deleteTestQueues(id);
  client.destroy();
});

const DEAD = 25;

// FIFO: receives with visibility 0 return only the first messages of the queue's groups, so a
// listing sees 10 of 25 on ElasticMQ; a standard queue was seen in full here (but sampled on AWS).
describe.each([false, true])('SQS dead letters: browsing without hiding (fifo: %s)', (fifo) => {
  it('list hides and takes nothing, shows at most what the broker counts, and purging what it shows reaches every dead letter', { timeout: 180_000 }, async () => {
    await assertSqsAnswers();
    const transport = new SqsTransport({ client, prefix: `${id}-${fifo ? 'f' : 's'}-`, ...TEST_CONFIG, fifo });
    const envelopes = Array.from({ length: DEAD }, (_, index) => makeEnvelope({ topic: 'orders', key: fifo ? `k${index % 5}` : null }));
    const subscription = await transport.subscribe({ consumer: 'billing', topics: ['orders'], ordered: false, concurrency: 4 }, async (delivery) => {
      await delivery.deadLetter({ code: 'HANDLER_FAILED', message: `refused ${delivery.envelope.messageId}` });
    });
    for (const result of await transport.publish(envelopes)) expect(result.ok).toBe(true);
    await eventually(async () => expect(await transport.deadLetters.count!('billing')).toBe(DEAD), { timeoutMs: 60_000 });
    await subscription.close();

    const dlq = (await client.send(new GetQueueUrlCommand({ QueueName: `${id}-${fifo ? 'f' : 's'}-billing-dlq${fifo ? '.fifo' : ''}` }))).QueueUrl!;
    const inFlight = async () => Number((await client.send(new GetQueueAttributesCommand({ QueueUrl: dlq, AttributeNames: ['ApproximateNumberOfMessagesNotVisible'] }))).Attributes!['ApproximateNumberOfMessagesNotVisible']);

    // Three readers at once: each sees dead letters, none hides any from the others.
    const lists = await Promise.all([1, 2, 3].map(() => transport.deadLetters.list('billing', { limit: 1_000 })));
    const known = new Set(envelopes.map((envelope) => envelope.messageId));
    for (const list of lists) {
      expect(list.length).toBeGreaterThan(0);
      expect(list.length).toBeLessThanOrEqual(DEAD);
      expect(new Set(list.map((letter) => letter.id)).size).toBe(list.length);
      for (const letter of list) {
        expect(known.has(letter.envelope.messageId)).toBe(true);
        expect(letter.reason).toEqual({ code: 'HANDLER_FAILED', message: `refused ${letter.envelope.messageId}` });
      }
      // Oldest first, as the port promises.
      const times = list.map((letter) => letter.deadAt.getTime());
      expect([...times].sort((a, b) => a - b)).toEqual(times);
    }
    console.log(`[browse] lists saw ${lists.map((list) => list.length).join(", ")} of ${DEAD}`);
    console.log(`[sqs dead letters] fifo ${fifo}: three concurrent lists saw ${lists.map((list) => list.length).join(', ')} of ${DEAD}`);
    expect(await inFlight()).toBe(0);
    expect(await transport.deadLetters.count!('billing')).toBe(DEAD);

    // Walk the queue the honest way: purge what a listing shows, list again. Every dead letter
    // comes into view and none is purged twice; the count falls to 0.
    const purged = new Set<string>();
    for (let round = 0; round < DEAD + 5 && purged.size < DEAD; round += 1) {
      const shown = await transport.deadLetters.list('billing', { limit: 1_000 });
      expect(shown.length, `round ${round}: ${purged.size} of ${DEAD} purged, nothing shown`).toBeGreaterThan(0);
      for (const letter of shown) expect(purged.has(letter.envelope.messageId), 'a purged dead letter was listed again').toBe(false);
      expect(await transport.deadLetters.purge('billing', shown.map((letter) => letter.id))).toBe(shown.length);
      for (const letter of shown) purged.add(letter.envelope.messageId);
      console.log(`[browse] round ${round}: ${shown.length} shown, ${purged.size} purged`);
    }
    expect(purged).toEqual(known);
    await eventually(async () => expect(await transport.deadLetters.count!('billing')).toBe(0), { timeoutMs: 30_000 });
    expect(await transport.deadLetters.list('billing')).toEqual([]);
    await transport.close();
  });
});
