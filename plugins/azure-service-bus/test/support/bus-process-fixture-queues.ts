// bus-process-fixture.ts in queue mode (session-enabled queues), for bus-queues.test.ts:
// imported by the parent test and every SIGKILLed worker, so all of them map the test's
// topic onto the same queue.
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createServiceBusFixtureIn } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createServiceBusFixtureIn({ entities: 'queues', sessions: true }, context)]);
  return { store, transport };
}
