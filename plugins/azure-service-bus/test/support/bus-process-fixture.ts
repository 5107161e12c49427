// Imported by the parent test and every SIGKILLed worker: same testId, so the same
// PostgreSQL tables and Service Bus entities (the parent's stand-in, reached through
// COURIER_ASB_STANDIN_PORT).
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createServiceBusFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createServiceBusFixture(context)]);
  return { store, transport };
}
