// The process fixture module of the PostgreSQL + Kafka SIGKILL scenarios: the database and
// the broker both outlive the worker processes, so what a killed worker leaves behind
// (uncommitted offsets, outbox rows in flight) is real.
import type { FixtureContext } from '@courier/conformance';
import { kafkaTransport, postgresStore } from './fixtures.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([postgresStore(context), kafkaTransport(context)]);
  return { store, transport };
}
