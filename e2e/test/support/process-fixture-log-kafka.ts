// The process fixture module of the log-tail PostgreSQL + Kafka SIGKILL scenarios: each
// worker's relay tails the test's slot (one reads it, the others wait to take it over).
import type { FixtureContext } from '@courier/conformance';
import { kafkaTransport } from './fixtures.js';
import { logTailStore } from './log-tail-fixtures.js';

/** The slot prefix of bus-log-tail-kafka.test.ts. */
export const SLOT_PREFIX = 'ltbk_';

/** A worker (the kit starts it with `COURIER_CONFORMANCE_WORKER` set) reads the slot at once; the parent, which only commits and checks, never does. */
export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([logTailStore(context, SLOT_PREFIX, { readAtOnce: process.env['COURIER_CONFORMANCE_WORKER'] !== undefined }), kafkaTransport(context)]);
  return { store, transport };
}
