// The bus suite in queue mode (`entities: 'queues'`, session-enabled queues: the suite's
// consumer is ordered): MikroORM PostgreSQL store, every fault point in-process and as
// SIGKILLed workers, as bus.test.ts runs topic mode.
import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createServiceBusFixtureIn } from './support/fixture.js';
import { cleanupNamespace, onRealNamespace } from './support/namespace.js';
import { standIn } from './support/standin-server.js';

// Started before any worker exists, so every SIGKILLed worker inherits its port.
if (!onRealNamespace) await standIn();
afterAll(cleanupNamespace);

describeBus('azure-service-bus queues', { store: createPostgresFixture, transport: (context) => createServiceBusFixtureIn({ entities: 'queues', sessions: true }, context) }, {
  inProcess: 'throw',
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture-queues.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
