// The process fixture module of the bus suite's SIGKILL scenarios on mysql2: the store is
// the MariaDB database (tables `<testId>_…`, so a worker reopens those of the scenario that
// started it), which outlives every worker; the transport an in-memory broker that lives in
// the test process and reaches workers over their IPC channel, so it outlives them too.
import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createMysql2Fixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  const store = await createMysql2Fixture(context);
  const transport = await createIpcBrokerTransportFixture();
  return { store, transport };
}
