// The process fixture module of the bus suite's SIGKILL scenarios: the store is a
// MikroORM database that outlives every worker (dialect from COURIER_STORE_DIALECT), the
// transport an in-memory broker that lives in the test process and reaches workers over
// their IPC channel, so it outlives them too.
import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createFixture as createStoreFixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const store = await createStoreFixture(context);
  const transport = await createIpcBrokerTransportFixture();
  return { store, transport };
}
