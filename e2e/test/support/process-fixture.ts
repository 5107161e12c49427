// The process fixture module of the SIGKILL scenarios: PostgreSQL and RabbitMQ both
// outlive the worker processes, so what a killed worker leaves behind is real.
import type { FixtureContext } from '@courier/conformance';
import { postgresStore, rabbitMqTransport } from './fixtures.js';

export async function createFixture(context: FixtureContext) {
  const [store, transport] = await Promise.all([postgresStore(context), rabbitMqTransport(context)]);
  return { store, transport };
}
