// Imported by the parent test and every SIGKILLed worker: same testId, so the same
// PostgreSQL tables and SQS queues (ElasticMQ, reached through COURIER_SQS_ENDPOINT).
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createSqsFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createSqsFixture(context)]);
  return { store, transport };
}
