// The process fixture module of the bus suite's SIGKILL scenarios: each worker process opens
// the same SQLite file with better-sqlite3 (its own connection, as a second service process
// would), with the in-memory broker served over IPC as the transport.
import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createBetterSqlite3Fixture } from './fixture.js';

export async function createFixture(context: FixtureContext) {
  return { store: await createBetterSqlite3Fixture(context), transport: await createIpcBrokerTransportFixture() };
}
