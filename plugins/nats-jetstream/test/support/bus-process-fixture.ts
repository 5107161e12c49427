// Imported by the parent test and every SIGKILLed worker: same testId, same streams and SQLite file.
import type { FixtureContext } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';
import { createJetStreamFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  return { store: await createSqliteStoreFixture(context), transport: await createJetStreamFixture(context) };
}
