// Imported by the parent test and every SIGKILLed worker: same testId, so the same
// PostgreSQL tables, SNS topics and SQS queues; workers reach the parent's SNS stand-in
// through COURIER_SNS_STANDIN_PORT (set by the parent before it starts them).
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createSnsSqsFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createSnsSqsFixture(context)]);
  return { store, transport };
}
