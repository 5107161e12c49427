// The process fixture module of the bus suite's SIGKILL scenarios on Prisma: the store is a
// PostgreSQL database reached through a Prisma Client (@prisma/adapter-pg) that outlives every
// worker (each worker opens its own client on the same tables); the transport an in-memory
// broker that lives in the test process and reaches workers over their IPC channel.
import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createPrismaFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const store = await createPrismaFixture('postgresql', context);
  const transport = await createIpcBrokerTransportFixture();
  return { store, transport };
}
