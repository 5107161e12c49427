import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';
import { createJetStreamFixture } from './support/fixture.js';

describeBus('jetstream', { store: createSqliteStoreFixture, transport: createJetStreamFixture }, {
  inProcess: 'throw',
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)) },
});
