// Imported by the parent test and every SIGKILLed worker: same testId, same Redis keys and SQLite file.
import type { FixtureContext } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';
import { createRedisStreamsFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  return { store: await createSqliteStoreFixture(context), transport: await createRedisStreamsFixture(context) };
}
