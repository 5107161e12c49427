import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createPostgresFixture } from '../../mikro-orm/test/support/fixture.js';
import { createServiceBusFixture } from './support/fixture.js';
import { standIn } from './support/standin-server.js';

// Started before any worker exists, so every SIGKILLed worker inherits its port.
await standIn();

describeBus('azure-service-bus', { store: createPostgresFixture, transport: createServiceBusFixture }, {
  inProcess: 'throw',
  // Workers run the workspace packages from source, like vitest does.
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
