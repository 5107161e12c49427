// The FIFO twin of bus-process-fixture.ts.
import type { FixtureContext } from '@courier/conformance';
import { createPostgresFixture } from '../../../mikro-orm/test/support/fixture.js';
import { createSqsFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([createPostgresFixture(context), createSqsFixture(context, { fifo: true })]);
  return { store, transport };
}
