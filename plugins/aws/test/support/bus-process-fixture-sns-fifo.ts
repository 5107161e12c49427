// The FIFO twin of bus-process-fixture-sns.ts: FIFO SNS topics delivering into FIFO SQS queues.
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createSnsSqsFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createSnsSqsFixture(context, { fifo: true })]);
  return { store, transport };
}
