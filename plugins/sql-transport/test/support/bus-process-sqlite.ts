// Imported by the parent test and every SIGKILLed worker: same testId, same tables.
import type { FixtureContext } from '@courier/conformance';
import { createSqlTransportFixture } from './fixture.js';
import { createStoreFixture } from './store-fixture.js';

export async function createFixture(context: FixtureContext) {
  return { store: await createStoreFixture('sqlite')(context), transport: await createSqlTransportFixture('sqlite')(context) };
}
