import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createServiceBusFixture } from './support/fixture.js';
import { cleanupNamespace, onRealNamespace } from './support/namespace.js';
import { standIn } from './support/standin-server.js';

// Started before any worker exists, so every SIGKILLed worker inherits its port. (On a real
// namespace the workers inherit COURIER_ASB_CONNECTION_STRING instead.)
if (!onRealNamespace) await standIn();
afterAll(cleanupNamespace);

describeBus('azure-service-bus', { store: createPostgresFixture, transport: createServiceBusFixture }, {
  inProcess: 'throw',
  // Workers run the workspace packages from source, like vitest does.
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
