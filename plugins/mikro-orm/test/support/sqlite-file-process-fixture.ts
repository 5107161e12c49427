// The process fixture module a transport author writes for the bus suite's SIGKILL
// scenarios, here with the in-memory broker served over IPC as the transport: the store is
// the published SQLite-file fixture, imported exactly as a third party imports it.
import { createIpcBrokerTransportFixture, type FixtureContext } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';

export async function createFixture(context: FixtureContext) {
  return { store: await createSqliteStoreFixture(context), transport: await createIpcBrokerTransportFixture() };
}
